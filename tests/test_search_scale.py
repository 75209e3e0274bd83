"""The planner at cluster scale: every candidate predicts as recorded in the golden file (a change of the search's
bookkeeping must not move a prediction), pruning never drops the true top K, and the work stays bounded."""
from __future__ import annotations

import gzip
import json

import pytest

from golden_predictions import CASES, PATH, SCALE_CASE, best_of_each, candidate_times

GOLDEN = json.load(gzip.open(PATH, "rt"))


def _same(now: dict[str, float], then: dict[str, float]) -> None:
    assert sorted(now) == sorted(then)
    bad = {k: (now[k], then[k]) for k in then if abs(now[k] - then[k]) > 1e-9 * abs(then[k])}
    assert not bad, f"{len(bad)} predictions changed, e.g. {list(bad.items())[:3]}"


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_candidate_predicts_as_recorded(case):
    _same(candidate_times(case), GOLDEN[case[0]])


def test_cluster_scale_best_of_each_variant_as_recorded():
    _same(best_of_each(SCALE_CASE), GOLDEN[SCALE_CASE[0]])


# ---------------------------------------------------------------- pruning never drops the true top K

from dataclasses import replace  # noqa: E402

import numpy as np  # noqa: E402

from sp_plan.planner import Workload  # noqa: E402
from sp_plan.planner.algorithms import ALGORITHMS  # noqa: E402
from sp_plan.planner.estimate import Estimator  # noqa: E402
from sp_plan.planner.layout import (PLACEMENTS, _round_orders, causal_work, ring_split, sub_ring_coords,  # noqa: E402
                                    sub_ring_positions, team_group_size, team_positions, team_work,
                                    tokenring_step_work, wallfacer_pairs)
from sp_plan.planner.search import (Degrees, Space, best_per_variant, degree_groups, degrees_floors,  # noqa: E402
                                   grid_search)
from sp_plan.planner.tokenring import step_classes  # noqa: E402
from sp_plan.profiles import load_cluster, load_model  # noqa: E402
from golden_predictions import case_inputs  # noqa: E402

PRUNING_CASES = CASES + [("dgx-h100x4 llama3-8b 256k batch 4", "dgx-h100", 4, "llama3-8b", "256k", 4, True, True),
                         ("a100-16-eth100x8 llama3-8b 128k batch 8", "a100-16-eth100", 8, "llama3-8b", "128k", 8,
                          True, True)]


@pytest.mark.parametrize("case", PRUNING_CASES, ids=[c[0] for c in PRUNING_CASES])
def test_pruned_grid_keeps_the_exhaustive_top_k_and_every_variants_best(case):
    cluster, model, work = case_inputs(case)
    full = grid_search(cluster, model, work, keep=None)
    for k in (1, 5):
        pruned = grid_search(cluster, model, work, keep=k)
        assert pruned.evaluated <= full.evaluated and pruned.space == full.space
        assert [(round(t, 12), c) for t, c in pruned.ranked[:k]] == [(round(t, 12), c) for t, c in full.ranked[:k]]
        by_policy = work.documents is not None  # with documents, each balancing policy's best too
        assert best_per_variant(pruned.ranked, by_policy) == best_per_variant(full.ranked, by_policy)
        exact = {(round(t, 12), c) for t, c in full.ranked}  # every row it ranks at its exact best policy's time
        assert all((round(t, 12), c) in exact for t, c in pruned.ranked)


def test_pruned_grid_keeps_the_top_k_where_a_degrees_choice_has_many_micro_batch_sizes():
    """A batch of 16 on 32 GPUs gives a degrees choice several micro-batch sizes, each with its own bound: the
    choice waits in the queue under the least of them, and the pruned top K and variants' bests are the exhaustive
    ones."""
    cluster, model = load_cluster("a100-16-eth100", 4), load_model("llama3-8b")
    work = Workload(seq_len="16k", batch=16)
    full, pruned = grid_search(cluster, model, work, keep=None), grid_search(cluster, model, work, keep=5)
    assert [(round(t, 12), c) for t, c in pruned.ranked[:5]] == [(round(t, 12), c) for t, c in full.ranked[:5]]
    assert best_per_variant(pruned.ranked) == best_per_variant(full.ranked)
    assert pruned.evaluated * 20 < full.evaluated  # each variant's best prunes its own groups (about 0.4 % priced)


@pytest.mark.parametrize("case", PRUNING_CASES, ids=[c[0] for c in PRUNING_CASES])
def test_degrees_bound_is_below_every_candidate_of_its_degrees(case):
    """The bounds that let the grid drop a degrees choice unexpanded, per micro-batch size and pipeline schedule,
    are lower bounds on every candidate that runs them."""
    cluster, model, work = case_inputs(case)
    full = grid_search(cluster, model, work, keep=None)
    est, space = full.estimator, Space(cluster.world_size, model, work)
    floors: dict = {}
    for t, c in full.ranked:
        d = Degrees(c.dp, c.pp, c.tp, c.ulysses, c.ring)
        if d not in floors:
            floors[d] = degrees_floors(est, space, d)
        assert floors[d][c.micro_batch_size, c.virtual_stages] <= t * (1 + 1e-12)
        assert min(floors[d].values()) <= t * (1 + 1e-12)
    assert len(floors) > 5


# ---------------------------------------------------------------- bounded work, counted (no clock)

def _count_attention_builds(monkeypatch) -> list:
    """Record every attention schedule built, through whichever path (each algorithm's ``steps``)."""
    calls: list = []
    for name, alg in list(ALGORITHMS.items()):
        def counted(c, backward, _steps=alg.steps):
            calls.append((c.algorithm, c.ulysses, c.ring, c.team, c.placement, c.token_layout, c.tp, c.mbs, backward))
            return _steps(c, backward)
        monkeypatch.setitem(ALGORITHMS, name, replace(alg, steps=counted))
    return calls


def _attention_shapes(cluster, model, work) -> set:
    """Distinct attention schedule shapes of every fitting candidate: (algorithm, degrees inside the
    sequence, team, placement, token layout, tp, micro-batch, direction); one sequence per micro-batch for
    the algorithms whose schedules scale with it (``Algorithm.batch_linear``: built once, scaled)."""
    est, space = Estimator(cluster, model, work), Space(cluster.world_size, model, work)
    out = set()
    for d in space.degrees():
        for base, _, fitting in degree_groups(est, space, d)[0]:
            for mbs in {p[2] if not ALGORITHMS[base.algorithm].batch_linear else 1 for p in fitting}:
                for bwd in ((False, True) if work.training else (False,)):
                    out.add((base.algorithm, base.ulysses, base.ring, base.team, base.placement, base.token_layout,
                             base.tp, mbs, bwd))
    return out


@pytest.mark.parametrize("nodes,batch", [(2, 1), (2, 4), (4, 1), (8, 1)])
def test_schedules_are_built_once_per_shape_not_per_candidate(monkeypatch, nodes, batch):
    cluster, model = load_cluster("dgx-h100", nodes), load_model("llama3-8b")
    work = Workload(seq_len="256k", batch=batch)
    shapes = _attention_shapes(cluster, model, work)
    calls = _count_attention_builds(monkeypatch)
    res = grid_search(cluster, model, work, keep=None)
    assert len(calls) == len(set(calls)), "an attention schedule was built twice"
    assert set(calls) == shapes  # exhaustive: every shape once, nothing per candidate
    stats = res.estimator.stats
    assert stats.schedules_built == len(res.estimator._schedules)
    assert stats.schedules_built < stats.schedule_lookups
    assert len(calls) * 5 < res.space  # the candidates far outnumber the schedules built


def test_schedule_and_link_work_grow_with_shapes_when_batch_and_world_double():
    model = load_model("llama3-8b")
    runs = {}
    for nodes, batch in [(2, 1), (2, 2), (2, 4), (4, 1)]:
        cluster, work = load_cluster("dgx-h100", nodes), Workload(seq_len="256k", batch=batch)
        res = grid_search(cluster, model, work, keep=None)
        est = res.estimator
        shapes = len(_attention_shapes(cluster, model, work))
        runs[nodes, batch] = (res.space, est.stats.schedules_built, est.engine.evaluations)
        # each (pattern, group shape) is routed once however many candidates use it
        assert est.engine.evaluations == est.engine._cost.cache_info().misses
        # schedules follow the distinct shapes: attention fwd + bwd, and linear / head / stage parts shared by them
        assert est.stats.schedules_built <= 3 * shapes
        assert est.engine.evaluations * 20 < res.space
    # batch 4 adds candidates (micro-batch sizes) but no new schedule or group shape over batch 2
    assert runs[2, 4][0] > 1.5 * runs[2, 2][0] and runs[2, 4][1:] == runs[2, 2][1:]
    # twice the nodes: about twice the candidates, and the schedules grow no faster than the candidates
    assert runs[4, 1][1] / runs[2, 1][1] <= runs[4, 1][0] / runs[2, 1][0]


# ---------------------------------------------------------------- closed forms against the sums they replace

def _tokenring_work_brute(layout, P, C, S):
    """seeds/001: rank p = nC + a holds Q_(nC + (a + i) mod C) and K, V of ((n - j) mod N) C + a in step (j, i)."""
    w, N = causal_work(layout, P, S), P // C
    p = np.arange(P)
    n, a = p // C, p % C
    return [float(w[n * C + (a + i) % C, ((n - j) % N) * C + a].max()) for j in range(N) for i in range(C)]


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
def test_tokenring_step_work_closed_form_matches_the_per_rank_maximum(layout):
    for P in (2, 4, 6, 8, 12, 16, 32):
        for S in (P * 2 * 3, P * 2 * 64):
            first, later = tokenring_step_work(layout, P, S, True)
            for C in (c for c in range(2, P + 1) if P % c == 0):
                assert _tokenring_work_brute(layout, P, C, S) == [first] + [later] * (P - 1)
    assert tokenring_step_work(layout, 8, 64, False) == (1.0, 1.0)


def test_tokenring_step_classes_count_every_step_once():
    for P, C in [(2, 2), (8, 8), (8, 2), (16, 4), (64, 2), (4096, 8)]:
        classes = step_classes(P, C)
        assert sum(n for *_, n in classes) == P
        assert len(classes) <= 16


def test_wallfacer_pairs_vectorized_match_algorithm_3():
    for P, C in [(4, 2), (16, 2), (16, 4), (36, 3), (72, 6), (128, 4)]:
        tgs = team_group_size(P, C)
        for pl in PLACEMENTS:
            for bwd in (False, True):
                want = np.empty((P, tgs, 2), dtype=np.int64)
                for p in range(P):
                    g, a, i = sub_ring_coords(P, C, pl, p)
                    for r in range(tgs):
                        j = (i - r) % tgs
                        want[p, r] = (g * tgs + j, C * i + a) if bwd else (g * tgs + i, C * j + a)
                assert (wallfacer_pairs(P, C, pl, bwd) == want).all()


def test_round_orders_closed_form_matches_the_pairs():
    """Which team orders (earlier, same, later K/V team) each WallFacer sub-ring round pairs: the closed form
    against the pairs themselves, every placement, forward and backward, teams of 2 to 32 (non-square C too)."""
    n = 0
    for P in (4, 8, 16, 36, 64, 72, 128, 256, 1024):
        for C in (2, 3, 4, 6, 8, 16, 32):
            if P % (C * C):
                continue
            for pl in (*PLACEMENTS, None):
                for bwd in (False, True):
                    pairs = wallfacer_pairs(P, C, pl, bwd)
                    u, v = pairs[..., 0], pairs[..., 1]
                    got = _round_orders(P, C, pl, bwd)
                    for want, have in zip(((v < u).any(axis=0), (v == u).any(axis=0), (v > u).any(axis=0)), got):
                        assert (have == want).all(), (P, C, pl, bwd)
                    n += 1
    assert n > 100


def test_team_work_and_ring_split_match_the_positions():
    for layout in ("contiguous", "zigzag", "striped"):
        for P, C in [(4, 2), (16, 2), (16, 4), (64, 4), (128, 8)]:
            for pl in PLACEMENTS:
                cw, pos = causal_work(layout, P, P * 64), np.array(team_positions(P, C, pl))
                want = cw[pos[:, :, None, None], pos[None, None, :, :]].mean(axis=(1, 3))
                assert np.allclose(team_work(layout, P, C, pl, P * 64), want, rtol=1e-13, atol=0)
                for name, members in [("team", team_positions(P, C, pl)[0]),
                                      ("sub_ring", sub_ring_positions(P, C, pl)[0]),
                                      ("team_ring", tuple(t[0] for t in team_positions(P, C, pl)))]:
                    size, step = ring_split(P, C, pl, name)
                    assert size == len(members)
                    assert size == 1 or list(members) == [members[0] + k * step for k in range(size)]


def test_pruning_stays_exact_under_calibrated_params():
    """A measured, non-monotone efficiency curve, masked blocks measured faster than dense ones, a per-call
    overhead, partial overlap and fitted links: the bounds stay below every candidate, so the pruned grid still
    equals exhaustive pricing."""
    from sp_plan.planner.params import CommFit, Curve, Params

    bumpy = Curve(points=((512, 0.2), (4096, 0.7), (16384, 0.45), (65536, 0.6), (262144, 0.3)))
    masked = Curve(points=((512, 0.5), (4096, 0.9), (262144, 0.8)))
    params = Params(attention_fwd=bumpy, attention_bwd=bumpy, attention_fwd_masked=masked,
                    attention_bwd_masked=masked, matmul=Curve(points=((1024, 0.5), (65536, 0.8))),
                    overlap=0.7, round_overhead_s=2e-4, comm={"p2p/inter": CommFit(alpha_s=1e-5, efficiency=0.8),
                                                             "all_to_all/intra": CommFit(efficiency=0.6)})
    for case in (PRUNING_CASES[0], PRUNING_CASES[1], PRUNING_CASES[-2]):
        cluster, model, work = case_inputs(case)
        full = grid_search(cluster, model, work, keep=None, params=params)
        pruned = grid_search(cluster, model, work, keep=5, params=params)
        assert pruned.evaluated < full.evaluated
        assert [(round(t, 12), c) for t, c in pruned.ranked[:5]] == [(round(t, 12), c) for t, c in full.ranked[:5]]
        assert best_per_variant(pruned.ranked) == best_per_variant(full.ranked)


# ---------------------------------------------------------------- the per-policy bounds, against exhaustive pricing

from sp_plan.planner.params import CommFit, Curve, Params  # noqa: E402

BUMPY = Curve(points=((512, 0.2), (4096, 0.7), (16384, 0.45), (65536, 0.6), (262144, 0.3)))
CALIBRATED = Params(attention_fwd=BUMPY, attention_bwd=BUMPY, matmul=Curve(points=((1024, 0.5), (65536, 0.8))),
                    overlap=0.7, round_overhead_s=2e-4, comm={"p2p/inter": CommFit(alpha_s=1e-5, efficiency=0.8),
                                                             "all_to_all/intra": CommFit(efficiency=0.6)})


@pytest.mark.parametrize("calibrated", [False, True])
@pytest.mark.parametrize("case", PRUNING_CASES, ids=[c[0] for c in PRUNING_CASES])
def test_policy_bounds_are_below_every_mesh_order_of_their_policy(case, calibrated):
    """compute_bounds <= comm_bounds (attention_floor) <= the exact price of every mesh order, policy by policy, for
    every group of every degrees choice."""
    cluster, model, work = case_inputs(case)
    est = Estimator(cluster, model, work, params=CALIBRATED if calibrated else None)
    space, checked = Space(cluster.world_size, model, work), 0
    for d in space.degrees():
        found = degree_groups(est, space, d)[0]
        for base, orders, fitting in found:
            batch = est.orders(base.degrees, orders, base.placement)
            exact = est.evaluate_orders(base, batch, fitting)[0].min(axis=0)
            tight = est.bounds.comm_bounds(base, batch, fitting)
            floor = min(est.bounds.compute_bounds(base, fitting))
            assert all(floor <= ti * (1 + 1e-12) and ti < ex for ti, ex in zip(tight, exact)), base
            checked += len(fitting)
    assert checked > 20


def test_batch_linear_flag_says_whether_a_schedule_scales_with_the_micro_batch():
    """Algorithm.batch_linear is true exactly when the schedule built for k sequences per micro-batch equals the
    one-sequence schedule scaled by k (schedules.scaled), which the Estimator then uses instead of building."""
    from sp_plan.planner.schedules import Shape, scaled

    def flat(steps):
        return [(st.repeat, st.overlap, [(type(p).__name__, p.name, getattr(p, "flops", 0.0), getattr(p, "nbytes", 0.0),
                                          getattr(p, "rows", 0.0), getattr(p, "block", 0.0)) for p in st.phases])
                for st in steps]

    model, work = load_model("llama3-8b"), Workload(seq_len="64k", batch=8)
    seen = set()
    for name, alg in ALGORITHMS.items():
        tp, u, r, team = {"metp": (4, 1, 1, 1), "tokenring_ring": (1, 1, 8, 2), "wallfacer": (1, 1, 8, 2),
                          "ulysses": (1, 4, 1, 1), "ring": (1, 1, 4, 1)}.get(name, (1, 2, 4, 1))
        for bwd in (False, True):
            one = Shape(model, work, 1, u, r, "zigzag", tp, 1, 1, name, team)
            four = replace(one, mbs=4)
            built, grown = flat(alg.steps(four, bwd)), flat(scaled(alg.steps(one, bwd), 4))
            same = len(built) == len(grown) and all(
                a[:2] == b[:2] and len(a[2]) == len(b[2]) and all(
                    x[:2] == y[:2] and np.allclose(x[2:], y[2:], rtol=1e-12, atol=0) for x, y in zip(a[2], b[2]))
                for a, b in zip(built, grown))
            assert same == alg.batch_linear, (name, bwd)
        seen.add(name)
    assert {"ring", "usp", "wallfacer", "tokenring", "tokenring_ring", "metp"} <= seen


def test_a_larger_micro_batch_is_never_slower_where_the_search_drops_the_smaller():
    """larger_micro_batch_wins: without a pipeline and uncalibrated, every candidate of (degrees, order, token layout,
    ZeRO stage, checkpointing) is no slower with a larger fitting micro-batch, checked on every candidate; with a
    pipeline or a fixed cost per attention call the search keeps every micro-batch."""
    from sp_plan.planner.estimate import Orders
    from sp_plan.planner.params import Params
    from sp_plan.planner.search import larger_micro_batch_wins

    cluster, model = load_cluster("dgx-h100", 2), load_model("llama3-8b")
    work = Workload(seq_len="64k", batch=8)
    est, space = Estimator(cluster, model, work), Space(cluster.world_size, model, work)
    compared = 0
    for d in space.degrees():
        if not larger_micro_batch_wins(est, d.pp):
            assert d.pp > 1
            continue
        for base, orders, fitting in degree_groups(est, space, d)[0]:
            times, _ = est.evaluate_orders(base, Orders(est.engine, base.degrees, orders, base.placement), fitting)
            for j, (z, ck, mbs) in enumerate(fitting):
                for i, (z2, ck2, mbs2) in enumerate(fitting):
                    if (z2, ck2) == (z, ck) and mbs2 > mbs:
                        assert np.all(times[:, i] <= times[:, j] * (1 + 1e-12)), (base, fitting[i], fitting[j])
                        compared += 1
    assert compared > 50
    assert not larger_micro_batch_wins(Estimator(cluster, model, work, params=Params(round_overhead_s=1e-5)), 1)
