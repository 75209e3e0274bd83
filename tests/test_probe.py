"""Gathering host reports and measuring links on small gloo worlds (forked ranks, two simulated nodes)."""
from __future__ import annotations

import os

import pytest

from sp_plan.cli.discover import parse_sizes
from sp_plan.planner.cluster import Cluster
from sp_plan.planner.errors import PlanError
from sp_plan.profiles.discover import build_cluster, describe_host, probe
from sp_plan.profiles.discover.report import GpuInfo, HostReport
from harness.worlds import run_world

SIZES = [4096, 65536, 262144]


def _as_torchrun(rank: int, world: int, per_node: int) -> None:
    """The environment torchrun gives a rank (node rank = GROUP_RANK), two or more nodes on one host."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank % per_node),
                      LOCAL_WORLD_SIZE=str(per_node), GROUP_RANK=str(rank // per_node))


def _describe(r):
    return describe_host(nvml=False, use_smi=False, node_rank=r.node_rank)


def _profile(rank, world, per_node, fail_op=None, timeout=20):
    """Gather the hosts, refuse a cluster file of twice the nodes, then measure the links (``fail_op`` failing on rank
    1): the cluster built from the hosts, the calibrated one, the samples, each node's ranks, the groups left."""
    _as_torchrun(rank, world, per_node)
    hosts = probe.gather_hosts(_describe)
    c = build_cluster(hosts)
    wrong = Cluster.model_validate(c.model_dump() | {"nodes": c.nodes * 2})
    with pytest.raises(PlanError, match="ranks per node"):
        probe.check_world(wrong, hosts)
    if fail_op:
        real = probe._run_op

        def flaky(p, r, *a, **k):
            if p.op == fail_op and r == 1:
                raise RuntimeError("injected failure")
            return real(p, r, *a, **k)
        probe._run_op = flaky
    new, samples = probe.profile_links(c, hosts, SIZES, timeout=timeout)
    from torch.distributed import distributed_c10d

    groups_left = len(distributed_c10d._world.pg_map)  # the probes' groups are destroyed: only the world's is left
    return (c.model_dump(mode="json"), new.model_dump(mode="json"),
            [(s.link_class, s.op, s.nbytes, s.seconds, s.error) for s in samples],
            [[r.rank for r in h.ranks] for h in hosts], groups_left)


def test_profile_links_two_nodes_calibrates_the_cluster(tmp_path):
    """Four ranks as two simulated nodes: every rank builds the same cluster from the gathered hosts, refuses a cluster
    file that does not describe the world, and calibrates the cluster's links with the same fit."""
    res = run_world(_profile, 4, 2, timeout=90)
    built, calibrated, samples, nodes, _ = res[0]
    assert all(r[0] == built and r[1] == calibrated for r in res)  # every rank builds and calibrates the same cluster
    assert nodes == [[0, 1], [2, 3]]
    c = Cluster.model_validate(built)
    assert c.num_nodes == 2 and c.world_size == 4 and c.network == "ethernet"
    assert [d.kind for d in c.node_type(0).devices] == ["cpu", "cpu"]
    c = Cluster.model_validate(calibrated)
    cal = c.calibration["links"]
    assert set(cal["classes"]) == {"intra:shm", "inter:ethernet"}
    for cls in cal["classes"].values():
        assert set(cls["ops"]) == {"p2p", "p2p_bidir", "all_gather", "reduce_scatter", "all_to_all"}
        assert all(op["busbw"] > 0 and op["alpha_s"] >= 0 and op["points"] == 3 for op in cls["ops"].values())
    assert set(cal["applied"]) == {"shm", "ethernet"} and not cal["failed"]
    assert cal["world_size"] == 4 and cal["nodes"] == 2 and cal["backend"] == "gloo"
    eth = [l for l in c.node_type(0).links if l.kind == "ethernet"][0]
    assert eth.capacity == pytest.approx(cal["classes"]["inter:ethernet"]["ops"]["p2p"]["busbw"])
    assert len(samples) == 10 * len(SIZES) and all(s[3] for s in samples)
    # left alive, the probes' gloo groups stalled ranks in later timings (tune's solo speedup read 4 instead of 2)
    assert [r[4] for r in res] == [1] * 4
    c.save(tmp_path / "c.yaml")
    assert Cluster.load(tmp_path / "c.yaml").calibration["links"]["applied"].keys() == {"shm", "ethernet"}


def test_a_failed_measurement_is_recorded_not_fatal():
    res = run_world(_profile, 2, 2, "all_to_all", 3, timeout=90)  # rank 1 fails, rank 0 times out after 3 s
    samples = res[0][2]
    failed = [s for s in samples if s[1] == "all_to_all"]
    assert len(failed) == len(SIZES) and all(s[3] is None and s[4] for s in failed)
    assert "rank 1: RuntimeError: injected failure" in failed[0][4]  # the cause, then the peer's timeout
    assert all(s[3] for s in samples if s[1] != "all_to_all")  # the rest went on
    c = Cluster.model_validate(res[0][1])
    assert {f["op"] for f in c.calibration["links"]["failed"]} == {"all_to_all"}
    assert "all_to_all" not in c.calibration["links"]["classes"]["intra:shm"]["ops"]


def test_rank_info_and_sizes():
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
           "MASTER_ADDR": "x", "MASTER_PORT": "1"}
    r = probe.rank_info(env)
    assert (r.rank, r.node_rank, r.local_rank) == (5, 1, 1) and probe.under_torchrun(env)
    assert not probe.under_torchrun({})
    assert parse_sizes("16K, 1m,1M,4096") == [4096, 16384, 2**20]
    with pytest.raises(PlanError, match="--sizes"):
        parse_sizes("lots")


def test_cuda_identity_maps_ranks_and_fills_names():
    h = HostReport(hostname="h", gpus=[GpuInfo(index=0, pci_bus="0000:17:00.0"), GpuInfo(index=1, pci_bus="0000:ca:00.0")])
    cuda = {"name": "NVIDIA H100 PCIe", "memory": 81559 * 2**20, "uuid": "", "bus": "0000:ca:00.0"}
    assert probe._match_gpu(h, cuda, 0) == 1  # the PCI bus id wins over CUDA's numbering
    assert probe._match_gpu(h, dict(cuda, bus=""), 0) == 0
    probe._fill_from_cuda(h, 1, cuda)
    assert h.gpus[1].model == "H100-PCIe-80GB" and h.gpus[1].memory_bytes == 81559 * 2**20
    assert any("torch.cuda" in w for w in h.warnings) and not h.gpus[0].name


def test_the_old_runtime_name_is_the_discovery_module_itself():
    """``sp_plan.runtime.probe`` is kept for old imports as the same module object, so a patch through either name
    reaches the code both names run."""
    import sp_plan.runtime.probe as old

    from sp_plan.runtime import probe as old_from

    assert old is old_from is probe
