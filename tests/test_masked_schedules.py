"""Schedules under packed documents and sliding windows (planner/usp.py, planner/masks/): ring rounds cost their
busiest rank under the mask, a window's far rounds carry no K, V, Ulysses attends the mask's pairs over U, the
algorithms that cannot honour masks refuse them, and the search enumerates the balancing policies and all-gather."""
import numpy as np
import pytest

from sp_plan.planner import Estimator, PlanError, Workload
from sp_plan.planner.algorithms import ALGORITHMS, variants
from sp_plan.planner.candidate import Candidate
from sp_plan.planner.documents import draw_packs
from sp_plan.planner.layout import BALANCE_POLICIES, TOKEN_LAYOUTS
from sp_plan.planner.masks import (MASKED_ALGORITHMS, busiest_rank_pairs, layout_rounds, layout_tokens, pair_matrix,
                                   ring_round_pairs)
from sp_plan.planner.model import ModelSpec
from sp_plan.planner.schedules import Comm, Compute, Shape
from sp_plan.planner.search import Degrees, Space, best_per_variant, grid_search
from sp_plan.planner.usp import masked_rounds, ring_steps, usp_steps
from sp_plan.profiles import load_cluster, load_model
from sp_plan.profiles.documents import load_documents


def gqa(layers=4):
    return ModelSpec(layers=layers, hidden=4096, heads=32, kv_heads=8, vocab=0)  # llama3-8b's attention


def shape(work, ring=8, layout="contiguous", ulysses=1, algorithm="ring", model=None):
    return Shape(model or gqa(), work, dp=1, ulysses=ulysses, ring=ring, token_layout=layout, algorithm=algorithm)


def sends(steps):
    """(p2p volume per rank over the schedule, how many steps send)."""
    shifts = [(p.nbytes, st.repeat) for st in steps for p in st.phases if isinstance(p, Comm) and p.pattern == "shift"]
    return sum(b * k for b, k in shifts), sum(k for _, k in shifts)


def attention_flops(steps):
    return sum(p.flops * st.repeat for st in steps for p in st.phases
               if isinstance(p, Compute) and p.kind == "attention")


# ---------------------------------------------------------------- the counts the schedules read

@pytest.mark.parametrize("token_layout", BALANCE_POLICIES)
@pytest.mark.parametrize("causal, window", [(True, None), (False, None), (True, 300), (False, 300), (True, 1)])
def test_round_counts_from_runs_are_the_pair_matrix(token_layout, causal, window):
    """layout_rounds (runs of tokens in closed form, striped by residues) equals the token-by-token pair matrix."""
    for cu in draw_packs(load_documents("magi-short"), 8192, 2, 0):
        for P in (2, 5, 8):
            m = pair_matrix(layout_tokens(token_layout, P, cu, causal, window), cu, causal, window)
            r = np.arange(P)
            want = np.stack([m[r, (r - i) % P] for i in range(P)])
            np.testing.assert_array_equal(layout_rounds(token_layout, P, cu, causal, window), want)


# ---------------------------------------------------------------- ring rounds under a mask

@pytest.mark.parametrize("token_layout", TOKEN_LAYOUTS)
@pytest.mark.parametrize("causal", [True, False])
def test_one_document_per_sequence_prices_exactly_as_without_documents(token_layout, causal):
    """A workload whose every sequence is one document runs the mask's path and prices as the plain workload."""
    if token_layout != "contiguous" and not causal:
        pytest.skip("bidirectional rings are contiguous")
    est = [Estimator(load_cluster("dgx-h100", 2), load_model("llama3-8b"), Workload(seq_len="64k", causal=causal, **d))
           for d in ({}, {"documents": [65536]})]
    for cand in (Candidate("ring", ring=16, order=("ring",), token_layout=token_layout),
                 Candidate("usp", ulysses=4, ring=4, order=("ulysses", "ring"), token_layout=token_layout)):
        plain, packed = (e.evaluate(cand).step_time_s for e in est)
        assert packed == pytest.approx(plain, rel=1e-12)


def test_rounds_beyond_a_window_of_s_over_r_carry_no_transfer():
    """Window S/R, contiguous: a query reaches at most the rank before it, so K, V hop once (and dK, dV home once)
    and rounds 2..R-1 neither compute nor send; a window of twice that reaches two ranks back."""
    S, R = 65536, 8
    c = shape(Workload(seq_len=S, window=S // R), ring=R)
    kv_block = S / R * 8 * 128 * 2
    fwd, bwd = ring_steps(c, False), ring_steps(c, True)
    assert sends(fwd) == (2 * kv_block, 1)
    # K, V (bf16) and the fp32 dK, dV accumulators one hop, then the accumulators home
    assert sends(bwd) == (2 * kv_block + 4 * kv_block + 4 * kv_block, 2)
    assert sum(1 for st in fwd for p in st.phases if isinstance(p, Compute) and p.kind == "attention") == 2
    far = ring_steps(shape(Workload(seq_len=S, window=2 * S // R), ring=R), False)
    assert sends(far) == (2 * 2 * kv_block, 2)
    plain = ring_steps(shape(Workload(seq_len=S), ring=R), False)
    assert sends(plain) == (7 * 2 * kv_block, 7)


def test_a_window_pattern_sends_the_far_rounds_for_its_global_layers_only():
    """5:1 over 6 layers: 5 windowed layers stop after the second ring round, the global one goes round the ring; the rounds'
    work is the layers' average."""
    S, R = 65536, 8
    work = Workload(seq_len=S, window={"size": S // R, "pattern": "5:1"})
    mr = masked_rounds(work, "contiguous", R, 6)
    assert mr.sends == (1.0,) + (1 / 6,) * (R - 2) + (0.0,)
    local, glob = ring_round_pairs(work, "contiguous", R, S // R), ring_round_pairs(work, "contiguous", R, None)
    np.testing.assert_allclose(mr.busiest, (5 * np.array(local.busiest) + np.array(glob.busiest)) / 6)


def test_documents_shorter_than_a_chunk_make_the_contiguous_rings_busiest_rounds_costlier_than_balanced():
    """Short documents: contiguous leaves each rank the documents that fall in its chunk (uneven work), and those
    that cross a boundary send K, V a round on; balanced deals them out whole by work."""
    work = Workload(seq_len=65536, documents=[200, 300, 100, 400, 500])  # chunks of 8192 tokens
    contiguous, balanced = (ring_steps(shape(work, layout=t), False) for t in ("contiguous", "balanced"))
    assert attention_flops(contiguous) > 1.05 * attention_flops(balanced)
    assert max(masked_rounds(work, "balanced", 8, 4).busiest[1:]) == 0  # no document is spread: the diagonal ring round alone
    assert sends(balanced) == (0.0, 0)
    assert sends(contiguous)[1] == 1  # a document across a boundary needs the rank before, no further


def test_each_round_costs_its_busiest_rank_averaged_over_the_packs():
    work = Workload(seq_len=16384, documents=load_documents("magi-short"))
    c = shape(work, layout="zigzag")
    rr = ring_round_pairs(work, "zigzag", 8, None)
    assert attention_flops(ring_steps(c, False)) == pytest.approx(4 * sum(rr.busiest) * 32 * 128)
    assert sum(rr.busiest) >= sum(rr.mean) * (1 - 1e-12)


def test_ulysses_alone_attends_the_masks_pairs_over_u():
    """After its all-to-all each rank attends the whole sequence for its H/U heads: the mask's pairs, balanced."""
    m = gqa()
    for extra in ({"documents": load_documents("megatron-dcp")}, {"window": 2048},
                  {"documents": load_documents("magi-short"), "window": 512}):
        work = Workload(seq_len=32768, **extra)
        c = shape(work, ring=1, ulysses=8, algorithm="ulysses", model=m)
        pairs = busiest_rank_pairs(work, "contiguous", 1, extra.get("window")).pairs
        assert attention_flops(usp_steps(c, False)) == pytest.approx(4 * pairs * (32 / 8) * 128)


# ---------------------------------------------------------------- who honours masks

@pytest.mark.parametrize("algorithm", ["wallfacer", "tokenring", "tokenring_ring", "metp"])
def test_the_others_refuse_masks_naming_the_algorithms_that_honour_them(algorithm):
    est = Estimator(load_cluster("dgx-h100", 1), load_model("llama3-8b"),
                    Workload(seq_len="32k", documents=load_documents("magi-short")))
    cand = {"wallfacer": Candidate("wallfacer", ring=8, order=("ring",), team=2, placement="collective_intra"),
            "tokenring": Candidate("tokenring", ring=8, order=("ring",)),
            "tokenring_ring": Candidate("tokenring_ring", ring=8, order=("ring",), team=4),
            "metp": Candidate("metp", tp=8, order=("tp",))}[algorithm]
    with pytest.raises(PlanError) as e:
        est.check(cand)
    assert e.value.field == "workload.documents"
    assert all(name in str(e.value) for name in MASKED_ALGORITHMS)
    with pytest.raises(PlanError) as e:
        Estimator(est.cluster, est.model, Workload(seq_len="32k", window=1024)).check(cand)
    assert e.value.field == "workload.window"
    for d in (Degrees(1, 1, 1, 1, 8), Degrees(1, 1, 8, 1, 1)):
        assert not [v for v in variants(d, est.model, est.work) if v.algorithm == algorithm]
        assert [v for v in variants(d, est.model, Workload(seq_len="32k"))
                if v.algorithm == algorithm] or algorithm not in ("metp", "tokenring") or d.ring == 1 or d.tp == 1


# ---------------------------------------------------------------- all-gather and the policies in the search

def test_allgather_is_registered_with_its_ulysses_hybrid():
    assert "allgather" in ALGORITHMS
    names = [(v.algorithm, d.ulysses) for d in (Degrees(1, 1, 1, 1, 8), Degrees(1, 1, 1, 2, 4), Degrees(1, 1, 1, 8, 1))
             for v in variants(d, gqa(), Workload(seq_len=8192)) if v.algorithm == "allgather"]
    assert names == [("allgather", 1), ("allgather", 2)]
    est = Estimator(load_cluster("dgx-h100", 1), load_model("llama3-8b"), Workload(seq_len="64k"))
    hybrid = Candidate("allgather", ulysses=2, ring=4, order=("ulysses", "ring"), token_layout="zigzag")
    est.check(hybrid)
    names = {r[0] for r in est.evaluate(hybrid, detail=True).rows}
    assert {"ulysses a2a q,k,v", "allgather k,v fwd", "allgather reduce-scatter dk,dv"} <= names


def test_the_search_enumerates_the_balancing_policies_with_documents_only():
    m = load_model("llama3-8b")
    d = Degrees(1, 1, 1, 2, 4)
    assert Space(8, m, Workload(seq_len="64k")).layouts(d) == list(TOKEN_LAYOUTS)
    assert Space(8, m, Workload(seq_len="64k", documents=[4096])).layouts(d) == list(BALANCE_POLICIES)
    assert Space(8, m, Workload(seq_len="64k", causal=False, documents=[4096])).layouts(d) == list(BALANCE_POLICIES)
    assert Space(8, m, Workload(seq_len="64k", documents=[4096])).layouts(Degrees(1, 1, 1, 8, 1)) == ["contiguous"]


def test_the_best_of_each_algorithm_lists_allgather_and_every_policy_with_documents():
    cluster, model = load_cluster("dgx-h100", 1), load_model("llama3-8b")
    work = Workload(seq_len="64k", documents=load_documents("magi-short"))
    res = grid_search(cluster, model, work, keep=3)
    rows = {(c.algorithm, c.token_layout) for _, c in best_per_variant(res.ranked, by_layout=True)}
    assert {("allgather", t) for t in BALANCE_POLICIES} <= rows and {("ring", t) for t in BALANCE_POLICIES} <= rows
    assert {a for a, _ in rows} <= set(MASKED_ALGORITHMS)
    full = grid_search(cluster, model, work, keep=None)
    assert best_per_variant(res.ranked, True) == best_per_variant(full.ranked, True)
    plain = grid_search(cluster, model, Workload(seq_len="64k"), keep=3)
    assert "allgather" in {c.algorithm for _, c in best_per_variant(plain.ranked)}


@pytest.mark.parametrize("token_layout", BALANCE_POLICIES)
def test_on_a_packed_batch_allgather_computes_no_more_than_the_ring_and_exposes_its_gather(token_layout):
    """MagiAttention's setting (H100, CP 8, its short histogram, GQA): the ring's lock-step rounds wait on each round's
    busiest rank, whose sum is at least the busiest rank's whole work, which all-gather computes in one call; the
    all-gather's price over it is its exposed gather and reduce-scatter."""
    est = Estimator(load_cluster("dgx-h100", 1), load_model("llama3-8b"),
                    Workload(seq_len="64k", documents=load_documents("magi-short")))
    rows = {a: {r[0]: r[5] for r in est.evaluate(Candidate(a, ring=8, order=("ring",), token_layout=token_layout),
                                                   detail=True).rows} for a in ("allgather", "ring")}
    for part in ("attention fwd", "attention bwd"):
        assert rows["allgather"][part] <= rows["ring"][part]
    assert rows["allgather"]["allgather k,v fwd"] > 0 and rows["ring"]["ring p2p fwd"] == 0  # hidden by the rounds


def test_past_the_counting_bound_zigzag_and_balanced_rounds_are_taken_as_even(monkeypatch):
    """Where counting a layout's rounds would cost more than ROUND_CELLS, each rank's exact work is spread evenly
    over its rounds: the ranks' totals stay exact, every round its busiest rank's share."""
    from sp_plan.planner.masks import rounds
    cu = draw_packs(load_documents("magi-short"), 8192, 1, 0)[0]
    exact = layout_rounds("zigzag", 8, cu)
    monkeypatch.setattr(rounds, "ROUND_CELLS", 1)  # where layout_rounds reads it
    even = layout_rounds("zigzag", 8, cu)
    np.testing.assert_allclose(even.sum(axis=0), exact.sum(axis=0))
    np.testing.assert_allclose(even, np.tile(exact.sum(axis=0) / 8, (8, 1)))
