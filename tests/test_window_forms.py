"""Zigzag-chunked documents' tiles under a window in closed form (planner/window_forms.py): the blocks are the
layout's merged runs, the floor sums count what a sort and binary searches of the runs count, and ``pack_tiles``
gives the same integers as the explicit count over random packs, rings and windows, causal and not."""
import numpy as np
import pytest

from sp_plan.planner import masks, window_forms
from sp_plan.planner.documents import draw_packs
from sp_plan.planner.layout import balanced_parts
from sp_plan.planner.window_forms import block_tiles, chunk_blocks, floor_sum, spread_blocks, zigzag_blocks
from sp_plan.profiles.documents import load_documents


def _packs() -> list[np.ndarray]:
    """Random packs: documents shorter than a rank's chunk, documents spanning many ranks, a single document."""
    rng = np.random.default_rng(11)
    out = [np.array([0, 1]), np.array([0, 5000]), np.array([0, 1, 2, 9000]), np.array([0, 7, 4000, 4095, 12289])]
    for _ in range(12):
        S = int(rng.integers(20, 6000))
        cuts = rng.choice(np.arange(1, S), size=min(int(rng.integers(0, 9)), S - 1), replace=False)
        out.append(np.concatenate([[0], np.sort(cuts), [S]]).astype(np.int64))
    out += [draw_packs(load_documents("magi-long"), 65536, 1, seed)[0] for seed in range(2)]
    return out


def _explicit_tiles(layout: str, ring: int, cu: np.ndarray, causal: bool, window: int) -> int:
    """Tiles as the runs give them: every run (cut into the window's pieces) against each run meeting its reach,
    by sorting the runs and two binary searches."""
    first, last, step, n, rank, doc = masks.tile_runs(layout, ring, cu, causal, window)
    cut = min(max(window, masks.MIN_TILE), int(cu[-1]))
    if cut < n.max():
        first, last, n, rank, doc = masks._pieces(first, last, step, n, rank, doc, cut)
    lo = np.maximum(cu[doc], first - window + 1)
    hi = last if causal else np.minimum(cu[doc + 1] - 1, last + window - 1)
    return int((np.searchsorted(np.sort(first), hi, side="right") - np.searchsorted(np.sort(last), lo)).sum())


def test_floor_sum_is_the_sum_of_its_floors():
    rng = np.random.default_rng(0)
    n, m, a, b = rng.integers(0, 40, 3000), rng.integers(1, 25, 3000), rng.integers(0, 60, 3000), rng.integers(0, 60, 3000)
    expect = [sum((ai * t + bi) // mi for t in range(ni)) for ni, mi, ai, bi in zip(n, m, a, b)]
    assert floor_sum(n, m, a, b).tolist() == expect


@pytest.mark.parametrize("causal", [True, False])
def test_block_tiles_count_every_pair_of_runs_in_reach(causal):
    """Random blocks of equal runs: the floor sums against a run-by-run count."""
    rng = np.random.default_rng(1)
    for _ in range(300):
        n, s = rng.integers(0, 6, (2, 5)), rng.integers(1, 7, (2, 5))
        F, W = np.cumsum(n * s, axis=1) - n * s, int(rng.integers(1, 40))
        expect = 0
        for d in range(2):
            f = np.concatenate([F[d, k] + s[d, k] * np.arange(n[d, k]) for k in range(5)])
            last = np.concatenate([F[d, k] + s[d, k] * np.arange(1, n[d, k] + 1) - 1 for k in range(5)])
            hi = last if causal else last + W - 1
            expect += int(((f[None, :] <= hi[:, None]) & (last[None, :] >= f[:, None] - W + 1)).sum())
        assert block_tiles(F, n, s, W, causal) == expect


def _block_sizes(F, n, s) -> list[list[int]]:
    """Each document's run sizes in token order, from its blocks."""
    return [np.repeat(s[d], n[d]).tolist() for d in range(len(F))]


def _run_sizes(runs, cu: np.ndarray, docs) -> list[list[int]]:
    """Each of ``docs``' merged run sizes in token order (``masks._merged``)."""
    start, stop, rank = runs
    o = np.argsort(start, kind="stable")
    start, stop, rank, doc = masks._merged(start[o], stop[o], rank[o], masks.run_documents(start[o], cu))
    return [(stop - start)[doc == d].tolist() for d in docs]


@pytest.mark.parametrize("ring", [2, 3, 5, 16, 64, 1000, 4096])
def test_blocks_are_the_layouts_merged_runs(ring):
    """zigzag's and the balancer's spread documents' blocks hold their merged runs, in token order."""
    for cu in _packs():
        L = np.diff(cu)
        F, n, s = zigzag_blocks(cu, ring)
        assert (F[:, -1] + n[:, -1] * s[:, -1]).tolist() == L.tolist()
        assert _block_sizes(F, n, s) == _run_sizes(masks.layout_runs("zigzag", ring, cu), cu, range(len(L)))
        spread, placed = balanced_parts(cu, ring, masks.work_before(cu, True, 64))
        if len(spread):
            from sp_plan.planner.layout import parts_runs
            runs = parts_runs(cu, ring, (spread, placed))
            assert _block_sizes(*spread_blocks(L[spread], ring)) == _run_sizes(runs, cu, spread)


def test_blocks_without_extras_or_with_a_wrap():
    """Documents of exactly 2P q tokens (no extras), and extras wrapping round the ring."""
    P = 6
    L = np.array([24, 29, 5, 11])
    q, rem = np.divmod(L, 2 * P)
    a = np.array([0, 4, 3, 5])
    F, n, s = chunk_blocks(L, q, np.minimum(rem, P), a, np.maximum(rem - P, 0), a, P)
    assert (n * s).sum(axis=1).tolist() == L.tolist()
    assert (n[q > 0].sum(axis=1) == 2 * P - 1).all()


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("layout", ["zigzag", "balanced"])
def test_pack_tiles_under_a_window_is_the_explicit_count(layout, causal):
    """Tiles, entries and entries over length as the runs give them, at rings from 2 to more ranks than tokens."""
    for cu in _packs():
        for ring in (2, 3, 7, 64, 1000, 4096):
            for window in (1, 3, 16, 100, 4096):
                runs = masks.layout_runs(layout, ring, cu, causal, window)
                got = masks.pack_tiles(layout, ring, cu, causal, window, runs=runs)
                assert got[0] == _explicit_tiles(layout, ring, cu, causal, window), (cu[:4], ring, window)
                assert got[1] == masks.mask_pairs(cu, causal, window)
                parts = masks.layout_runs(layout, ring, cu, causal, window)
                first, last, step, k, rank, doc = masks.tile_runs(layout, ring, cu, causal, window, parts)
                sizes, owner = masks._document_rank_sizes(doc, rank, k, len(cu) - 1, ring)
                L = np.diff(cu).astype(np.float64)
                pairs = masks.document_pairs(np.diff(cu), causal, window)
                roots = np.bincount(owner, weights=np.sqrt(sizes), minlength=len(L))
                cut = min(max(window, masks.MIN_TILE), int(cu[-1]))
                per_length = np.maximum(pairs * roots ** 2 / L ** 2, pairs / cut).sum()
                assert got[2] == pytest.approx(per_length, rel=1e-11)


def test_reach_tiles_counts_alike_either_way():
    """Disjoint runs in token order: the running count of run ends and the binary searches agree."""
    rng = np.random.default_rng(4)
    for _ in range(50):
        n = rng.integers(1, 9, 200)
        first = np.cumsum(n) - n
        last = first + n - 1
        lo = np.maximum(0, first - int(rng.integers(1, 30)) + 1)
        S = int(n.sum())
        searched = int((np.searchsorted(first, last, side="right") - np.searchsorted(last, lo)).sum())
        assert masks._reach_tiles(first, last, lo, last, True, S) == searched
        assert masks._reach_tiles(first, last, lo, last, False, S) == searched


def _striped_pieces(ring: int, cu: np.ndarray, causal: bool, window: int):
    """Striped pieces under a window as ``pack_tiles`` cuts them, their reach, and the candidate pairs
    ``masks._strided_pairs_tiles`` would enumerate (pieces starting in [lo - the longest span, hi])."""
    first, last, step, n, rank, doc = masks.tile_runs("striped", ring, cu, causal, window)
    cut = min(max(-(-window // ring), masks.MIN_TILE), int(cu[-1]))
    if cut < n.max():
        first, last, n, rank, doc = masks._pieces(first, last, step, n, rank, doc, cut)
    lo = np.maximum(cu[doc], first - window + 1)
    hi = last if causal else np.minimum(cu[doc + 1] - 1, last + window - 1)
    f = np.sort(first)
    span = int((last - first).max())
    candidates = int((np.searchsorted(f, hi, side="right") - np.searchsorted(f, lo - span)).sum())
    every = int((np.searchsorted(f, hi, side="right") - np.searchsorted(np.sort(last), lo)).sum())
    return first, last, doc, lo, hi, cut, span, candidates, every


@pytest.mark.parametrize("causal", [True, False])
def test_striped_counts_past_the_candidates_are_the_explicit_ones(causal):
    """Striped pieces, cut or whole: the closed counts against sorted runs and binary searches; a lower bound on
    the candidates (None whenever the candidates are within the limit)."""
    whole = 0
    for cu in _packs():
        for ring in (2, 3, 16, 64, 1000, 4096, 9000):
            for window in (1, 5, 100, 4096):
                first, last, doc, lo, hi, cut, span, candidates, every = _striped_pieces(ring, cu, causal, window)
                args = (first, last, doc, lo, hi, cu, ring, cut, span)
                assert window_forms.striped_reach_tiles(*args, -1) == every
                assert window_forms.striped_reach_tiles(*args, candidates) is None
                if -(-int(np.diff(cu).max()) // ring) <= cut:  # no run cut
                    whole += 1
                    assert window_forms.striped_whole_tiles(cu, ring, window, causal, -1) == every
                    assert window_forms.striped_whole_tiles(cu, ring, window, causal, candidates) is None
    assert whole > 50


def test_clip_sum_is_the_sum_of_its_clips():
    rng = np.random.default_rng(7)
    for _ in range(500):
        a, c, M = int(rng.integers(-5, 20)), int(rng.integers(-30, 30)), int(rng.integers(0, 15))
        b = a + int(rng.integers(0, 20))
        assert window_forms.clip_sum(a, b, c, M) == sum(min(max(o + c, 0), M) for o in range(a, b))


@pytest.mark.parametrize("causal", [True, False])
def test_zigzag_and_balancer_per_document_under_a_window_are_their_runs(causal):
    """Each rank's entries in closed form under a window (zigzag_pack, balanced_pack, spread_loads) against the
    token-by-token count and the runs' loads; their tiles against the explicit count."""
    from sp_plan.planner.layout import _spread_loads
    for cu in _packs():
        for ring in (2, 3, 7, 64, 1000, 4096):
            for window in (1, 3, 100, 700, 4096):
                reference = masks.rank_pairs(masks.layout_tokens("zigzag", ring, cu), cu, causal, window)
                p, tiles = masks.zigzag_pack(cu, ring, causal, window)
                assert p.tolist() == reference.tolist(), (cu[:4], ring, window)
                assert tiles is None or tiles[0] == _explicit_tiles("zigzag", ring, cu, causal, window)
                parts = masks.closed_balanced_parts(cu, ring, causal, window)
                before = masks.work_before(cu, causal, window)
                assert all((x == y).all() for x, y in zip(parts[1], balanced_parts(cu, ring, before)[1]))
                load, held = masks.spread_loads(cu, ring, parts[0], causal, window)
                exact_load, exact_held = _spread_loads(cu, ring, parts[0], before)
                assert load.tolist() == exact_load.tolist() and held.tolist() == exact_held.tolist()
                runs = masks.layout_runs("balanced", ring, cu, causal, window)
                p, tiles, count = masks.balanced_pack(cu, ring, parts, causal, window)
                assert p.tolist() == masks.run_rank_pairs(runs, cu, ring, causal, window).tolist()
                assert tiles is None or tiles[0] == _explicit_tiles("balanced", ring, cu, causal, window)


def test_one_long_document_over_many_ranks_under_a_window():
    """A single document of many chunks a rank, and one of fewer tokens than ranks, at a window inside a chunk."""
    for cu in (np.array([0, 1 << 16]), np.array([0, 3000]), np.array([0, 5, 70000])):
        for ring in (4, 512, 8192):
            for causal in (True, False):
                reference = masks.run_rank_pairs(masks.layout_runs("zigzag", ring, cu), cu, ring, causal, 300)
                assert masks.zigzag_pack(cu, ring, causal, 300)[0].tolist() == reference.tolist()


@pytest.mark.parametrize("causal", [True, False])
def test_contiguous_under_a_window_is_its_tokens_and_runs(causal):
    """The contiguous layout's entries from its bounds and its tiles from four blocks a document, against the
    token-by-token count and the explicit tiles, up to more ranks than tokens."""
    hits = 0
    for cu in _packs():
        for ring in (2, 3, 7, 64, 1000, 4096, 9000):
            for window in (1, 3, 100, 4096):
                reference = masks.rank_pairs(masks.layout_tokens("contiguous", ring, cu), cu, causal, window)
                p, tiles = masks.contiguous_pack(cu, ring, causal, window)
                assert p.tolist() == reference.tolist(), (cu[:4], ring, window)
                if tiles is not None:
                    hits += 1
                    exact = masks.pack_tiles("contiguous", ring, cu, causal, window)
                    assert tiles[:2] == exact[:2] and tiles[2] == pytest.approx(exact[2], rel=1e-11)
                    assert tiles[0] == _explicit_tiles("contiguous", ring, cu, causal, window)
    assert hits > 100


@pytest.mark.parametrize("causal", [True, False])
def test_striped_tiles_are_the_pairs_the_window_connects(causal):
    """Striped under a window: ``pack_tiles`` against every pair of pieces with a query-key offset in the
    window's range (``_strided_pairs_tiles`` without a limit), where the window spans a stride and past it."""
    spanned = 0
    for cu in _packs()[:10]:
        for ring in (2, 3, 16, 64, 300):
            for window in (1, 5, 40, 100, 700):
                first, last, doc, lo, hi, cut, span, candidates, every = _striped_pieces(ring, cu, causal, window)
                n = (last - first) // ring + 1
                pairs = masks._strided_pairs_tiles(first, last, n, lo, hi, ring, causal, window, limit=1 << 62)
                got = masks.pack_tiles("striped", ring, cu, causal, window)[0]
                if masks._striped_limit(ring, causal, window) < 0:
                    spanned += 1
                    assert got == pairs == every, (cu[:4], ring, window)
                elif candidates <= masks.ROUND_CELLS:
                    assert got == pairs
    assert spanned > 100


@pytest.mark.parametrize("causal", [True, False])
def test_rounds_from_pairs_of_runs_are_the_matrix_rounds(causal):
    """Each ring round's busiest and mean entries under a window read off the pairs of runs in reach, against the
    rounds of the (P, P) pair matrix."""
    used = 0
    for cu in _packs():
        for ring in (2, 5, 64, 300):
            for window in (1, 7, 100, 1000):
                if window >= np.diff(cu).max():
                    continue
                for layout in ("contiguous", "zigzag", "balanced"):
                    runs = masks.layout_runs(layout, ring, cu, causal, window)
                    doc = np.searchsorted(cu, runs[0], side="right") - 1
                    cells = masks._windowed_run_cells(*runs, cu[doc], cu[doc + 1], causal, window)
                    busiest, mean = masks._cell_round_stats(*cells, ring)
                    expect = masks.round_pairs(masks.run_pair_matrix(runs, cu, ring, causal, window))
                    assert busiest.tolist() == expect[0].tolist() and mean.tolist() == expect[1].tolist()
                    used += 1
    assert used > 100


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("layout", ["zigzag", "balanced"])
def test_chunked_closed_form_is_the_general_path_exactly(monkeypatch, layout, causal):
    """``pack_tiles``' closed form for zigzag and the balancer under a window (``_chunked_tiles``) gives what its
    general path over the runs gives, entries over length included, where placed documents are longer than the
    window's tiles (and windows that are no multiple of anything)."""
    packs = [np.array([0, 221, 1760, 3316, 5407, 5487, 8443, 8898])] + _packs()
    closed = {}
    for cu in packs:
        for ring in (3, 6, 64):
            for window in (17, 493, 1000):
                closed[len(closed)] = masks.pack_tiles(layout, ring, cu, causal, window)
    monkeypatch.setattr(masks.tiles, "_chunked_tiles", lambda *a: None)
    i = 0
    for cu in packs:
        for ring in (3, 6, 64):
            for window in (17, 493, 1000):
                general = masks.pack_tiles(layout, ring, cu, causal, window)
                assert closed[i][:2] == general[:2], (cu[:4], ring, window)
                assert closed[i][2] == pytest.approx(general[2], rel=1e-12), (cu[:4], ring, window)
                i += 1
