"""Fuzzing the torchrun boundary: the environment a launcher sets (ranks, CUDA_VISIBLE_DEVICES)."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fuzzing import outcome
from sp_plan.planner.discover.report import GpuInfo, HostReport, RankInfo
from sp_plan.planner.discover.host import visible_gpus
from sp_plan.planner.errors import PlanError
from sp_plan.profiles.discover.probe import rank_info

VALUE = st.one_of(st.integers(-3, 70).map(str), st.sampled_from(["", " 1", "x", "1.0", "²", "٣", "9" * 30]),
                  st.text(max_size=6))
KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK")


@st.composite
def valid_envs(draw) -> dict:
    nodes, per = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    node, local = draw(st.integers(0, nodes - 1)), draw(st.integers(0, per - 1))
    return {"RANK": str(node * per + local), "WORLD_SIZE": str(nodes * per), "LOCAL_RANK": str(local),
            "LOCAL_WORLD_SIZE": str(per), "GROUP_RANK": str(node)}


@given(valid_envs())
def test_a_torchrun_environment_reads_as_set(env):
    r = rank_info(env)
    assert (r.rank, r.world_size, r.local_rank, r.node_rank) == tuple(int(env[k]) for k in
                                                                      ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK"))


@given(st.dictionaries(st.sampled_from(KEYS), VALUE))
def test_any_environment_is_a_rank_or_a_plan_error(env):
    got = outcome(lambda: rank_info(env))
    if isinstance(got, RankInfo):
        assert 0 <= got.rank < got.world_size and 0 <= got.local_rank < got.local_world_size
    else:
        assert isinstance(got, PlanError) and got.field == "environment"


@given(st.integers(0, 8), st.one_of(st.none(), st.text(max_size=20),
                                    st.lists(st.sampled_from(["0", "1", "7", "9", "GPU-1", "²", " ", "-1"])).map(",".join)))
def test_cuda_visible_devices_gives_known_gpus(n, cvd):
    report = HostReport(hostname="h", gpus=[GpuInfo(index=i, uuid=f"GPU-{i}") for i in range(n)])
    got = visible_gpus(report, {} if cvd is None else {"CUDA_VISIBLE_DEVICES": cvd})
    assert set(got) <= set(range(n))
    if cvd is None:
        assert got == list(range(n))
