"""With measured masked-kernel efficiency curves (``attention_fwd_masked`` / ``attention_bwd_masked``), the
attention's even-share floor (``Bounds.balanced_time``) counts every pair at the faster of the dense and the masked
kernel, so it stays no more than any layout's attention compute, whether the masked kernel is the slower or the
faster one."""
from __future__ import annotations

import pytest

from sp_plan.planner import Workload
from sp_plan.planner.estimate import Estimator
from sp_plan.planner.params import Curve, Params
from sp_plan.planner.schedules import Compute, Shape, attention_steps
from sp_plan.profiles import load_cluster, load_model

DENSE_FWD = Curve(points=((64, 0.1), (256, 0.27), (1024, 0.31), (4096, 0.4)))
DENSE_BWD = Curve(points=((64, 0.12), (256, 0.28), (1024, 0.3), (4096, 0.38)))
SLOW_MASKED = Params(attention_fwd=DENSE_FWD, attention_bwd=DENSE_BWD,
                     attention_fwd_masked=Curve(points=((64, 0.06), (256, 0.12), (1024, 0.2), (4096, 0.25))),
                     attention_bwd_masked=Curve(points=((64, 0.05), (256, 0.14), (1024, 0.2), (4096, 0.22))))
FAST_MASKED = Params(attention_fwd=DENSE_FWD, attention_bwd=DENSE_BWD,
                     attention_fwd_masked=Curve(points=((64, 0.2), (256, 0.4), (1024, 0.5), (4096, 0.6))),
                     attention_bwd_masked=Curve(points=((64, 0.2), (256, 0.4), (1024, 0.45), (4096, 0.55))))


@pytest.mark.parametrize("params", [SLOW_MASKED, FAST_MASKED], ids=["masked-slower", "masked-faster"])
@pytest.mark.parametrize("algorithm, ulysses, ring, layout", [("ring", 1, 8, "zigzag"), ("usp", 2, 4, "zigzag"),
                                                              ("ring", 1, 4, "contiguous")])
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
def test_the_floor_is_no_more_than_the_layouts_attention(params, algorithm, ulysses, ring, layout, backward):
    model, work = load_model("llama3-8b"), Workload(seq_len="32k", causal=True)
    est = Estimator(load_cluster("dgx-h100"), model, work, params=params)
    c = Shape(model, work, dp=1, ulysses=ulysses, ring=ring, token_layout=layout, tp=1, algorithm=algorithm)
    priced = sum(est.compute_time(p) * st.repeat for st in attention_steps(c, backward) for p in st.phases
                 if type(p) is Compute and p.kind == "attention")
    assert est.bounds.balanced_time(c, backward) <= priced * (1 + 1e-12)
