"""Striped runs cut into a window's pieces, counted from the documents' periods (window_forms.striped_cut_tiles):
the same integers as the explicit count over the pieces (sorted starts and ends, two binary searches), over random
packs, rings from 2 to more ranks than tokens, windows from 1 to 4096, causal and bidirectional."""
import numpy as np
import pytest

from sp_plan.planner import masks, window_forms
from sp_plan.planner.documents import draw_packs
from sp_plan.profiles.documents import load_documents


def _packs() -> list[np.ndarray]:
    """Random packs (documents shorter than a ring, documents over many periods), single documents and magi-long
    packs."""
    rng = np.random.default_rng(23)
    out = [np.array([0, 1]), np.array([0, 3]), np.array([0, 5000]), np.array([0, 1, 2, 9000])]
    for _ in range(14):
        S = int(rng.integers(2, 12000))
        cuts = rng.choice(np.arange(1, S), size=min(int(rng.integers(0, 12)), S - 1), replace=False)
        out.append(np.concatenate([[0], np.sort(cuts), [S]]).astype(np.int64))
    out += [draw_packs(load_documents("magi-long"), 1 << 16, 1, seed)[0] for seed in range(2)]
    return out


def _pieces(ring: int, cu: np.ndarray, causal: bool, window: int, c: int):
    """The striped pieces of c tokens (every ring-th) as ``pack_tiles`` cuts them, and their reach [lo, hi]."""
    first, last, step, n, rank, doc = masks.tile_runs("striped", ring, cu, causal, window)
    if c < n.max():
        first, last, n, rank, doc = masks._pieces(first, last, step, n, rank, doc, c)
    lo = np.maximum(cu[doc], first - window + 1)
    hi = last if causal else np.minimum(cu[doc + 1] - 1, last + window - 1)
    return first, last, n, lo, hi


def _explicit(ring: int, cu: np.ndarray, causal: bool, window: int, c: int) -> tuple[int, int, int]:
    """(pairs of pieces whose tokens meet a query piece's reach; the candidates' lower bound as
    ``striped_reach_tiles`` reads it: its document's pieces starting in [lo - span, hi]; the longest piece's span):
    every pair, by sorting and binary searches."""
    first, last, n, lo, hi = _pieces(ring, cu, causal, window, c)
    f, g = np.sort(first), np.sort(last)
    span = ring * (int(n.max()) - 1)
    every = int((np.searchsorted(f, hi, side="right") - np.searchsorted(g, lo)).sum())
    own = np.maximum(lo - span, cu[np.searchsorted(cu, first, side="right") - 1])  # the query's document's
    bound = int((np.searchsorted(f, hi, side="right") - np.searchsorted(f, own)).sum())
    return every, bound, span


@pytest.mark.parametrize("causal", [True, False])
def test_periods_count_the_pieces_pairs(causal):
    """The periods' count against the pieces', at the window's piece size and at random ones; the candidates'
    bound decides None exactly where the pieces' does."""
    rng = np.random.default_rng(5 + causal)
    checked = 0
    for cu in _packs():
        for ring in (2, 3, 64, 513, 20000):
            for window in (1, 9, 100, 4096):
                for c in {min(max(-(-window // ring), masks.MIN_TILE), int(cu[-1])), int(rng.integers(1, 40))}:
                    every, bound, span = _explicit(ring, cu, causal, window, c)
                    got = window_forms.striped_cut_tiles(cu, ring, c, window, causal, span, -1)
                    assert got == every, (cu[:4], ring, window, c)
                    assert window_forms.striped_cut_tiles(cu, ring, c, window, causal, span, bound) is None
                    assert window_forms.striped_cut_tiles(cu, ring, c, window, causal, span, bound - 1) == every
                    checked += 1
    assert checked > 500


@pytest.mark.parametrize("causal", [True, False])
def test_pack_tiles_of_cut_striped_runs_is_the_explicit_count(causal):
    """``pack_tiles`` of striped packs whose runs the window cuts: the pairs in reach where the window spans a
    stride, and within the candidates' limit the pairs the window connects (``_strided_pairs_tiles``)."""
    cut_runs = 0
    for cu in _packs()[:-1]:  # one magi-long pack: its pairs counted pair by pair take the most time
        for ring in (2, 5, 700):
            for window in (1, 50, 600, 4096):
                c = min(max(-(-window // ring), masks.MIN_TILE), int(cu[-1]))
                if -(-int(np.diff(cu).max()) // ring) <= c:
                    continue  # no run cut: ``_striped_window_tiles``
                cut_runs += 1
                got = masks.pack_tiles("striped", ring, cu, causal, window)[0]
                first, last, n, lo, hi = _pieces(ring, cu, causal, window, c)
                every, bound, _ = _explicit(ring, cu, causal, window, c)
                limit = masks._striped_limit(ring, causal, window)
                if limit < 0 or bound > limit:
                    assert got == every, (cu[:4], ring, window)
                else:  # these packs' candidates are all within ROUND_CELLS
                    assert got == masks._strided_pairs_tiles(first, last, n, lo, hi, ring, causal, window, 1 << 62)
    assert cut_runs > 50


@pytest.mark.parametrize("causal", [True, False])
def test_pack_tiles_past_the_limit_without_runs_is_the_runs_count(causal):
    """Striped under a window, counted without its runs (``_striped_cut_pack``): the same tiles as the pieces', the
    same entries, and the same float entries over length as the runs' cells summed in their order."""
    counted = 0
    for cu in _packs():
        L = np.diff(cu)
        for ring in (2, 3, 64, 513, 20000):
            first, last, step, n, rank, doc = masks.tile_runs("striped", ring, cu, causal, 1)
            sizes, owner = masks._document_rank_sizes(doc, rank, n, len(L), ring)
            roots = np.bincount(owner, weights=np.sqrt(sizes), minlength=len(L))
            assert masks._striped_rank_roots(cu, ring).tolist() == roots.tolist()
            for window in (1, 9, 100, 4096):
                pairs = masks.document_pairs(L, causal, window)
                got = masks._striped_cut_pack(ring, cu, causal, window, pairs)
                if got is None:
                    continue
                counted += 1
                c = min(max(-(-window // ring), masks.MIN_TILE), int(cu[-1]))
                per_length = np.maximum(pairs * roots ** 2 / (L.astype(np.float64) ** 2), pairs / c).sum()
                assert got == (_explicit(ring, cu, causal, window, c)[0], int(pairs.sum()), float(per_length))
    assert counted > 100
