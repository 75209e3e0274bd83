"""Tiles of one member's queries against another member's keys under document masks and sliding windows.

A member's tokens (``ring.member_tokens``) fall into runs: arithmetic progressions of global tokens inside one
document, of step 1 (contiguous, zigzag, balanced) or P (striped), at consecutive local positions. A block of
queries against keys is the set of (query run, key run) pairs of one document within the window's reach. Two runs
of one step attend each other fully or along a diagonal (query i sees key j iff j <= i + offset), so no mask matrix
is built; only where a window's edge crosses a pair is an explicit mask built, over tiles cut to about a window's
length, so it stays small. A block costs O(its attended work), not (S/P)^2.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from .kernels import BlockMask, attended, reduce_mask

#: the fewest tokens a tile of a windowed sequence holds (tiles follow the window, not below this)
MIN_TILE = 16


def layout_step(token_layout: str, size: int) -> int:
    """The step of a member's runs of global tokens: P for the striped layout, 1 for the others."""
    return size if token_layout == "striped" else 1


def member_runs(tokens, cu_seqlens, step: int, window: int | None) -> np.ndarray:
    """(runs, 4) int64 rows (local start, local stop, first global token, document) of ``tokens``: maximal
    progressions of ``step`` inside one document, cut into tiles of a window's reach (at least ``MIN_TILE``)."""
    t = np.asarray(tokens, dtype=np.int64)
    if len(t) == 0:
        return np.zeros((0, 4), dtype=np.int64)
    doc = np.zeros_like(t) if cu_seqlens is None else np.searchsorted(np.asarray(cu_seqlens), t, side="right") - 1
    breaks = np.flatnonzero((np.diff(t) != step) | (doc[1:] != doc[:-1])) + 1
    starts, stops = np.concatenate([[0], breaks]), np.concatenate([breaks, [len(t)]])
    if window is not None:
        size = max(-(-window // step), MIN_TILE)
        pieces = -(-(stops - starts) // size)
        first = np.repeat(starts, pieces)
        starts = first + size * (np.arange(pieces.sum()) - np.repeat(np.cumsum(pieces) - pieces, pieces))
        stops = np.minimum(starts + size, np.repeat(stops, pieces))
    return np.stack([starts, stops, t[starts], doc[starts]], axis=1)


def diagonal_tile(rows: tuple[int, int], cols: tuple[int, int], offset: int | None) -> BlockMask | None:
    """A tile where query row i sees key column j iff j <= i + ``offset`` (None: all), trimmed to the rows that see
    something and the columns some row sees; None = empty."""
    (r0, r1), (c0, c1) = rows, cols
    n, m = r1 - r0, c1 - c0
    if offset is None or offset >= m - 1:
        return BlockMask(r0, r1, c0, c1)
    if n - 1 + offset < 0:
        return None
    skip = max(0, -offset)
    offset += skip
    stop = min(m, n - skip + offset)
    return BlockMask(r0 + skip, r1, c0, c0 + stop, causal_offset=None if offset >= stop - 1 else offset)


@lru_cache(maxsize=4096)
def window_band(n: int, m: int, shift: int, step: int, causal: bool, window: int) -> BlockMask | None:
    """The window's band of ``n`` queries at ``shift`` + step * i against ``m`` keys at step * j, reduced
    (``kernels.reduce_mask``); one per geometry, shared by the tiles that have it. None = empty."""
    return reduce_mask(attended(shift + step * np.arange(n), step * np.arange(m), causal=causal, window=window))


def pair_tile(q_run, k_run, step: int, causal: bool, window: int | None) -> BlockMask | None:
    """Mask of a query run against a key run of one document and one ``step``, in local positions: full or diagonal
    where the window does not bind, else the window's band over the two tiles alone; None = empty."""
    (r0, r1, a, _), (c0, c1, c, _) = q_run, k_run
    low, high = a - (c + step * (c1 - c0 - 1)), a + step * (r1 - r0 - 1) - c  # least and most query - key
    if causal and high < 0 or window is not None and (low >= window or not causal and high <= -window):
        return None
    if window is None or high < window and (causal or low > -window):
        return diagonal_tile((r0, r1), (c0, c1), (a - c) // step if causal else None)
    band = window_band(r1 - r0, c1 - c0, a - c, step, causal, window)
    if band is None:
        return None
    return BlockMask(r0 + band.row_start, r0 + band.row_stop, c0 + band.col_start, c0 + band.col_stop,
                     band.causal_offset, band.mask)


def block_tiles(q_runs: np.ndarray, k_runs: np.ndarray, step: int, causal: bool,
                window: int | None) -> tuple[BlockMask, ...] | None:
    """The tiles of a block of queries (``q_runs``) against keys (``k_runs``): pairs of runs of one document within
    causal and window reach (``pair_tile``), in query order; None where the mask empties the block."""
    if not len(q_runs) or not len(k_runs):
        return None
    k_first = k_runs[:, 2]
    k_last = k_first + step * (k_runs[:, 1] - k_runs[:, 0] - 1)
    reach = np.inf if window is None else window
    tiles = []
    for run in q_runs.tolist():
        a, last = run[2], run[2] + step * (run[1] - run[0] - 1)
        near = (k_runs[:, 3] == run[3]) & (a - k_last < reach) & (k_first - last < (1 if causal else reach))
        tiles += [bm for bm in (pair_tile(run, k_runs[j].tolist(), step, causal, window) for j in np.flatnonzero(near))
                  if bm is not None]
    return tuple(tiles) or None
