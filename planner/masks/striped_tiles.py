"""Tiles of the striped layout: a rank's every P-th token, cut to a window's reach, counted per document in
closed form or from the strided pieces' pairs.
"""
from __future__ import annotations

import numpy as np

from ..window_forms import striped_cut_tiles, striped_whole_tiles
from .limits import ROUND_CELLS
from .tiling import DENSE_CELLS_PER_RUN, MIN_TILE


def _striped_window_tiles(ring: int, cu: np.ndarray, causal: bool, window: int, pairs: np.ndarray):
    """``pack_tiles`` of striped under a window where no run is cut into the window's tiles and the candidate pairs
    are past ROUND_CELLS, per document in closed form (window_forms.striped_whole_tiles; entries over length from
    ``_striped_roots``); else None."""
    L = np.diff(cu)
    cut = min(max(-(-window // ring), MIN_TILE), int(cu[-1]))
    if -(-int(L.max()) // ring) > cut:
        return None
    tiles = striped_whole_tiles(cu, ring, window, causal, _striped_limit(ring, causal, window))
    if tiles is None:
        return None
    per_length = np.maximum(pairs * _striped_roots(L, ring) ** 2 / (L.astype(np.float64) ** 2), pairs / cut)
    return tiles, int(pairs.sum()), float(per_length.sum())


def _striped_cut_pack(ring: int, cu: np.ndarray, causal: bool, window: int, pairs: np.ndarray):
    """``pack_tiles`` of striped under a window past the candidate pairs' limit, without its runs: tiles from the
    documents' periods (window_forms.striped_cut_tiles), entries over length from ``_striped_rank_roots``; None
    within the limit, or where the documents x ranks table would outgrow the runs (``_document_rank_sizes``' sparse
    cells)."""
    L = np.diff(cu)
    if len(L) * ring > DENSE_CELLS_PER_RUN * int(np.minimum(L, ring).sum()) + (1 << 16):
        return None
    cut = min(max(-(-window // ring), MIN_TILE), int(cu[-1]))
    longest = -(-int(L.max()) // ring)  # a document's first run's tokens
    tiles = striped_cut_tiles(cu, ring, cut, window, causal, ring * (min(cut, longest) - 1),
                              _striped_limit(ring, causal, window))
    if tiles is None:
        return None
    roots = _striped_rank_roots(cu, ring)
    per_length = np.maximum(pairs * roots ** 2 / (L.astype(np.float64) ** 2), pairs / cut)
    return tiles, int(pairs.sum()), float(per_length.sum())


def _striped_rank_roots(cu: np.ndarray, P: int) -> np.ndarray:
    """Per document, the square roots of its tokens on each rank added in rank order from 0, one at a time (the
    float sums ``pack_tiles`` makes of ``_document_rank_sizes``' cells): offset o < min(L, P) on rank (start + o)
    mod P holds L // P + 1 tokens below L mod P, else L // P; from a documents x ranks table."""
    L = np.diff(cu)
    Q, R = np.divmod(L, P)
    o = (np.arange(P) - cu[:-1, None]) % P
    v = np.where(o < R[:, None], np.sqrt(Q + 1.0)[:, None],
                 np.where(o < np.minimum(L, P)[:, None], np.sqrt(Q.astype(np.float64))[:, None], 0.0))
    return np.cumsum(v, axis=1)[:, -1]  # np.add.accumulate: left to right, as bincount adds


def _striped_limit(step: int, causal: bool, window: int) -> int:
    """The candidate pairs past which striped tiles are the pairs of runs whose intervals meet a reach
    (``striped_reach_tiles``): ROUND_CELLS (``_strided_pairs_tiles``' limit), or none (-1) where the window's offsets
    span a whole stride (P <= W causal, P <= 2W - 1 bidirectional): there a query run meets a key run whose
    interval meets its reach at some offset t of the runs' (the window's ranges for consecutive t touch), so
    ``_strided_pairs_tiles`` would count those same pairs."""
    return -1 if step <= (window if causal else 2 * window - 1) else ROUND_CELLS


def _striped_roots(L: np.ndarray, P: int) -> np.ndarray:
    """Per document, sum over its runs of sqrt(tokens) when offset o lives on rank (start + o) mod P: L mod P runs of
    L // P + 1 tokens and the rest of min(L, P) of L // P."""
    q, r = np.divmod(L, P)
    return r * np.sqrt(q + 1.0) + (np.minimum(L, P) - r) * np.sqrt(q.astype(np.float64))


def _striped_tiles(L: np.ndarray, P: int, causal: bool) -> int:
    """Tiles of striped documents without a window: each of a document's m = min(L, P) runs (offset o, n_o tokens)
    meets every run that starts before its last token: all m where n_o >= 2 (o < L - P), else the o + 1 runs up to
    its own; bidirectional, all m."""
    m = np.minimum(L, P)
    if not causal:
        return int((m * m).sum())
    two = np.clip(L - P, 0, m)  # runs of two tokens or more
    return int((two * m + (m * (m + 1) - two * (two + 1)) // 2).sum())


def _strided_pairs_tiles(first, last, n, lo, hi, step: int, causal: bool, window: int, limit: int = ROUND_CELLS):
    """Tiles of runs of ``step`` under a window, pair by pair: query run A and key run B whose tokens meet A's reach
    [lo, hi] make a tile where some query - key offset a - b + step t (t from -(n_B - 1) to n_A - 1) lies in the
    window's range (the runtime drops the other pairs, ``kernels.pair_tile``). None past ``limit`` pairs in reach:
    the caller counts them all (more tiles, never fewer)."""
    order = np.argsort(first, kind="stable")
    f, g, m = first[order], last[order], n[order]
    a = np.searchsorted(f, lo - int((g - f).max()), side="left")
    cnt = np.searchsorted(f, hi, side="right") - a
    if cnt.sum() > limit:
        return None
    A = np.repeat(np.arange(len(first)), cnt)
    B = a[A] + np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    delta = first[A] - f[B]
    low = 0 if causal else 1 - window
    t_lo = np.maximum(1 - m[B], -((delta - low) // step))
    t_hi = np.minimum(n[A] - 1, (window - 1 - delta) // step)
    return int(((g[B] >= lo[A]) & (t_lo <= t_hi)).sum())
