"""The communication bound the search reads per checkpointing at a group's largest micro-batch
(``search.at_largest_micro_batch``): below the exact price of every fitting policy on every mesh order, whichever
checkpointing that micro-batch came from, and the search it prunes ranks what exhaustive pricing ranks."""
from __future__ import annotations

import pytest

from sp_plan.planner.estimate import Estimator
from sp_plan.planner.search import (Space, at_largest_micro_batch, degree_groups, shared_bounds)

from search_checks import assert_pruned_ranks_as_exhaustive
from test_micro_batch_dominance import CASES, RISING, _inputs  # the same clusters, workloads and terms

IDS = [f"{c[0]}x{c[1]} {c[2]} {c[3]} b{c[4]}" for c in CASES]


@pytest.mark.parametrize("params", [None, lambda cluster: RISING], ids=["defaults", "rising-gemm"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_each_checkpointings_bound_at_the_largest_micro_batch_is_below_every_policys_price(case, params):
    cluster, model, work, pr = _inputs(case, params)
    est, space = Estimator(cluster, model, work, params=pr), Space(cluster.world_size, model, work)
    checked = 0
    for d in space.degrees():
        for base, orders, fitting in degree_groups(est, space, d)[0]:
            rep = shared_bounds(est, d.pp, (base.algorithm,), fitting)
            if rep is None:
                continue
            batch = est.orders(base.degrees, orders, base.placement)
            exact = est.evaluate_orders(base, batch, fitting)[0].min(axis=0)
            shared = at_largest_micro_batch(rep)
            assert {p[2] for p in shared} == {max(p[2] for p in fitting)}
            bound = dict(zip(rep, est.bounds.comm_bounds(base, batch, shared, sync=False)))
            own = dict(zip(rep, est.bounds.comm_bounds(base, batch, list(rep.values()), sync=False)))
            for ck in rep:  # no tighter than at the checkpointing's own largest micro-batch (B s(K) <= B s(k))
                assert bound[ck] <= own[ck] * (1 + 1e-12), (base, ck)
            for p, ex in zip(fitting, exact):
                assert bound[p[1]] <= ex, (base, p, bound[p[1]], ex)
                checked += rep[p[1]][2] < shared[0][2]  # its checkpointing's bound read above its own micro-batches
    assert checked > 20


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_search_ranks_what_exhaustive_pricing_ranks(case):
    cluster, model, work, pr = _inputs(case, None)
    assert_pruned_ranks_as_exhaustive(cluster, model, work, pr)
