"""Fuzzing the cluster boundary: cluster files (full and preset-style), generated and damaged."""
from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from fuzzing import budget, dump, mutated, outcome, text_mutated, write
from sp_plan.planner.cluster import SCHEMA_VERSION, Cluster
from sp_plan.planner.errors import PlanError
from sp_plan.planner.model import Workload
from sp_plan.planner.search import grid_search
from sp_plan.profiles import load_cluster, load_model

NAMES = st.one_of(st.sampled_from(["h100", "A10-24GB", "ascend", "名前-ü", "x y"]),
                  st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=10))
CAP = st.floats(1e8, 1e12)
LAT = st.floats(0, 1e-4)


def partition(n: int) -> st.SearchStrategy[list[list[int]]]:
    """0..n-1 cut into consecutive non-empty groups."""
    return st.lists(st.booleans(), min_size=max(0, n - 1), max_size=max(0, n - 1)).map(
        lambda cuts: [list(g) for g in _split(list(range(n)), cuts)])


def _split(items: list[int], cuts: list[bool]) -> list[list[int]]:
    out, cur = [], [items[0]]
    for x, cut in zip(items[1:], cuts):
        if cut:
            out.append(cur)
            cur = []
        cur.append(x)
    return out + [cur]


@st.composite
def node_specs(draw, multi_node: bool = False) -> dict:
    """A preset-style node description (profiles/clusters/*.yaml) that must build a valid node."""
    n = draw(st.integers(1, 8))
    peak = draw(st.floats(1e10, 2e15))
    device = dict(model=draw(NAMES), kind=draw(st.sampled_from(["gpu", "npu", "cpu"])),
                  memory_bytes=draw(st.floats(2e9, 2e11)), peak_flops={"bf16": peak, "fp16": peak, "fp32": peak / 8},
                  matmul_efficiency=draw(st.floats(0.05, 1)), attn_efficiency=draw(st.floats(0.05, 1)),
                  attn_half_block=draw(st.floats(0, 4096)))
    spec: dict = {"name": draw(NAMES), "devices_per_node": n, "device": device}
    intra = draw(st.sampled_from(["nvswitch", "nvlink", "hccs", "shm", "pcie"]))
    if intra != "pcie":
        spec["intra"] = {"kind": intra, "capacity": draw(CAP), "latency": draw(LAT)}
    else:
        spec["intra"] = {"kind": "pcie"}
    if intra == "pcie" or draw(st.booleans()):
        groups = draw(partition(n))
        spec["pcie"] = {"capacity": draw(CAP), "latency": draw(LAT), "switches": groups,
                        "sockets": draw(partition(len(groups))), "smp_capacity": draw(CAP), "tree": draw(st.booleans())}
    if multi_node or draw(st.booleans()):
        attach = draw(st.sampled_from(["per_gpu"] + (["host"] if "pcie" in spec or intra == "shm" else [])
                                      + (["per_switch"] if "pcie" in spec else [])))
        spec["nics"] = {"attach": attach, "rate": draw(CAP), "network": draw(st.sampled_from(["ib", "roce", "ethernet"])),
                        "latency": draw(LAT), "count": draw(st.integers(1, 4))}
    return spec


@st.composite
def clusters(draw) -> Cluster:
    nodes = draw(st.integers(1, 3))
    spec = draw(node_specs(multi_node=nodes > 1))
    with tempfile.TemporaryDirectory() as d:
        return load_cluster(str(write(Path(d), "spec.yaml", dump(spec, ".yaml"))), nodes)


SUFFIX = st.sampled_from([".yaml", ".json"])
TINY = load_model("tiny-gpt")


@budget(0.5)
@given(clusters(), SUFFIX)
def test_valid_cluster_round_trips_and_plans(c, suffix):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"cluster{suffix}"
        c.save(path)
        back = Cluster.load(path)
        assert back == c and back.fingerprint() == c.fingerprint()
        back.save(path)
        assert Cluster.load(path) == c
    res = grid_search(back, TINY, Workload(seq_len=1024, batch=back.world_size), keep=1)
    assert res.ranked, "a valid cluster must plan (pure data parallel always fits tiny-gpt here)"


@st.composite
def cluster_docs(draw) -> dict:
    return draw(clusters()).model_dump(mode="json")


@given(cluster_docs().flatmap(mutated), SUFFIX)
def test_mutated_cluster_file_is_a_plan_error_or_loads(doc, suffix):
    with tempfile.TemporaryDirectory() as d:
        path = write(Path(d), f"c{suffix}", dump(doc, suffix))
        got = outcome(lambda: load_cluster(str(path)))
        if isinstance(got, Cluster):  # the mutation kept it valid: it round-trips
            got.save(path)
            assert Cluster.load(path) == got


@given(node_specs().flatmap(mutated), st.integers(1, 3))
def test_mutated_preset_spec_is_a_plan_error_or_loads(spec, nodes):
    with tempfile.TemporaryDirectory() as d:
        path = write(Path(d), "spec.yaml", dump(spec, ".yaml"))
        got = outcome(lambda: load_cluster(str(path), nodes))
        assert isinstance(got, (Cluster, PlanError))


@given(cluster_docs().map(lambda doc: dump(doc, ".yaml")).flatmap(text_mutated), SUFFIX)
def test_damaged_cluster_file_is_a_plan_error_or_loads(data, suffix):
    with tempfile.TemporaryDirectory() as d:
        got = outcome(lambda: Cluster.load(write(Path(d), f"c{suffix}", data)))
        assert isinstance(got, (Cluster, PlanError))


@given(cluster_docs(), st.one_of(st.integers(SCHEMA_VERSION + 1, 10**6), st.integers(-5, 0)))
def test_other_schema_versions_are_refused_naming_both(doc, version):
    doc["schema_version"] = version
    with tempfile.TemporaryDirectory() as d:
        e = outcome(lambda: Cluster.load(write(Path(d), "c.yaml", dump(doc, ".yaml"))))
    assert isinstance(e, PlanError) and e.field == "cluster.schema_version"
    assert str(version) in e.problem and str(SCHEMA_VERSION) in e.problem


@given(cluster_docs(), st.sampled_from(["busbw", "alpha_s", "peak_busbw"]),
       st.one_of(st.sampled_from([float("nan"), float("inf"), -float("inf")]), st.floats(-1e12, -1e-12)))
def test_impossible_link_calibration_is_refused(doc, key, bad):
    doc["calibration"] = {"links": {"classes": {"intra": {"pair": [0, 1], "ops": {"p2p": {"group_size": 2, key: bad}}}}}}
    with tempfile.TemporaryDirectory() as d:
        e = outcome(lambda: Cluster.load(write(Path(d), "c.json", dump(doc, ".json"))))
    assert isinstance(e, PlanError) and e.field.startswith("cluster.calibration.links.classes.intra.ops.p2p")
