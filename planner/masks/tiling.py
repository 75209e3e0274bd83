"""A pack's runs cut into kernel tiles: the runs in token order (``tile_runs``), their pieces, the (document, rank)
cells they hold, and the tiles of the chunked layouts under a window.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..layout import balanced_parts
from ..window_forms import block_tiles, spread_blocks, zigzag_blocks
from .layout_ranks import layout_runs, work_before
from .pairs import document_pairs, run_documents


# ---------------------------------------------------------------- the kernel calls of a masked block
#
# Under a document mask or a window a block of one rank's queries against another's keys runs as tiles: one kernel
# call per pair of runs (a rank's consecutive tokens inside one document, cut to a window's reach) that the mask
# connects (runtime/kernels.py ``block_tiles``). A tile runs at the kernel's efficiency for its own size, and each
# pays a call's fixed cost, so a policy that cuts documents finely (zigzag's 2P pieces of every document) runs many
# small, slow calls.

#: the fewest tokens of a windowed tile (tiles follow the window, not below this); the runtime cuts its tiles by it
#: (runtime/kernels.py ``member_runs``)
MIN_TILE = 16


class TileWork(NamedTuple):
    """Per sequence and attention pass, in expectation over the workload's packs: the tiles (kernel calls) of all
    ring ranks, their score entries, and each document piece's entries over its length, summed: ``length`` is the
    work-weighted harmonic mean of the tiles' lengths, the one length at which a saturating efficiency curve
    a x / (x + h) prices the tiles' total exactly. ``plain``: the tiles of one document per sequence without a
    window, the calls an unmasked schedule's blocks stand for."""

    tiles: float
    pairs: float
    per_length: float
    plain: float
    samples: int

    @property
    def length(self) -> float:
        """The tiles' work-weighted harmonic mean length (tokens; 0 without work)."""
        return self.pairs / self.per_length if self.per_length else 0.0


def _merged(start: np.ndarray, stop: np.ndarray, rank: np.ndarray, doc: np.ndarray):
    """Runs in token order with each one's neighbour of the same rank and document joined (zigzag's chunks P - 1 and
    P of a document, both on rank P - 1, are one run of its tokens)."""
    keep = np.ones(len(start), dtype=bool)
    keep[1:] = (start[1:] != stop[:-1]) | (rank[1:] != rank[:-1]) | (doc[1:] != doc[:-1])
    first = np.flatnonzero(keep)
    last = np.append(first[1:], len(start)) - 1
    return start[first], stop[last], rank[first], doc[first]


def tile_runs(token_layout: str, ring: int, cu_seqlens, causal: bool = True, window: int | None = None, runs=None
              ) -> tuple[np.ndarray, ...]:
    """(first, last, step, tokens, rank, document) of each run of one rank's tokens inside one document, as the
    runtime holds them (``kernels.member_runs``; ``balanced`` placed by the mask's work; ``runs``: the layout's,
    ``layout_runs``, where already built): first and last global token, every ``step``-th between (P for striped,
    else 1). Striped: a document's offset o on rank (start + o) mod P, one run of ceil((L - o)/P) tokens
    per offset o < min(L, P)."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    if token_layout == "striped":
        L = np.diff(cu)
        m = np.minimum(L, ring)
        doc = np.repeat(np.arange(len(L)), m)
        o = np.arange(int(m.sum())) - np.repeat(np.cumsum(m) - m, m)
        n = (L[doc] - o + ring - 1) // ring
        first = cu[doc] + o
        return first, first + ring * (n - 1), ring, n, first % ring, doc
    start, stop, rank = layout_runs(token_layout, ring, cu, causal, window) if runs is None else runs
    start, stop, rank, doc = _merged(start, stop, rank, run_documents(start, cu))
    return start, stop - 1, 1, stop - start, rank, doc


def _pieces(first, last, step, n, rank, doc, size: int):
    """Runs cut into pieces of at most ``size`` tokens (the runtime's windowed tiles, ``kernels.member_runs``)."""
    k = -(-n // size)
    j = np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)  # a piece's place in its run
    pn = np.minimum(size, np.repeat(n, k) - j * size)  # each run's values repeated over its pieces, not gathered
    pf = np.repeat(first, k) + step * size * j
    return pf, pf + step * (pn - 1), pn, np.repeat(rank, k), np.repeat(doc, k)


def _even_cells(q, nA, nB, P: int):
    """(tokens a rank holds, how many ranks hold them) of each document whose ranks hold 2q tokens and one more on
    nA ranks, two more on nB of those: the (document, rank) cells of ``_document_rank_sizes``."""
    return (2 * q, 2 * q + 1, 2 * q + 2), (P - nA, nA - nB, nB)


def _roots(sizes, counts) -> np.ndarray:
    """Per document, the sum of sqrt(tokens) over its cells from ``_even_cells``."""
    return sum(n * np.sqrt(s.astype(np.float64)) for s, n in zip(sizes, counts))


def _chunked_tiles(token_layout: str, ring: int, cu: np.ndarray, causal: bool, window: int, parts=None):
    """``pack_tiles`` under a window of zigzag, or of the balancer (its ``parts``, built here if not given): the
    zigzag-chunked documents from their blocks of equal runs (window_forms.block_tiles, O(documents)), the
    balancer's placed runs as ``pack_tiles`` counts them; None where a run is longer than the window's tiles (the
    blocks hold whole runs, not pieces of them)."""
    L = np.diff(cu)
    cut = min(max(window, MIN_TILE), int(cu[-1]))
    if token_layout == "zigzag":
        docs, placed = np.arange(len(L)), None
        F, n, s = zigzag_blocks(cu, ring)
    else:
        if parts is None:
            parts = balanced_parts(cu, ring, work_before(cu, causal, window))
        docs, placed = parts
        F, n, s = spread_blocks(L[docs], ring)
    if len(docs) and int(np.where(n > 0, s, 0).max()) > cut:
        return None
    q, rem = np.divmod(L[docs], 2 * ring)
    roots = np.zeros(len(L))
    roots[docs] = _roots(*_even_cells(q, np.minimum(rem, ring), np.maximum(rem - ring, 0), ring))
    tiles = block_tiles(F, n, s, window, causal) if len(docs) else 0
    if placed is not None and len(placed[0]):
        t, r = _placed_tiles(placed, cu, ring, causal, window, cut)
        tiles, roots = tiles + t, roots + r
    pairs = document_pairs(L, causal, window)
    per_length = np.maximum(pairs * roots ** 2 / (L.astype(np.float64) ** 2), pairs / cut)
    return tiles, int(pairs.sum()), float(per_length.sum())


def _placed_tiles(placed, cu: np.ndarray, ring: int, causal: bool, window: int, cut: int) -> tuple[int, np.ndarray]:
    """(tiles, per document the sum of sqrt(tokens) over its ranks) of the balancer's placed runs under a window,
    as ``pack_tiles`` counts all runs (their documents hold no other runs)."""
    o = np.argsort(placed[0], kind="stable")
    start, stop, rank = (x[o] for x in placed)
    start, stop, rank, doc = _merged(start, stop, rank, run_documents(start, cu))
    n = stop - start
    sizes, owner = _document_rank_sizes(doc, rank, n, len(cu) - 1, ring)
    roots = np.bincount(owner, weights=np.sqrt(sizes), minlength=len(cu) - 1)
    first, last = start, stop - 1
    if cut < n.max():
        first, last, n, rank, doc = _pieces(first, last, 1, n, rank, doc, cut)
    lo = np.maximum(cu[doc], first - window + 1)
    hi = last if causal else np.minimum(cu[doc + 1] - 1, last + window - 1)
    return _reach_tiles(first, last, lo, hi, causal, int(cu[-1])), roots


def _sorted(x: np.ndarray) -> np.ndarray:
    """x in ascending order: itself where it already is (runs in token order), one check instead of a sort."""
    return x if len(x) < 2 or bool((x[1:] >= x[:-1]).all()) else np.sort(x)


def _reach_tiles(first, last, lo, hi, tiled: bool, seq_len: int) -> int:
    """Pairs of runs (A, B) whose tokens meet A's reach [lo, hi]: runs with first <= hi less those with last < lo.
    ``tiled``: the runs are disjoint, in token order, and reach no further than their last token (causal, step 1),
    so run i meets i + 1 with first <= hi; where they are many, the runs ending before lo are read off a running
    count of run ends over the tokens (O(S), not a binary search a run)."""
    N = len(first)
    if not tiled or N * TILED_SEARCH_SHARE < seq_len:
        return int((np.searchsorted(_sorted(first), hi, side="right")
                    - np.searchsorted(_sorted(last), lo, side="left")).sum())
    ends = np.zeros(seq_len + 1, dtype=np.int64)
    ends[last + 1] = 1
    return N * (N + 1) // 2 - int(np.cumsum(ends)[lo].sum())


#: runs per token (over 1/this) from which ``_reach_tiles`` counts run ends over the tokens, not by binary search
TILED_SEARCH_SHARE = 16


def _document_rank_sizes(doc: np.ndarray, rank: np.ndarray, n: np.ndarray, docs: int, ring: int
                         ) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, document) of each (document, rank) cell in (document, rank) order: every cell where few runs would
    leave the documents x P table mostly empty (hundreds of documents at a ring of 10^5 ranks: 10^8 cells), only
    those holding runs otherwise (the empty ones add nothing to a sum)."""
    key = doc * ring + rank
    if docs * ring <= DENSE_CELLS_PER_RUN * len(key) + (1 << 16):
        sizes = np.bincount(key, weights=n.astype(np.float64), minlength=docs * ring)
        return sizes, np.arange(len(sizes)) // ring
    order = np.argsort(key, kind="stable")  # timsort: a layout's keys are a few sorted runs a document
    key = key[order]
    first = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))
    return np.add.reduceat(n[order], first).astype(np.float64), key[first] // ring


#: documents x P cells per run past which ``_document_rank_sizes`` keeps only the cells holding runs
DENSE_CELLS_PER_RUN = 4
