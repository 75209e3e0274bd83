"""The compute scenario of a sensitivity report prices the winner under the changed efficiencies.

"compute x0.8" lowers every compute efficiency to 80 %: the device's and the profile's measured curves alike
(``scale_compute``). The winner's step time it reports is the winner priced on that cluster with those params,
so where the profile's curves price all of a step's compute, the step comes out slower than the base one.
"""
from __future__ import annotations

import pytest

from sp_plan.planner import Workload
from sp_plan.planner.estimate import Estimator
from sp_plan.planner.params import Curve, Params
from sp_plan.planner.search import finish, grid_search
from sp_plan.planner.sensitivity import COMPUTE_FACTOR, scale_compute, sensitivity
from sp_plan.profiles import load_cluster, load_model

W = Workload(seq_len=16384, batch=2)
#: a profile whose curves price every GEMM and attention block
PARAMS = Params(matmul=Curve(points=((1024, 0.4), (65536, 0.8))),
                attention_fwd=Curve(points=((256, 0.3), (65536, 0.7))),
                attention_bwd=Curve(points=((256, 0.2), (65536, 0.6))))


@pytest.fixture(scope="module")
def report():
    c, m = load_cluster("a10-4-pcie", 2), load_model("tiny-llama")
    win = finish(grid_search(c, m, W, keep=1, params=PARAMS), c, m, W, 1)[0]
    sen = sensitivity(c, m, W, win, params=PARAMS)
    return c, m, win, {s.name: s for s in sen.scenarios}


def test_the_winner_is_priced_with_the_scaled_curves(report):
    c, m, win, by = report
    scaled_cluster, scaled_params = scale_compute(c, PARAMS, COMPUTE_FACTOR)
    unpinned = win.model_copy(update={"cluster_fingerprint": None})
    want = Estimator(scaled_cluster, m, W, params=scaled_params)(unpinned).step_time_s
    assert by["compute x0.8"].old_winner_s == pytest.approx(want, rel=1e-12)


def test_slower_compute_slows_the_winner(report):
    _, _, win, by = report
    s = by["compute x0.8"]
    assert s.base_s == pytest.approx(win.predicted.step_time_s, rel=1e-12)
    assert s.old_winner_s > s.base_s * 1.05
