"""The search's per-policy compute-only bound (``Bounds.compute_bounds``, read by ``_Grid.compute_floors`` before any
link is costed), first with the forward attention at its even share: never above the exact price of its policy on any
mesh order, the floored one never above the exact one, and the search they prune keeps the exact best of every
variant."""
from __future__ import annotations

import pytest

from sp_plan.planner import Workload
from sp_plan.planner.estimate import Estimator
from sp_plan.planner.search import GroupItem, Space, _Grid, best_per_variant, degree_groups, grid_search
from sp_plan.profiles import load_cluster, load_model
from sp_plan.profiles.kernels import default_params

#: (cluster preset, nodes, model, seq_len, batch): one micro-batch a step, several, and uneven pipeline stages
CASES = [("dgx-h100", 2, "llama3-8b", "64k", 8), ("l20-8-pcie", 1, "llama3-8b", "32k", 4),
         ("a100-16-eth100", 2, "gpt-7b", "32k", 1), ("dgx-h100", 16, "llama3-405b", "32k", 2)]
IDS = [f"{c[0]}x{c[1]} {c[2]} {c[3]} b{c[4]}" for c in CASES]


def _inputs(case, neutral: bool = False):
    preset, nodes, model, seq, batch = case
    cluster = load_cluster(preset, nodes)
    work = Workload(seq_len=seq, batch=batch)
    return cluster, load_model(model), work, None if neutral else default_params(cluster)


@pytest.mark.parametrize("neutral", [False, True], ids=["defaults", "neutral"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_each_policys_compute_bound_is_below_its_exact_price_on_every_order(case, neutral):
    cluster, model, work, pr = _inputs(case, neutral)
    est, space = Estimator(cluster, model, work, params=pr), Space(cluster.world_size, model, work)
    grid = _Grid(est, space, keep=5, distinct=True, progress=None)
    checked = uneven = 0
    for d in space.degrees():
        fresh = Estimator(cluster, model, work, params=pr)  # forward schedules summed only for the bound below
        for base, orders, fitting in degree_groups(est, space, d)[0]:
            exact = est.evaluate_orders(base, est.orders(base.degrees, orders, base.placement), fitting)[0].min(axis=0)
            floored = fresh.bounds.compute_bounds(base, fitting, forward_floor=True)
            own = est.bounds.compute_bounds(base, fitting)
            item = GroupItem(base, orders, fitting, [0.0] * len(fitting), float("inf"), d)
            floors, was_floored = grid.compute_floors(item)
            assert not was_floored
            assert len(own) == len(floors) == len(floored) == len(fitting)
            for p, t, b, f, lo in zip(fitting, exact, own, floors, floored):
                assert lo <= b * (1 + 1e-12) and b <= t and f <= t, (base, p, lo, b, f, t)
                checked += 1
            uneven += est.stages_of(base) is not None
    assert checked > 100
    if case[2] == "llama3-405b":
        assert uneven  # pp that does not divide 126 layers: the busiest stage's bound is checked too


@pytest.mark.parametrize("case", CASES[:3], ids=IDS[:3])
def test_the_pruned_search_keeps_every_variants_exact_best(case):
    cluster, model, work, pr = _inputs(case)
    full = grid_search(cluster, model, work, keep=None, params=pr)
    pruned = grid_search(cluster, model, work, keep=5, params=pr)
    assert pruned.evaluated < full.evaluated
    assert best_per_variant(pruned.ranked) == best_per_variant(full.ranked)
    assert [t for t, _ in pruned.ranked[:5]] == [t for t, _ in full.ranked[:5]]


def test_the_forward_is_floored_until_its_schedule_is_summed():
    cluster, model, work, pr = _inputs(CASES[0])
    est, space = Estimator(cluster, model, work, params=pr), Space(cluster.world_size, model, work)
    d = next(d for d in space.degrees() if d.ring > 1)
    base, _, fitting = degree_groups(est, space, d)[0][0]
    mbs = fitting[0][2]
    assert est.bounds.forward_is_floored(base, mbs)
    floored = est.bounds.compute_bounds(base, fitting, forward_floor=True)
    assert est.bounds.forward_is_floored(base, mbs)  # the floored bound built no forward schedule
    exact = est.bounds.compute_bounds(base, fitting)
    assert not est.bounds.forward_is_floored(base, mbs)
    assert est.bounds.compute_bounds(base, fitting, forward_floor=True) == exact  # summed: the exact bound
    assert all(lo <= b for lo, b in zip(floored, exact)) and any(lo < b for lo, b in zip(floored, exact))
    inference = Estimator(cluster, model, work.model_copy(update={"training": False}), params=pr)
    assert not inference.bounds.forward_is_floored(base, mbs)  # a forward alone: its own schedule decides
