"""Values the search reads from a Shape at dp 1 and pp 1 (a policy's floor, the attention buffers, a bound unit's
attention steps) shared by every degrees choice: each must be what the candidate's own Shape (dp and pp as they are)
gives."""
from __future__ import annotations

import pytest

from sp_plan.planner import Workload
from sp_plan.planner.algorithms import algorithm_for
from sp_plan.planner.candidate import Candidate
from sp_plan.planner.estimate import Estimator
from sp_plan.planner.memory import attention_buffer_bytes
from sp_plan.planner.schedules import Shape, attention_steps
from sp_plan.planner.search import Space, degree_groups
from sp_plan.planner.stages import busiest_stage, pipeline_time
from sp_plan.profiles import load_cluster, load_model
from sp_plan.profiles.kernels import default_params


def _setup(nodes: int, batch: int):
    cluster = load_cluster("dgx-h100", nodes)
    work = Workload(seq_len="1m", batch=batch, causal=True, training=True)
    model = load_model("llama3-70b")
    return (Estimator(cluster, model, work, params=default_params(cluster)),
            Estimator(cluster, model, work, params=default_params(cluster)), Space(cluster.world_size, model, work))


def _own_policy_floor(est: Estimator, probe: Candidate, ckpt: str, mbs: int) -> float:
    """``Bounds.policy_floor`` read from ``probe``'s own Shape, in the bound's order of sums."""
    c = est.shape(probe, mbs)
    busy, balanced = est.busy, est.bounds.balanced_time
    fwd = busy("fwd-linear", c) + balanced(c, False)
    layer = fwd + (busy("bwd-linear", c) + balanced(c, True))
    if ckpt == "full":
        layer += fwd
    elif ckpt == "attention_boundary":
        layer += busy("fwd-linear", c)
    stage = (est.model.layers // probe.pp * layer + busy("head", c) if c.stage_layers is None
             else float(busiest_stage(c.stage_layers, layer, busy("head", c))))
    return pipeline_time(c.micro_batches, probe.pp, probe.virtual_stages, stage)


@pytest.mark.parametrize("nodes,batch", [(16, 8), (64, 16)])
def test_policy_floor_equals_the_candidates_own_shape(nodes, batch):
    est, fresh, space = _setup(nodes, batch)
    checked = 0
    for d in list(space.degrees())[::5]:
        probe = Candidate(algorithm_for(d.ulysses, d.ring), d.dp, d.pp, d.tp, d.ulysses, d.ring)
        for _, ckpt, mbs in space.policies(d)[::4]:
            assert est.bounds.policy_floor(probe, (0, ckpt, mbs)) == _own_policy_floor(fresh, probe, ckpt, mbs)
            checked += 1
    assert checked > 50


def test_attention_buffers_and_bound_units_read_no_dp_and_no_pp():
    est, fresh, space = _setup(64, 16)
    checked = units = 0
    for d in list(space.degrees())[::3]:
        for base, _, fitting in degree_groups(est, space, d)[0]:
            mbs = fitting[-1][2]
            own = fresh.shape(base, mbs)
            bare = est.bounds._bare_shape(base, base.tp, mbs)
            assert (bare.dp, bare.pp, bare.stage_layers) == (1, 1, None)
            assert attention_buffer_bytes(own, True) == attention_buffer_bytes(bare, True)
            for part in ("fwd", "bwd"):
                one, _ = est.bounds.bound_unit(part, own)
                if one is own:
                    continue
                assert (one.dp, one.pp, one.stage_layers) == (1, 1, None)
                at_own = Shape(own.model, own.work, *(own.key[:4] + one.key[4:5] + own.key[5:6] + one.key[6:10]
                                                      + own.key[10:]), merge=own.merge)  # dp, pp as they are
                assert attention_steps(one, backward=part == "bwd") == attention_steps(at_own, backward=part == "bwd")
                units += 1
            checked += 1
    assert checked > 20 and units > 10


@pytest.mark.parametrize("layout,algorithm,team,placement,kv_chunks", [
    ("zigzag", "ring", 1, None, 1), ("striped", "wallfacer", 4, "collective_intra", 1),
    ("contiguous", "allgather", 1, None, 2), ("zigzag", "tokenring_ring", 8, None, 1)])
def test_a_shapes_sibling_is_the_shape_built_with_those_fields(layout, algorithm, team, placement, kv_chunks):
    """``Shape.sibling`` copies the derived sizes: every attribute, its keys too, is what building the Shape gives."""
    m, w = load_model("llama3-70b"), Workload(seq_len="1m", batch=16)
    base = Shape(m, w, 2, 8, 16, "contiguous", 4, 2, 2, "usp", 1, None, None, 1)
    built = Shape(m, w, 2, 8, 16, layout, 4, 2, 2, algorithm, team, placement, None, kv_chunks)
    sibling = base.sibling(layout, algorithm, team, placement, kv_chunks)
    assert sibling.__dict__ == built.__dict__ and sibling == built and hash(sibling) == hash(built)
    assert sibling.keys is not base.keys  # each shape's schedule keys are its own
