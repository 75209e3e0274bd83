"""The search's answer when no layout is valid: the error names what to change."""
from __future__ import annotations

from sp_plan.planner.model import Workload
from sp_plan.planner.search import grid_search, no_plan_error
from sp_plan.profiles import load_cluster, load_model


def test_no_layout_fitting_names_the_memory_a_plan_may_use():
    """The memory a plan may use (MEMORY_HEADROOM of the device's, what plan and estimate print 'of') and the
    device's own, as `sp-plan presets` lists it."""
    c = load_cluster("dgx-h100")
    w = Workload(seq_len="4k")
    res = grid_search(c, load_model("llama3-70b"), w, keep=None)
    assert not res.ranked
    e = no_plan_error(c, w, res)
    assert e.field == "workload" and "71.7 GiB usable of 79.6 GiB per device" in e.problem


def test_the_kth_fastest_time_is_the_threshold_nothing_slower_enters():
    from sp_plan.planner.search import REL_TOL, Fastest

    f = Fastest(2)
    assert f.kth() == float("inf")
    for t in (3.0, 1.0, 2.0, 5.0):
        f.add(t)
    assert f.times == [1.0, 2.0] and f.kth() == 2.0
    d = Fastest(2, distinct=True)
    for t in (1.0, 1.0 * (1 + REL_TOL / 2), 3.0, 2.0):  # the second is the first's equivalent: not a time of its own
        d.add(t)
    assert d.times == [1.0, 2.0] and d.kth() == 2.0 * (1 + REL_TOL)
