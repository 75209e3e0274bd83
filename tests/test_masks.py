"""Attention work of a mask (planner/masks/) and the token layouts of sequences with documents (planner/layout.py):
exact counts against a dense mask, layouts that are permutations, work that no layout changes, the balancer."""
import numpy as np
import pytest

from sp_plan.planner import PlanError
from sp_plan.planner.documents import draw_packs, pack
from sp_plan.planner.layout import (BALANCE_POLICIES, BALANCED_TOKEN_BOUND, TOKEN_LAYOUTS, Layout,
                                    document_ring_tokens, document_sp_tokens, ring_tokens)
from sp_plan.planner.masks import (PACK_SAMPLES, busiest_rank_pairs, causal_pairs, causal_window_pairs,
                                   document_pairs, full_pairs, full_window_pairs, imbalance, layer_windows,
                                   layout_pairs, layout_tokens, mask_pairs, pair_matrix, rank_pairs, ring_round_pairs,
                                   row_pairs, sample_rank_work)
from sp_plan.planner.model import Workload
from sp_plan.profiles.documents import load_documents


def dense_mask(cu, causal: bool, window: int | None) -> np.ndarray:
    """(S, S) bool: query i sees key j (same document, causal, within the window), built entry by entry."""
    S = int(cu[-1])
    doc = np.repeat(np.arange(len(cu) - 1), np.diff(cu))
    i, j = np.arange(S)[:, None], np.arange(S)[None, :]
    m = doc[:, None] == doc[None, :]
    if causal:
        m &= j <= i
    if window is not None:
        m &= np.abs(i - j) < window
    return m


MASKS = [(c, w) for c in (True, False) for w in (None, 1, 2, 5, 64)]


# ---------------------------------------------------------------- exact counts

@pytest.mark.parametrize("L", [1, 2, 3, 7, 16, 33])
@pytest.mark.parametrize("causal, window", MASKS)
def test_each_closed_form_counts_the_dense_mask(L, causal, window):
    assert document_pairs(L, causal, window) == dense_mask(np.array([0, L]), causal, window).sum()


def test_the_closed_forms_are_the_papers_counts():
    assert causal_pairs(1024) == 1024 * 1025 // 2 and full_pairs(1024) == 1024 ** 2
    assert causal_window_pairs(10_000, 4096) == 10_000 * 4096 - 4096 * 4095 // 2  # about L W
    assert causal_window_pairs(100, 4096) == causal_pairs(100)  # a window past the document: full causal
    assert full_window_pairs(100, 4096) == full_pairs(100)
    assert full_window_pairs(10, 1) == 10 and causal_window_pairs(10, 1) == 10  # W = 1: each token itself


def test_closed_forms_take_arrays_and_stay_exact_for_long_documents():
    L = np.array([1, 5, 300_000])
    assert document_pairs(L, True, 8192).tolist() == [causal_window_pairs(int(x), 8192) for x in L]
    assert causal_pairs(2 ** 40) == 2 ** 40 * (2 ** 40 + 1) // 2  # Python ints: no overflow


@pytest.mark.parametrize("causal, window", MASKS)
def test_row_pairs_and_mask_pairs_count_the_dense_mask(causal, window):
    cu = np.array([0, 3, 4, 20, 31, 40])
    m = dense_mask(cu, causal, window)
    assert row_pairs(cu, causal, window).tolist() == m.sum(axis=1).tolist()
    assert mask_pairs(cu, causal, window) == m.sum()


@pytest.mark.parametrize("causal, window", MASKS)
@pytest.mark.parametrize("token_layout", BALANCE_POLICIES)
def test_pair_matrix_counts_the_dense_mask_between_ranks(token_layout, causal, window):
    cu = np.array([0, 3, 4, 20, 31, 40])
    tokens = layout_tokens(token_layout, 4, cu, causal, window)
    m = dense_mask(cu, causal, window)
    want = np.array([[m[np.ix_(q, k)].sum() for k in tokens] for q in tokens])
    got = pair_matrix(tokens, cu, causal, window)
    assert got.tolist() == want.tolist()
    assert got.sum(axis=1).tolist() == rank_pairs(tokens, cu, causal, window).tolist()


def test_documents_cut_the_work_and_a_window_cuts_it_again():
    one, packed = np.array([0, 8192]), np.array([0, 1024, 3072, 8192])
    assert mask_pairs(packed) < mask_pairs(one)
    assert mask_pairs(packed, window=512) < mask_pairs(packed)
    assert mask_pairs(one, window=8192) == mask_pairs(one)


# ---------------------------------------------------------------- layouts of sequences with documents

@pytest.mark.parametrize("token_layout", TOKEN_LAYOUTS)
@pytest.mark.parametrize("ring, seq_len", [(2, 16), (4, 32), (8, 1024)])
def test_one_document_is_laid_out_as_today(token_layout, ring, seq_len):
    got = document_ring_tokens(token_layout, ring, [0, seq_len])
    assert [t.tolist() for t in got] == ring_tokens(token_layout, ring, seq_len).tolist()


@pytest.mark.parametrize("token_layout", TOKEN_LAYOUTS)
def test_layout_document_tokens_match_layout_tokens_on_one_document(token_layout):
    lay = Layout({"ulysses": 2, "ring": 4, "dp": 2}, ("ulysses", "ring", "dp"), token_layout)
    for rank in range(16):
        assert lay.document_tokens(rank, [0, 64]).tolist() == lay.tokens(rank, 64).tolist()
    assert lay.document_permutation([0, 64]).tolist() == lay.sequence_permutation(64).tolist()


def _packs(seeds=range(6), seq_len=16384, name="magi-short"):
    return [draw_packs(load_documents(name), seq_len, 1, s)[0] for s in seeds]


@pytest.mark.parametrize("token_layout", BALANCE_POLICIES)
@pytest.mark.parametrize("ring", [2, 3, 8])
def test_every_policy_is_a_permutation_with_bounded_local_lengths(token_layout, ring):
    for cu in _packs(range(3), seq_len=4099) + [np.array([0, 1, 2, 3, 4099]), np.array([0, 4099])]:
        tokens = layout_tokens(token_layout, ring, cu)
        assert np.array_equal(np.sort(np.concatenate(tokens)), np.arange(4099))
        assert all(np.all(np.diff(t) > 0) for t in tokens)  # local order is token order
        n = [len(t) for t in tokens]
        if token_layout == "balanced":
            assert max(n) <= max(-(-4099 // ring), int(BALANCED_TOKEN_BOUND * 4099 / ring))
        else:
            assert max(n) - min(n) <= 1


def _is_subsequence(runs: list[int], pattern: list[int]) -> bool:
    it = iter(pattern)
    return all(any(x == y for y in it) for x in runs)


def test_zigzag_per_document_needs_no_padding_and_keeps_each_documents_zigzag():
    """Rank r holds chunks r and 2P-1-r of every document, whatever its length (no multiple of 2P)."""
    cu, P = np.array([0, 5, 6, 23, 100]), 4
    owner = np.empty(100, dtype=int)
    for r, t in enumerate(document_ring_tokens("zigzag", P, cu)):
        owner[t] = r
    zigzag = list(range(P)) + list(range(P - 2, -1, -1))  # chunks' ranks 0..P-1, P-1..0; the middle two are one run
    for start, end in zip(cu[:-1], cu[1:]):
        o = owner[start:end]
        runs = [int(o[0])] + [int(b) for a, b in zip(o, o[1:]) if a != b]
        assert _is_subsequence(runs, zigzag), (start, runs)
    assert [int(x) for x in dict.fromkeys(owner[23:100])] == [0, 1, 2, 3]  # 77 tokens: every chunk non-empty
    runs = [int(owner[23])] + [int(b) for a, b in zip(owner[23:99], owner[24:100]) if a != b]
    assert runs == zigzag
    counts = np.bincount(owner[23:100], minlength=P)
    assert counts.max() - counts.min() <= 1


@pytest.mark.parametrize("token_layout", BALANCE_POLICIES)
@pytest.mark.parametrize("causal, window", [(True, None), (True, 512), (False, None), (False, 300)])
def test_work_sums_are_the_same_under_every_layout(token_layout, causal, window):
    for cu in _packs(range(3), seq_len=8192):
        assert layout_pairs(token_layout, 8, cu, causal, window).sum() == mask_pairs(cu, causal, window)


@pytest.mark.parametrize("seq_len, ring", [(16384, 8), (32768, 8), (16384, 4), (65536, 16)])
def test_balanced_is_never_busier_than_contiguous_on_magi_short(seq_len, ring):
    for cu in _packs(range(12), seq_len=seq_len):
        assert layout_pairs("balanced", ring, cu).max() <= layout_pairs("contiguous", ring, cu).max()


def test_the_policies_balance_magi_short_packs_where_contiguous_does_not():
    cus = _packs(range(8), seq_len=32768)
    mean = {t: np.mean([imbalance(layout_pairs(t, 8, cu)) for cu in cus]) for t in BALANCE_POLICIES}
    assert mean["contiguous"] > 1.5
    assert mean["zigzag"] < 1.01 and mean["striped"] < 1.01 and mean["balanced"] < 1.05


def test_balanced_keeps_short_documents_whole():
    cu = np.array([0] + list(np.cumsum([100] * 40 + [4000])))  # 40 short documents and one long
    tokens = layout_tokens("balanced", 4, cu)
    owner = np.empty(int(cu[-1]), dtype=int)
    for r, t in enumerate(tokens):
        owner[t] = r
    whole = sum(len(set(owner[a:b])) == 1 for a, b in zip(cu[:-2], cu[1:-1]))
    assert whole == 40 and len(set(owner[cu[-2]:])) == 4  # the long one in zigzag pairs on every rank


def test_balanced_needs_no_length_divisible_by_its_ranks():
    from sp_plan.planner.layout import chunks_needed
    assert chunks_needed("balanced", 8, 2) == 1 and chunks_needed("zigzag", 8, 2) == 32


def test_balanced_needs_documents_and_weights():
    with pytest.raises(PlanError, match="cu_seqlens") as e:
        Layout({"ring": 4}, ("ring",), "balanced").tokens(0, 64)
    assert e.value.field == "token_layout"
    with pytest.raises(PlanError, match="work"):
        document_ring_tokens("balanced", 4, [0, 64])
    with pytest.raises(PlanError, match="unknown layout"):
        Layout({"ring": 4}, ("ring",), "spiral")
    with pytest.raises(PlanError, match="cu_seqlens"):
        document_ring_tokens("zigzag", 4, [0, 5, 4, 9])


def test_ulysses_pieces_of_a_ring_rank_are_its_tokens_in_order():
    cu = pack([7, 30, 3, 60], 100, 1)[0]
    w = row_pairs(cu)
    for policy in BALANCE_POLICIES:
        rt = document_ring_tokens(policy, 4, cu, w)
        sp = document_sp_tokens(policy, 3, 4, cu, w)
        assert all(np.array_equal(np.concatenate(sp[r]), rt[r]) for r in range(4))


# ---------------------------------------------------------------- what a schedule prices

def test_busiest_rank_without_documents_is_the_layouts_closed_form():
    S, P = 4096, 8
    c = S // P
    w = Workload(seq_len=S)
    contiguous = busiest_rank_pairs(w, "contiguous", P)
    assert contiguous.samples == 1 and contiguous.pairs == causal_pairs(S)
    assert contiguous.busiest == c * (S - c) + causal_pairs(c)  # the last rank: every earlier key, its own diagonal
    zigzag = busiest_rank_pairs(w, "zigzag", P)
    h = c // 2  # rank r: chunks r and 2P-1-r; rank P-1's pair the last of the first half with the first of the second
    assert zigzag.busiest == max(causal_pairs(h) + r * h * h + causal_pairs(h) + (2 * P - 1 - r) * h * h
                                 for r in range(P))
    assert zigzag.imbalance == pytest.approx(1.0, abs=1e-3) and contiguous.imbalance > 1.8


def test_busiest_rank_with_documents_is_the_mean_over_seeded_packs():
    w = Workload(seq_len=16384, documents=load_documents("magi-short"), seed=3)
    got = busiest_rank_pairs(w, "contiguous", 8)
    packs = draw_packs(w.documents, 16384, PACK_SAMPLES, 3)
    assert got.samples == PACK_SAMPLES
    assert got.busiest == pytest.approx(np.mean([layout_pairs("contiguous", 8, cu).max() for cu in packs]))
    assert got.pairs == pytest.approx(np.mean([mask_pairs(cu) for cu in packs]))
    assert got.imbalance == pytest.approx(got.busiest * 8 / got.pairs, rel=1e-12) and got.imbalance > 1
    assert busiest_rank_pairs(w, "zigzag", 8).busiest < got.busiest
    assert busiest_rank_pairs(w, "zigzag", 8, window=256).busiest < busiest_rank_pairs(w, "zigzag", 8).busiest


def test_layer_windows_split_the_layers_by_the_pattern():
    assert layer_windows(Workload(seq_len=8192), 32) == ((None, 32),)
    assert layer_windows(Workload(seq_len=8192, window=4096), 32) == ((4096, 32),)
    assert layer_windows(Workload(seq_len=8192, window={"size": 1024, "pattern": "5:1"}), 62) == ((1024, 52),
                                                                                                  (None, 10))


# ---------------------------------------------------------------- ring rounds under a mask

@pytest.mark.parametrize("token_layout", TOKEN_LAYOUTS)
def test_ring_rounds_of_one_document_are_todays_causal_work(token_layout):
    """Without documents, the pair matrix is layout.causal_work's block fractions of c^2, and a round's busiest
    rank is layout.round_work's."""
    from sp_plan.planner.layout import causal_work, round_work
    S, P = 256, 4
    c = S // P
    m = pair_matrix(document_ring_tokens(token_layout, P, [0, S]), [0, S])
    np.testing.assert_allclose(m / c ** 2, causal_work(token_layout, P, S))
    got = ring_round_pairs(Workload(seq_len=S), token_layout, P)
    np.testing.assert_allclose(np.array(got.busiest) / c ** 2, round_work(token_layout, P, S, True))
    assert got.samples == 1 and sum(got.mean) * P == causal_pairs(S)


def test_a_window_empties_the_far_rounds_of_a_contiguous_ring():
    S, P = 8192, 8  # 1024 tokens per rank: a window of 1024 reaches only the rank before
    got = ring_round_pairs(Workload(seq_len=S), "contiguous", P, window=1024)
    assert got.empty == (0.0, 0.0) + (1.0,) * (P - 2)
    # zigzag's chunks of 512: rank r's chunk r sees ranks r-1, r-2; its chunk 2P-1-r sees ranks r+1, r+2
    assert ring_round_pairs(Workload(seq_len=S), "zigzag", P, window=1024).empty == (0.0,) * 3 + (1.0,) * 3 + (0.0,) * 2


def test_documents_leave_rounds_idle_on_a_contiguous_ring_and_balanced_rounds_on_zigzag():
    w = Workload(seq_len=16384, documents=load_documents("magi-short"))
    contiguous, zigzag = ring_round_pairs(w, "contiguous", 8), ring_round_pairs(w, "zigzag", 8)
    assert sum(contiguous.busiest) > 1.5 * sum(zigzag.busiest)  # the ring waits on its busiest rank each round
    assert sum(zigzag.busiest) / sum(zigzag.mean) < 1.05
    assert sum(contiguous.empty) > 0 and sum(zigzag.empty) == 0


def test_a_sample_packs_rank_work_for_show():
    w = Workload(seq_len=16384, documents=load_documents("megatron-dcp"), seed=2)
    s = sample_rank_work(w, "balanced", 8, sample=1)
    assert s.tokens.sum() == 16384 and s.pairs.sum() == mask_pairs(s.cu_seqlens)
    assert np.array_equal(s.cu_seqlens, draw_packs(w.documents, 16384, 2, 2)[1])
    assert s.tokens.max() <= 1.1 * 16384 / 8


# ---------------------------------------------------------------- closed forms against the per-token counts

ODD_PACKS = [np.array([0, 4099]), np.array([0, 1, 2, 3, 4099]), np.array([0, 7, 300, 301, 1025, 2047, 4099]),
             np.array([0, 13])]
WINDOWS = [None, 1, 5, 1000, 5000]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", WINDOWS)
def test_prefix_pairs_is_the_running_sum_of_each_documents_rows(causal, window):
    from sp_plan.planner.masks import prefix_pairs, work_before
    for cu in ODD_PACKS:
        rows = row_pairs(cu, causal, window)
        for s, e in zip(cu[:-1], cu[1:]):
            n = np.arange(e - s + 1)
            want = np.concatenate([[0], np.cumsum(rows[s:e])])
            assert prefix_pairs(n, e - s, causal, window).tolist() == want.tolist()
            assert [prefix_pairs(int(x), int(e - s), causal, window) for x in (0, 1, e - s)] == want[[0, 1, -1]].tolist()
        x = np.arange(int(cu[-1]) + 1)
        assert work_before(cu, causal, window)(x).tolist() == np.concatenate([[0], np.cumsum(rows)]).tolist()


@pytest.mark.parametrize("token_layout", BALANCE_POLICIES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("ring", [1, 2, 3, 8, 64])
def test_each_ranks_work_in_closed_form_is_its_per_token_count(token_layout, causal, window, ring):
    """layout_pairs (runs in closed form; striped by strided sums) equals the per-token rank_pairs."""
    for cu in ODD_PACKS + _packs(range(2), seq_len=4099):
        tokens = layout_tokens(token_layout, ring, cu, causal, window)
        want = rank_pairs(tokens, cu, causal, window)
        assert layout_pairs(token_layout, ring, cu, causal, window).tolist() == want.tolist()


@pytest.mark.parametrize("ring", [1, 2, 3, 8, 16])
def test_the_balancer_from_closed_form_work_places_as_from_per_token_weights(ring):
    from sp_plan.planner.layout import document_runs, owner_runs, document_owners
    from sp_plan.planner.masks import work_before
    for cu in ODD_PACKS + _packs(range(3), seq_len=16384) + _packs(range(2), 16384, "megatron-dcp"):
        for causal, window in [(True, None), (False, None), (True, 300), (False, 3)]:
            per_token = owner_runs(document_owners("balanced", ring, cu, row_pairs(cu, causal, window)), cu)
            closed = document_runs("balanced", ring, cu, work_before=work_before(cu, causal, window))
            assert all(np.array_equal(a, b) for a, b in zip(per_token, closed))


@pytest.mark.parametrize("token_layout", ["contiguous", "zigzag", "balanced"])
@pytest.mark.parametrize("ring", [1, 2, 3, 5, 8, 16])
def test_causal_rounds_from_the_layouts_chunks_are_the_pair_matrix(token_layout, ring):
    """causal_layout_matrix (pairs of runs; zigzag chunks by matrix products) equals the token-by-token count."""
    from sp_plan.planner.masks import causal_layout_matrix
    for cu in ODD_PACKS + _packs(range(2), seq_len=8192) + _packs(range(2), 8192, "magi-long"):
        want = pair_matrix(layout_tokens(token_layout, ring, cu), cu)
        assert causal_layout_matrix(token_layout, ring, cu).tolist() == want.tolist()


@pytest.mark.parametrize("token_layout", BALANCE_POLICIES)
@pytest.mark.parametrize("causal, window", [(True, None), (False, None), (True, 300)])
def test_round_stats_are_the_rounds_max_and_mean(token_layout, causal, window):
    from sp_plan.planner.masks import layout_rounds, round_stats
    for cu in ODD_PACKS[:3] + _packs(range(2), seq_len=8192):
        for ring in (1, 2, 6, 8):
            rounds = layout_rounds(token_layout, ring, cu, causal, window)
            r = np.arange(ring)
            m = pair_matrix(layout_tokens(token_layout, ring, cu, causal, window), cu, causal, window)
            assert rounds.tolist() == m[r[None, :], (r[None, :] - r[:, None]) % ring].tolist()
            hi, mean = round_stats(token_layout, ring, cu, causal, window)
            assert hi.tolist() == rounds.max(axis=1).tolist() and mean.tolist() == rounds.mean(axis=1).tolist()


def test_a_window_over_the_whole_sequence_counts_the_flops_of_no_window():
    """MFU's masked count holds a mask to full attention: the exact causal S(S+1)/2 of a covering window is the
    papers' S^2/2, so the masked MFU is never above the full-causal one."""
    from sp_plan.planner.estimate import Estimator
    from sp_plan.profiles import load_cluster, load_model

    c, m = load_cluster("cpu-local"), load_model("tiny-llama")
    plain = Estimator(c, m, Workload(seq_len=4096)).model_flops()
    covered = Estimator(c, m, Workload(seq_len=4096, window={"size": 8192})).model_flops(mask=True)
    assert covered == plain


@pytest.mark.parametrize("plan, documents", [
    ({"algorithm": "ulysses", "degrees": {"ulysses": 8}}, None),
    ({"algorithm": "ring", "degrees": {"ring": 8}, "token_layout": "zigzag"}, None),
    ({"algorithm": "usp", "degrees": {"ulysses": 4, "ring": 2}, "token_layout": "balanced",
      "workload": {"seq_len": 4096, "documents": [512, 3000, 70]}}, [512, 3000, 70]),
    ({"algorithm": "wallfacer", "degrees": {"ring": 8, "team": 2}}, None),  # refuses windows; covering is none
])
def test_a_window_covering_every_document_is_priced_as_none(plan, documents):
    """The planner prices a window covering every document as full attention (as the runtime runs it), for every
    algorithm, those that refuse windows included."""
    from sp_plan.pipeline import estimate

    def step(window):
        return estimate(plan, "dgx-h100", "llama3-8b", {"seq_len": 4096}, documents=documents,
                        window=window).step_time_s

    longest = 4096 if documents is None else max(documents)
    assert step(longest) == step(10 * longest) == step(None) < float("inf")
    if plan["algorithm"] != "wallfacer":
        assert step(longest // 32) != step(None)  # a window that masks is priced as one
