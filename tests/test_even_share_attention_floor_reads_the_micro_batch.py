"""The attention's even-share floor (``Bounds.balanced_time``, what the degrees bound and the floored compute bound
count the attention at) is the floor of the shape's own micro-batch: a micro-batch of two sequences does twice a
sequence's attention work, whatever micro-batch sizes were floored before it on the same Estimator."""
from __future__ import annotations

import pytest

from sp_plan.planner import Workload
from sp_plan.planner.estimate import Estimator
from sp_plan.planner.schedules import Shape
from sp_plan.profiles import load_cluster, load_model


@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
def test_each_micro_batchs_floor_is_its_own_whatever_was_asked_first(backward):
    model, work, cluster = load_model("llama3-8b"), Workload(seq_len="32k"), load_cluster("dgx-h100")
    shapes = {b: Shape(model, work, dp=1, ulysses=2, ring=4, token_layout="zigzag", tp=1, mbs=b) for b in (1, 2, 4)}
    fresh = {b: Estimator(cluster, model, work).bounds.balanced_time(c, backward) for b, c in shapes.items()}
    assert fresh[1] < fresh[2] < fresh[4]
    for order in ((1, 2, 4), (4, 2, 1)):
        est = Estimator(cluster, model, work)
        for b in order:
            assert est.bounds.balanced_time(shapes[b], backward) == fresh[b], (order, b)
