"""What a cluster file may leave out: a link's latency and a device's attention half-efficiency block. Left out, they
are the figures the GPU presets state for themselves (an NVSwitch link answers in 2 us; a GPU's attention reaches
half its efficiency at 256-token blocks), so a file written from a preset without them prices the same."""
from __future__ import annotations

import pytest

from sp_plan.planner import Candidate, Estimator, Workload
from sp_plan.planner.cluster import Cluster, Device, Link
from sp_plan.profiles import load_cluster, load_model

GPU_PRESETS = ["dgx-h100", "dgx-a100", "a800-8-nvlink", "h800-8-nvlink", "a100-16-eth100"]


@pytest.mark.parametrize("preset", GPU_PRESETS)
def test_a_link_without_latency_answers_as_the_presets_nvswitch_link(preset):
    (node,) = load_cluster(preset).node_types.values()
    link = next(l for l in node.links if l.kind == "nvswitch")
    assert Link(**link.model_dump(exclude={"latency"})) == link


@pytest.mark.parametrize("preset", GPU_PRESETS)
def test_a_device_without_attn_half_block_is_the_presets_device(preset):
    (node,) = load_cluster(preset).node_types.values()
    device = node.devices[0]
    assert Device(**device.model_dump(exclude={"attn_half_block"})) == device


def test_a_file_without_nvswitch_latencies_or_half_blocks_prices_as_the_preset():
    preset = load_cluster("dgx-h100")
    data = preset.model_dump(mode="json")
    for node in data["node_types"].values():
        for link in node["links"]:
            if link["kind"] == "nvswitch":
                del link["latency"]
        for device in node["devices"]:
            del device["attn_half_block"]
    cand = Candidate("usp", ulysses=8, order=("ulysses",))
    model, work = load_model("llama3-8b"), Workload(seq_len="32k")
    same = Estimator(Cluster.model_validate(data), model, work).predict(cand).step_time_s
    assert same == Estimator(preset, model, work).predict(cand).step_time_s
