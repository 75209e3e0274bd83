"""Interleaved 1F1B (virtual stages): the plan field, the bubble, the stage sends and the activation memory against
their formulas (Narayanan et al. 2021 §2.2.2; Megatron's warm-up count), and the checks that refuse what no
interleaved schedule runs."""
from __future__ import annotations

import pytest

from sp_plan.planner import Plan, PlanError
from sp_plan.planner.candidate import Candidate
from sp_plan.planner.estimate import Estimator, bubble_time, pipeline_time
from sp_plan.planner.memory import in_flight_micro_batches
from sp_plan.planner.model import Workload
from sp_plan.planner.schedules import Shape
from sp_plan.planner.stages import (chunk_layers, check_interleaved_micro_batches, searched_virtual_stages,
                                    stage_chunks, virtual_stage_options)
from sp_plan.profiles import load_model, preset_cluster

MODEL = load_model("llama3-8b")  # 32 layers
LLAMA3_405B = load_model("llama3-405b")  # 126 layers
PUBLISHED = [7] + [8] * 14 + [7]
PP, DP, BATCH = 4, 4, 32  # m = 32 / 4 = 8 micro-batches: two groups of pp


def estimator(batch: int = BATCH) -> Estimator:
    return Estimator(preset_cluster("dgx-h100", nodes=2), MODEL, Workload(seq_len=16384, batch=batch))


def cand(v: int = 1, **kw) -> Candidate:
    base = dict(algorithm="ring", dp=DP, pp=PP, tp=1, ring=1, order=("dp", "pp"), virtual_stages=v)
    base.update(kw)
    return Candidate(**base)


def rows(pred) -> dict[str, float]:
    return {r.name: r.seconds for r in pred.breakdown}


def sync_exposed(pred) -> float:
    return sum(r.exposed_seconds for r in pred.breakdown if r.group and "dp" in r.group.split("x")
               and r.kind == "communication" and not r.name.startswith("pp"))


# ---------------------------------------------------------------- the formulas


def test_the_bubble_is_pp_minus_one_chunks_of_a_stage_over_v():
    assert bubble_time(16, 1, 2.0) == 30.0
    assert bubble_time(16, 8, 2.0) == 15 * 2.0 / 8
    assert pipeline_time(16, 16, 1, 2.0) == 31 * 2.0  # 1F1B: (m + pp - 1) stages
    assert pipeline_time(16, 16, 4, 2.0) == 16 * 2.0 + 15 * 2.0 / 4  # m stages + (pp - 1) / v of one


@pytest.mark.parametrize("pp,m,v,want", [
    (4, 8, 1, 4),  # 1F1B: min(pp, m)
    (4, 2, 1, 2),
    (4, 8, 2, 5.5),  # warm-up 2 (4 - 1) + (2 - 1) 4 = 10 chunk passes, one more in flight: 11 chunks of 1/2 a stage
    (4, 4, 2, 4),  # m = pp: every chunk pass of the step is in the warm-up, m v chunks = m stages
    (16, 16, 8, 16),  # Llama 3 405B's 16 micro-batches on 16 ranks: no more than 1F1B holds
    (16, 32, 8, 16 + 15 / 8),  # pp (1 + (pp - 1) / (pp v)) (Korthikanti et al. 2022 §4.2.3)
])
def test_in_flight_micro_batches_follow_megatrons_warm_up(pp, m, v, want):
    c = Shape(MODEL, Workload(seq_len=4096, batch=m), dp=1, ulysses=1, ring=1, token_layout="contiguous", pp=pp)
    assert c.micro_batches == m
    assert in_flight_micro_batches(c, v) == want
    if v > 1 and m > pp:
        assert want == pytest.approx(pp * (1 + (pp - 1) / (pp * v)))


def test_llama3s_stages_split_into_the_chunks_the_paper_describes():
    """8 chunks a rank: the first chunk of the first stage holds only the embedding, the last chunk of the last stage
    only the output projection and loss (arXiv 2407.21783 §3.3.2)."""
    chunks = stage_chunks(PUBLISHED, 8)
    assert chunks[0] == [0] + [1] * 7 and chunks[-1] == [1] * 7 + [0] and chunks[5] == [1] * 8
    assert stage_chunks(PUBLISHED, 4)[0] == [1, 2, 2, 2]
    assert stage_chunks(PUBLISHED, 3) is None
    assert chunk_layers(8, 3) is None and chunk_layers(9, 3) == [3, 3, 3]
    assert virtual_stage_options(16, 16, 126, PUBLISHED) == [1, 2, 4, 8]
    assert virtual_stage_options(16, 8, 126, PUBLISHED) == [1]  # fewer micro-batches than a group of pp
    assert virtual_stage_options(4, 8, 32) == [1, 2, 4, 8]
    assert virtual_stage_options(1, 8, 32) == [1]


def test_the_search_prices_plain_1f1b_and_the_most_chunks_a_pipeline_splits_into():
    assert searched_virtual_stages(16, [16, 8], 126, PUBLISHED) == [1, 8]
    assert searched_virtual_stages(4, [8, 4, 2], 80) == [1, 5]  # 20 layers a stage: 2, 4, 5 split it; 5 the most
    assert searched_virtual_stages(4, [2, 1], 80) == [1]  # fewer micro-batches than a group of pp
    assert searched_virtual_stages(16, [], 126, PUBLISHED) == [1]


def test_more_chunks_hold_fewer_activations_and_idle_less():
    """Why the search prices only the most chunks besides 1F1B: among v > 1, both the bubble and the activations
    held shrink as v grows (only the sends grow)."""
    c = Shape(MODEL, Workload(seq_len=4096, batch=32), dp=1, ulysses=1, ring=1, token_layout="contiguous", pp=4)
    held = [in_flight_micro_batches(c, v) for v in (2, 4, 8)]
    assert held == sorted(held, reverse=True) and held[-1] > in_flight_micro_batches(c, 1)
    assert [bubble_time(4, v, 1.0) for v in (2, 4, 8)] == [1.5, 0.75, 0.375]


# ---------------------------------------------------------------- the estimator


@pytest.mark.parametrize("v,stages", [(2, None), (4, None), (8, None), (2, (5, 10, 10, 7)), (3, (5, 12, 9, 6))])
def test_step_is_m_stages_and_the_bubble_over_v_with_v_times_the_sends(v, stages):
    """Even stages, and uneven ones whose first (last) stage splits with the embedding (LM head) as a layer."""
    est = estimator()
    m = BATCH // DP
    est.check(cand(v, stage_layers=stages))
    one, inter = est.predict(cand(1, stage_layers=stages)), est.predict(cand(v, stage_layers=stages))
    r1, rv = rows(one), rows(inter)
    sends1 = r1["pp send activations"] + r1["pp send gradients"]
    assert rv["pp send activations"] + rv["pp send gradients"] == pytest.approx(v * sends1, rel=1e-12)
    stage1 = r1["pipeline bubble"] / (PP - 1)
    stage_v = stage1 + (v - 1) * sends1 / m  # the same layers, v sends a micro-batch each way instead of one
    assert rv["pipeline bubble"] == pytest.approx((PP - 1) * stage_v / v, rel=1e-12)
    sync = one.step_time_s - (m + PP - 1) * stage1  # the exposed gradient sync: the same backward hides it
    assert inter.step_time_s == pytest.approx(m * stage_v + (PP - 1) * stage_v / v + sync, rel=1e-12)
    assert inter.step_time_s < one.step_time_s


def test_interleaving_holds_the_activations_megatron_counts():
    est = estimator()
    a1 = est.memory(cand(1))["activations"]
    a2 = est.memory(cand(2))["activations"]
    assert a2 == pytest.approx(a1 * 5.5 / 4, rel=1e-12)  # pp 4, m 8: 5.5 stages' worth against 1F1B's 4
    c2 = cand(2, zero_stage=1)
    fits = est.fitting(c2, [(1, "none", 1)])
    assert (fits == [(1, "none", 1)]) == (sum(est.memory(c2).values()) <= est.capacity)


def test_one_virtual_stage_is_plain_1f1b_bit_for_bit():
    est, other = estimator(), estimator()
    plain = est.predict(cand(1))
    assert other.predict(Candidate.from_plan(cand(1).to_plan())) == plain
    assert cand(1).to_plan().virtual_stages is None


def test_bounds_stay_below_the_interleaved_price():
    est = estimator()
    c = cand(4)
    step = est.evaluate(c).step_time_s
    assert min(est.bounds.compute_bounds(c, [(0, "none", 1)])) <= step
    assert est.bounds.policy_floor(c, (0, "none", 1)) <= step
    assert est.bounds.policy_floor(c, (0, "none", 1)) < est.bounds.policy_floor(cand(1), (0, "none", 1))


# ---------------------------------------------------------------- checks


def test_a_step_of_fewer_or_ungrouped_micro_batches_is_refused():
    est = estimator(batch=24)  # m = 6 on pp 4
    with pytest.raises(PlanError, match="virtual_stages: 2 virtual stages run the micro-batches in groups of pp 4, "
                                        "and a step has 6 micro-batches"):
        est.check(cand(2))
    est.check(cand(1))
    with pytest.raises(PlanError, match="multiple of 4"):
        check_interleaved_micro_batches(2, 4, 2)


def test_stages_that_do_not_split_into_v_chunks_are_refused_naming_the_field_and_the_choices():
    with pytest.raises(PlanError, match=r"virtual_stages: the stages' layers 7,8x14,7 do not split into 3 equal "
                                        r"chunks.*use virtual_stages 2 or 4 or 8"):
        Plan(algorithm="allgather", degrees={"tp": 8, "ring": 16, "pp": 16, "dp": 8}, stage_layers=PUBLISHED,
             virtual_stages=3, model=LLAMA3_405B)
    with pytest.raises(PlanError, match="virtual_stages: 2 virtual stages need a pipeline, and pp is 1"):
        Plan(algorithm="ring", degrees={"ring": 8}, virtual_stages=2)
    with pytest.raises(PlanError, match="virtual_stages: the stages' layers 8x4 do not split into 3"):
        Plan(algorithm="ring", degrees={"pp": 4, "dp": 4}, virtual_stages=3, model=MODEL)
    est = estimator()
    with pytest.raises(PlanError, match="virtual_stages"):
        est.check(cand(3))


# ---------------------------------------------------------------- the plan file


def test_virtual_stages_round_trip_and_old_files_load(tmp_path):
    p = Plan(algorithm="allgather", degrees={"tp": 8, "ring": 16, "pp": 16, "dp": 8}, stage_layers=PUBLISHED,
             virtual_stages=8, model=LLAMA3_405B)
    p.save(tmp_path / "p.yaml")
    assert "virtual_stages: 8" in (tmp_path / "p.yaml").read_text()
    q = Plan.load(tmp_path / "p.yaml")
    assert q.virtual_stages == 8 and Candidate.from_plan(q).virtual_stages == 8
    assert "virtual:8" in q.summary()
    old = tmp_path / "old.yaml"  # written before the field: plain 1F1B
    old.write_text("schema_version: 1\nalgorithm: ring\ndegrees: {pp: 4, dp: 2}\n")
    o = Plan.load(old)
    assert o.virtual_stages is None and Candidate.from_plan(o).virtual_stages == 1
    one = Plan(algorithm="ring", degrees={"pp": 4, "dp": 2}, virtual_stages=1)
    one.save(tmp_path / "one.yaml")
    assert "virtual_stages" not in (tmp_path / "one.yaml").read_text()  # 1 is plain 1F1B, written as before


# ---------------------------------------------------------------- the search


def test_the_search_offers_the_most_chunks_where_the_micro_batches_come_in_groups_of_pp():
    from sp_plan.planner.search import Degrees, Space

    space = Space(16, MODEL, Workload(seq_len=16384, batch=8))
    d = Degrees(dp=2, pp=4, tp=2, ulysses=1, ring=1)  # 4 sequences a data-parallel rank, 8 layers a stage
    assert space.virtual_stages(d) == [1, 8]
    assert space.interleaved_mbs(d, 8) == [1]  # micro-batch 2 or 4: 2 or 1 micro-batches, fewer than pp
    assert {p[2] for p in space.policies(d, 8)} == {1} and {p[2] for p in space.policies(d)} == {1, 2, 4}
    assert space.virtual_stages(Degrees(dp=8, pp=2, tp=1, ulysses=1, ring=1)) == [1]  # one micro-batch a step
    assert space.virtual_stages(Degrees(dp=1, pp=1, tp=8, ulysses=2, ring=1)) == [1]


def test_the_pruned_search_ranks_interleaved_layouts_as_the_exhaustive_one():
    from sp_plan.planner.search import best_per_variant, grid_search

    cluster, work = preset_cluster("dgx-h100", nodes=2), Workload(seq_len=16384, batch=8)
    full = grid_search(cluster, MODEL, work, keep=None)
    interleaved = [(t, c) for t, c in full.ranked if c.virtual_stages > 1]
    assert interleaved and all(c.pp > 1 and c.virtual_stages == min(8, 32 // c.pp) for _, c in interleaved)  # the most
    est = full.estimator
    for t, c in interleaved[:20]:  # what the search ranks is what estimate prices for the plan file
        assert est.predict(est.with_stages(c)).step_time_s == pytest.approx(t, rel=1e-12)
    pruned = grid_search(cluster, MODEL, work, keep=5)
    assert [(round(t, 12), c) for t, c in pruned.ranked[:5]] == [(round(t, 12), c) for t, c in full.ranked[:5]]
    assert best_per_variant(pruned.ranked) == best_per_variant(full.ranked)
    assert pruned.evaluated < full.evaluated


def test_the_pruned_search_keeps_a_variants_interleaved_best():
    """Where interleaved layouts are variants' bests (Llama-3-70B on 32 H100s, 16k tokens, batch 16), the pruned
    search finds each variant's best that the exhaustive one does: the bound an interleaved sibling gets from the
    plain 1F1B step (``search.interleaving_floor``) stays below its price."""
    from sp_plan.planner.search import best_per_variant, grid_search

    cluster, model, work = preset_cluster("dgx-h100", nodes=4), load_model("llama3-70b"), Workload(seq_len="16k", batch=16)
    full = grid_search(cluster, model, work, keep=None)
    bests = best_per_variant(full.ranked)
    assert any(c.virtual_stages > 1 for _, c in bests) and any(c.virtual_stages == 1 for _, c in bests)
    assert best_per_variant(grid_search(cluster, model, work, keep=5).ranked) == bests
