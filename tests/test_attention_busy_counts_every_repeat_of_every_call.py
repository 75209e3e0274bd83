"""A bound's attention compute (``Bounds.attention_busy``) equals the attention steps' compute summed from the
schedule, per-call round overhead included once for every call of every repeat of a step (a ring's rounds), up to
rounding: what the bounds subtract from and add to the exact price stays the schedule's."""
from __future__ import annotations

import pytest

from sp_plan.planner import Workload
from sp_plan.planner.estimate import Estimator
from sp_plan.planner.schedules import Compute, Shape
from sp_plan.profiles import load_cluster, load_model
from sp_plan.profiles.kernels import default_params


@pytest.mark.parametrize("algorithm, ulysses, ring, tp, mbs", [("ring", 1, 8, 1, 1), ("usp", 2, 4, 1, 2),
                                                               ("usp", 1, 4, 2, 1)])
@pytest.mark.parametrize("part", ["fwd", "bwd"])
def test_attention_busy_is_the_schedules_attention_compute(algorithm, ulysses, ring, tp, mbs, part):
    cluster, model, work = load_cluster("dgx-h100"), load_model("llama3-8b"), Workload(seq_len="32k")
    params = default_params(cluster)
    assert params.round_overhead_s > 0
    est = Estimator(cluster, model, work, params=params)
    c = Shape(model, work, dp=1, ulysses=ulysses, ring=ring, token_layout="zigzag", tp=tp, mbs=mbs,
              algorithm=algorithm)
    steps = est.schedule(part, c)[len(est.schedule(part + "-linear", c)):]
    assert any(st.repeat > 1 for st in steps)
    summed = sum(est.compute_time(p) * st.repeat for st in steps for p in st.phases if isinstance(p, Compute))
    assert est.bounds.attention_busy(part, c) == pytest.approx(summed, rel=1e-9)


@pytest.mark.parametrize("algorithm, ulysses, ring, tp, mbs", [("ulysses", 8, 1, 2, 1), ("usp", 8, 1, 2, 2)])
@pytest.mark.parametrize("part", ["fwd", "bwd"])
def test_attention_busy_is_the_schedules_where_tp_x_ulysses_replicates_the_kv_heads(algorithm, ulysses, ring, tp,
                                                                                     mbs, part):
    """llama3-8b's 8 KV heads on tp 2 x ulysses 8 = 16 ranks: each rank holds a KV head of its own copy, so the
    attention is not a tp-1 unit's scaled by mbs / tp; the bound reads the shape's own schedule."""
    cluster, model, work = load_cluster("dgx-h100", 2), load_model("llama3-8b"), Workload(seq_len="64k")
    assert model.kv_heads % (tp * ulysses) and model.heads % (tp * ulysses) == 0
    est = Estimator(cluster, model, work, params=default_params(cluster))
    c = Shape(model, work, dp=1, ulysses=ulysses, ring=ring, token_layout="contiguous", tp=tp, mbs=mbs,
              algorithm=algorithm)
    steps = est.schedule(part, c)[len(est.schedule(part + "-linear", c)):]
    summed = sum(est.compute_time(p) * st.repeat for st in steps for p in st.phases if isinstance(p, Compute))
    assert est.bounds.attention_busy(part, c) == pytest.approx(summed, rel=1e-9)
