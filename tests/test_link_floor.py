"""The order-free communication floor the search drops groups with before it loads their orders' links
(``Bounds.compute_bounds`` with a batch, ``LinkEngine.pattern_floor``): each phase's coefficients below the link
engine's under every mesh order, each policy's bound below its exact price on every order, on NVSwitch, PCIe and
Ethernet clusters of one and several nodes; and the search it prunes ranks what exhaustive pricing ranks."""
from __future__ import annotations

import pytest

from sp_plan.planner.estimate import Estimator
from sp_plan.planner.schedules import Compute
from sp_plan.planner.search import Space, degree_groups

from search_checks import assert_pruned_ranks_as_exhaustive
from test_micro_batch_dominance import RISING, _inputs

CASES = [("dgx-h100", 2, "llama3-8b", "64k", 8), ("dgx-h100", 1, "llama3-8b", "64k", 4),
         ("l20-8-pcie", 1, "llama3-8b", "32k", 4), ("a10-4-pcie", 2, "gpt-7b", "8k", 4),
         ("a100-16-eth100", 2, "gpt-7b", "32k", 8)]
IDS = [f"{c[0]}x{c[1]} {c[2]} {c[3]} b{c[4]}" for c in CASES]
PARAMS = pytest.mark.parametrize("params", [None, lambda cluster: RISING], ids=["defaults", "rising-gemm"])


def _groups(case, params):
    """(Estimator, base, orders batch, fitting policies) of every group of ``case``'s space."""
    cluster, model, work, pr = _inputs(case, params)
    est, space = Estimator(cluster, model, work, params=pr), Space(cluster.world_size, model, work)
    for d in space.degrees():
        for base, orders, fitting in degree_groups(est, space, d)[0]:
            yield est, base, est.orders(base.degrees, orders, base.placement), fitting


def _phases(est, base, fitting):
    """The communication phases of ``base``'s layer parts at each fitting micro-batch: (pattern, dims, bytes)."""
    out = set()
    for mbs in {p[2] for p in fitting}:
        c = est.shape(base, mbs)
        for part in ("fwd", "bwd") if est.work.training else ("fwd",):
            for st in est.schedule(part, c):
                out |= {(p.pattern, p.dim, p.nbytes) for p in st.phases if not isinstance(p, Compute)}
    return out


@PARAMS
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_each_phases_order_free_cost_is_below_its_cost_on_every_order(case, params):
    checked = 0
    for est, base, batch, fitting in _groups(case, params):
        for pattern, dims, nbytes in _phases(est, base, fitting):
            steps, spb, lat = est.bounds.order_free_coefficients(pattern, batch, dims)
            s, b, l_ = batch.coefficients(type("P", (), {"pattern": pattern, "dim": dims})())
            for volume in (0.0, nbytes, 1e3 * nbytes):
                exact = s * (volume * b + l_)
                assert (steps * (volume * spb + lat) <= exact * (1 + 1e-12)).all(), (base, pattern, dims)
            checked += steps > 0
    assert checked > 5


@PARAMS
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_link_floor_is_below_every_orders_price_and_adds_to_the_compute(case, params):
    checked = tighter = 0
    for est, base, batch, fitting in _groups(case, params):
        floor = est.bounds.compute_bounds(base, fitting, batch=batch)
        compute = est.bounds.compute_bounds(base, fitting)
        comm = est.bounds.comm_bounds(base, batch, fitting, sync=False)
        exact = est.evaluate_orders(base, batch, fitting)[0]
        for j, p in enumerate(fitting):
            assert compute[j] <= floor[j] <= comm[j] * (1 + 1e-12), (base, p)
            assert (floor[j] <= exact[:, j]).all(), (base, p)
            checked += 1
            tighter += floor[j] > compute[j] * (1 + 1e-6)
    assert checked > 20 and tighter > checked // 4


@PARAMS
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_search_ranks_what_exhaustive_pricing_ranks(case, params):
    cluster, model, work, pr = _inputs(case, params)
    assert_pruned_ranks_as_exhaustive(cluster, model, work, pr)
