"""Attention work of a mask: the score entries (query-key pairs) a document mask and a sliding window keep.

A sequence's mask is its documents (``cu_seqlens``: each document attends only to itself), causal or not, with an
optional window W (a query attends keys less than W positions away: causal, itself and the W - 1 before it;
bidirectional, W - 1 on each side). Counts are exact integers: per document (closed forms below), per query token
(``row_pairs``), per rank of a token layout (``rank_pairs``, the layout from planner/layout.py), per pair of ranks
(``pair_matrix``: what a ring round between them computes). ``busiest_rank_pairs`` and ``ring_round_pairs`` are
what the schedules price (all-gather; ring, Ulysses and USP): the busiest rank's pairs, and each ring round's, in
expectation over seeded packs of the workload's documents. They count in closed form, never token by token, so a
search can price every layout of a million-token sequence: a rank's pairs from runs of its tokens inside one
document (``prefix_pairs``: the running sum of a document's rows) or, striped, from strided sums of the rows'
linear pieces; the rounds from the layouts' chunks (``causal_layout_matrix``) or pairs of runs. The token-by-token
``rank_pairs`` and ``pair_matrix`` are the reference the tests hold them to. The algorithms outside
MASKED_ALGORITHMS refuse masks.
"""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from .documents import check_cu_seqlens, workload_packs
from .errors import PlanError
from .layout import _zigzag_sizes, balanced_parts, document_ring_tokens, document_runs, parts_runs, spread_sizes
from .model import Workload
from .window_forms import (block_tiles, spread_blocks, striped_cut_tiles, striped_whole_tiles, window_places,
                           zigzag_blocks)

#: packs drawn per priced layout: the expected busiest rank is the mean over this many seeded sequences
PACK_SAMPLES = 8
#: the algorithms that honour packed documents and sliding windows (runtime/attention.py MASKED); the others refuse
MASKED_ALGORITHMS = ("ring", "ulysses", "usp", "allgather")


def has_mask(work: Workload | None) -> bool:
    """Whether the workload's attention is more than one causal or bidirectional document: documents or a window."""
    return work is not None and (work.documents is not None or work.window is not None)


def refuse_masks(algorithm: str, work: Workload | None) -> None:
    """A PlanError for an algorithm outside MASKED_ALGORITHMS on a workload with documents or a window."""
    if not has_mask(work) or algorithm in MASKED_ALGORITHMS:
        return
    field = "workload.documents" if work.documents is not None else "workload.window"
    raise PlanError(field, f"{algorithm} does not honour packed documents or sliding windows",
                    f"use algorithm {', '.join(MASKED_ALGORITHMS[:-1])} or {MASKED_ALGORITHMS[-1]}, which do")


def _min(a, b):
    """Elementwise minimum of ints or int64 arrays (Python ints stay exact at any size)."""
    return np.minimum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else min(a, b)


def causal_pairs(L):
    """Causal document of L tokens: sum over queries i < L of (i + 1) = L(L+1)/2 score entries."""
    return L * (L + 1) // 2


def full_pairs(L):
    """Bidirectional document of L tokens: L^2 score entries."""
    return L * L


def causal_window_pairs(L, W):
    """Causal window W over L tokens: sum_i min(i+1, W) = m(m+1)/2 + (L-m) W, m = min(L, W) (LW - W(W-1)/2 if L > W)."""
    m = _min(L, W)
    return m * (m + 1) // 2 + (L - m) * W


def full_window_pairs(L, W):
    """Bidirectional window W over L tokens: L + 2 sum_{d=1..m} (L - d) = L + 2mL - m(m+1), m = min(L, W) - 1."""
    m = _min(L, W) - 1
    return L + 2 * m * L - m * (m + 1)


def document_pairs(L, causal: bool = True, window: int | None = None):
    """Score entries of documents of length L (an int or an int64 array) under the mask."""
    if window is None:
        return causal_pairs(L) if causal else full_pairs(L)
    return causal_window_pairs(L, window) if causal else full_window_pairs(L, window)


def mask_pairs(cu_seqlens, causal: bool = True, window: int | None = None) -> int:
    """Score entries of one sequence whose documents end at ``cu_seqlens``."""
    lengths = np.diff(np.asarray(cu_seqlens, dtype=np.int64))
    return int(document_pairs(lengths, causal, window).sum())


def row_pairs(cu_seqlens, causal: bool = True, window: int | None = None) -> np.ndarray:
    """(S,) int64: how many keys each query token attends, the work the layouts balance. Query at offset i of a
    document of L tokens: causal min(i + 1, W); bidirectional min(L - 1, i + W - 1) - max(0, i - W + 1) + 1."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    lengths = np.diff(cu)
    offset = np.arange(int(cu[-1]), dtype=np.int64) - np.repeat(cu[:-1], lengths)
    if causal:
        return offset + 1 if window is None else np.minimum(offset + 1, window)
    L = np.repeat(lengths, lengths)
    if window is None:
        return L
    return np.minimum(L - 1, offset + window - 1) - np.maximum(0, offset - window + 1) + 1


def rank_pairs(tokens: list[np.ndarray], cu_seqlens, causal: bool = True, window: int | None = None) -> np.ndarray:
    """(P,) int64: score entries of the queries each rank holds (``tokens``: its global token indices) against every
    key their documents let them see: a rank's work when it has all the K, V it needs (all-gather, Ulysses)."""
    rows = row_pairs(cu_seqlens, causal, window)
    owner = np.repeat(np.arange(len(tokens)), [len(t) for t in tokens])
    # float64 sums of int counts: exact below 2^53 score entries per rank
    return np.rint(np.bincount(owner, weights=rows[np.concatenate(tokens)], minlength=len(tokens))).astype(np.int64)


def _max0(a):
    """Elementwise max(a, 0) of an int or an int64 array."""
    return np.maximum(a, 0) if isinstance(a, np.ndarray) else max(a, 0)


def prefix_pairs(n, L, causal: bool = True, window: int | None = None):
    """Score entries of the first n queries (offsets 0..n-1) of a document of L tokens: the prefix sum of
    ``row_pairs`` inside a document, in closed form (ints or int64 arrays). Causal: sum min(o + 1, W), as
    ``causal_window_pairs``. Bidirectional: sum min(L, o + W) - max(0, o - W + 1); the first term is o + W for the
    k = clamp(L - W, 0, n) queries whose reach ahead ends inside the document, L after them; the second counts the
    m = max(n - W, 0) queries past the first W, 1..m keys lost behind."""
    if causal:
        return causal_pairs(n) if window is None else causal_window_pairs(n, window)
    if window is None:
        return n * L
    k = _min(_max0(L - window), n)
    m = _max0(n - window)
    return k * window + k * (k - 1) // 2 + (n - k) * L - m * (m + 1) // 2


def run_documents(start: np.ndarray, cu: np.ndarray) -> np.ndarray:
    """The document of each run, from the runs' starts in token order (every document's first run starts at its
    start): one binary search a document, not one a run (a ring of 10^5 ranks cuts 1M tokens into 1M runs)."""
    first = np.searchsorted(start, cu[:-1])
    return np.repeat(np.arange(len(cu) - 1), np.diff(np.append(first, len(start))))


def run_rank_pairs(runs: tuple[np.ndarray, np.ndarray, np.ndarray], cu_seqlens, ring: int, causal: bool = True,
                   window: int | None = None) -> np.ndarray:
    """(P,) int64 ``rank_pairs`` from ``runs`` (start, stop, rank: intervals of one rank's tokens inside one
    document in token order, layout.document_runs): each run's queries by the difference of two ``prefix_pairs``,
    O(runs)."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    start, stop, rank = runs
    doc = run_documents(start, cu)
    ds, L = cu[doc], cu[doc + 1] - cu[doc]
    pairs = prefix_pairs(stop - ds, L, causal, window) - prefix_pairs(start - ds, L, causal, window)
    # float64 sums of int counts: exact below 2^53 score entries per rank
    return np.rint(np.bincount(rank, weights=pairs, minlength=ring)).astype(np.int64)


def _row_segments(cu: np.ndarray, causal: bool, window: int | None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(a, b, alpha, beta): intervals [a, b) of token indices t on which ``row_pairs`` is alpha t + beta, whose sum
    is ``row_pairs`` (at most three a document: causal o + 1 then W; bidirectional o + W then L, less o - W + 1
    past the first W)."""
    ds, de = cu[:-1], cu[1:]
    L = de - ds
    zero, one = np.zeros_like(L), np.ones_like(L)
    if causal and window is None:
        parts = [(ds, de, one, 1 - ds)]
    elif causal:
        m = ds + np.minimum(L, window)
        parts = [(ds, m, one, 1 - ds), (m, de, zero, np.full_like(L, window))]
    elif window is None:
        parts = [(ds, de, zero, L)]
    else:
        k = ds + np.clip(L - window, 0, L)
        parts = [(ds, k, one, window - ds), (k, de, zero, L), (np.minimum(ds + window, de), de, -one, ds + window - 1)]
    a, b, alpha, beta = (np.concatenate(x) for x in zip(*parts))
    keep = b > a
    return a[keep], b[keep], alpha[keep], beta[keep]


def _strided_sums(a: np.ndarray, b: np.ndarray, alpha: np.ndarray, beta: np.ndarray, P: int) -> np.ndarray:
    """(P,) int64: per residue r, the sum of alpha t + beta over the tokens t = r (mod P) of every interval [a, b),
    O(intervals + P). Token a + j + iP (i < K) is the interval's on rank (a + j) mod P: K = k + 1 for j below
    m and k from m on ((b - a) = kP + m), so each of those two ranges of j adds K (alpha (a + j) + beta) +
    alpha P K (K - 1)/2, a line in j, and so in r on each side of where j wraps past P; the lines go on
    difference arrays of their intercepts and slopes."""
    k, m = np.divmod(b - a, P)
    a0 = a % P
    lo, hi, icpt, slope = [], [], [], []
    for j0, j1, K in ((np.zeros_like(m), m, k + 1), (m, np.full_like(m, P), k)):
        base = K * (alpha * a + beta) + alpha * P * (K * (K - 1) // 2)
        s = K * alpha
        # j in [j0, j1) before the wrap: r = a0 + j; after it: r = a0 + j - P
        lo += [a0 + j0, np.maximum(a0 + j0, P) - P]
        hi += [np.minimum(a0 + j1, P), np.maximum(a0 + j1, P) - P]
        icpt += [base - s * a0, base - s * a0 + s * P]
        slope += [s, s]
    lo, hi, icpt, slope = (np.concatenate(x) for x in (lo, hi, icpt, slope))
    keep = hi > lo
    d_icpt, d_slope = np.zeros(P + 1, dtype=np.int64), np.zeros(P + 1, dtype=np.int64)
    for d, v in ((d_icpt, icpt[keep]), (d_slope, slope[keep])):
        np.add.at(d, lo[keep], v)
        np.add.at(d, hi[keep], -v)
    return np.cumsum(d_icpt)[:P] + np.cumsum(d_slope)[:P] * np.arange(P, dtype=np.int64)


def striped_pairs(cu_seqlens, ring: int, causal: bool = True, window: int | None = None) -> np.ndarray:
    """(P,) int64 ``rank_pairs`` when token t lives on rank t mod P (striped, per document or not): strided sums of
    ``row_pairs``' linear pieces (``_row_segments``, ``_strided_sums``), O(documents + P)."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    return _strided_sums(*_row_segments(cu, causal, window), ring)


def _key_ranges(cu: np.ndarray, causal: bool, window: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) key each query token attends, inclusive: its document, cut by the window and causality."""
    lengths = np.diff(cu)
    t = np.arange(int(cu[-1]), dtype=np.int64)
    start, end = np.repeat(cu[:-1], lengths), np.repeat(cu[1:], lengths) - 1
    lo = start if window is None else np.maximum(start, t - window + 1)
    hi = t if causal else (end if window is None else np.minimum(end, t + window - 1))
    return lo, hi


def pair_matrix(tokens: list[np.ndarray], cu_seqlens, causal: bool = True, window: int | None = None) -> np.ndarray:
    """(P, P) int64: score entries of rank r's queries against rank j's keys (a ring round's block of r on j's K, V);
    row r sums to ``rank_pairs``. Per rank j, a running count of its keys turns each query's key range into a
    count, O(P S) in all."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    lo, hi = _key_ranges(cu, causal, window)
    P = len(tokens)
    owner = np.empty(int(cu[-1]), dtype=np.int64)
    for r, t in enumerate(tokens):
        owner[t] = r
    out = np.zeros((P, P), dtype=np.int64)
    for j in range(P):
        held = np.concatenate([[0], np.cumsum(owner == j)])  # keys of rank j before each position
        # float64 sums of int counts: exact below 2^53 score entries per rank pair
        out[:, j] = np.rint(np.bincount(owner, weights=held[hi + 1] - held[lo], minlength=P)).astype(np.int64)
    return out


def layout_tokens(token_layout: str, ring: int, cu_seqlens, causal: bool = True, window: int | None = None
                  ) -> list[np.ndarray]:
    """Each ring rank's tokens under a balancing policy (planner/layout.py), ``balanced`` weighted by ``row_pairs``."""
    weights = row_pairs(cu_seqlens, causal, window) if token_layout == "balanced" else None
    return document_ring_tokens(token_layout, ring, cu_seqlens, weights)


def work_before(cu_seqlens, causal: bool = True, window: int | None = None):
    """The score entries of the queries before each of an int64 array of positions (float64: ``_balanced_runs``'
    ``work_before``), in closed form: the documents before, then ``prefix_pairs`` of its own. Exact below 2^53."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    lengths = np.diff(cu)
    done = np.concatenate([[0], np.cumsum(document_pairs(lengths, causal, window))])

    def before(x: np.ndarray) -> np.ndarray:
        d = np.minimum(np.searchsorted(cu, x, side="right") - 1, len(lengths) - 1)
        return (done[d] + prefix_pairs(x - cu[d], lengths[d], causal, window)).astype(np.float64)

    return before


def layout_runs(token_layout: str, ring: int, cu_seqlens, causal: bool = True, window: int | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, stop, rank) runs of a balancing policy (layout.document_runs), ``balanced`` weighted by the mask's
    work in closed form (``work_before``): no per-token array for contiguous, zigzag or balanced."""
    before = work_before(cu_seqlens, causal, window) if token_layout == "balanced" else None
    return document_runs(token_layout, ring, cu_seqlens, work_before=before)


def layout_pairs(token_layout: str, ring: int, cu_seqlens, causal: bool = True, window: int | None = None
                 ) -> np.ndarray:
    """(P,) score entries each ring rank's queries compute under a balancing policy (``rank_pairs`` of its tokens),
    in closed form: from its runs (``run_rank_pairs``), striped by strided sums (``striped_pairs``)."""
    if token_layout == "striped":
        return striped_pairs(check_cu_seqlens(cu_seqlens), ring, causal, window)
    return run_rank_pairs(layout_runs(token_layout, ring, cu_seqlens, causal, window), cu_seqlens, ring, causal,
                          window)


def imbalance(work) -> float:
    """The busiest rank's work over the ranks' mean (1.0: even)."""
    w = np.asarray(work, dtype=np.float64)
    return float(w.max() / w.mean()) if w.mean() > 0 else 1.0


class RankWork(NamedTuple):
    """Per sequence, in expectation over the workload's packs: all score entries, the busiest rank's, the ratio."""

    pairs: float
    busiest: float
    imbalance: float
    samples: int


def busiest_rank_pairs(work: Workload, token_layout: str, ring: int, window: int | None = None) -> RankWork:
    """Score entries of the busiest of ``ring`` ranks per sequence, in expectation over PACK_SAMPLES seeded packs of
    the workload's documents (one pack without documents: it is the same every time), under ``window`` (a layer's:
    the workload's window applies per layer, ``layer_windows``)."""
    if work.documents is None and window is None:  # no rounds or tiles will be asked for: count the rank alone
        return _busiest_alone(work, token_layout, ring)
    return _layout_work(work, token_layout, ring, window)[0]


@lru_cache(maxsize=4096)
def _busiest_alone(work: Workload, token_layout: str, ring: int) -> RankWork:
    """``busiest_rank_pairs`` of one unmasked sequence (causal or full) without building its rounds and tiles, which
    ring and USP price in closed form there: the same sums as ``_layout_work``'s."""
    _, p = _pack_pairs(token_layout, ring, next(iter(workload_packs(work, 1))), work.causal, None)
    total, top = float(p.sum()), float(p.max())
    return RankWork(total, top, top * ring / total if total else 1.0, 1)


def _pack_pairs(token_layout: str, ring: int, cu, causal: bool, window: int | None) -> tuple:
    """(the layout's runs of each rank, or None where striped; each rank's score entries) of one pack ``cu``."""
    runs = None if token_layout == "striped" else layout_runs(token_layout, ring, cu, causal, window)
    p = (striped_pairs(check_cu_seqlens(cu), ring, causal, window) if runs is None
         else run_rank_pairs(runs, cu, ring, causal, window))
    return runs, p


@lru_cache(maxsize=4096)
def _layout_work(work: Workload, token_layout: str, ring: int, window: int | None
                 ) -> tuple[RankWork, tuple[np.ndarray, ...], TileWork]:
    """``busiest_rank_pairs``, ``round_arrays`` and ``layout_tiles`` of one layout and ring degree, from one pass
    over the packs: a search prices all three (all-gather; ring and USP; the tiles of either) for every layout and
    degree, and each pack's layout runs and rank totals, the most of their cost, serve them all."""
    samples = PACK_SAMPLES if work.documents is not None else 1
    total = top = 0.0
    busiest, mean, empty = np.zeros(ring), np.zeros(ring), np.zeros(ring)
    tiles = np.zeros(3)
    for p, hi, avg, t in _pack_works(work, token_layout, ring, window, samples):
        total, top = total + float(p.sum()), top + float(p.max())
        busiest, mean, empty = busiest + hi, mean + avg, empty + (hi == 0)
        tiles += t
    return (RankWork(total / samples, top / samples, top * ring / total if total else 1.0, samples),
            tuple(_frozen(x / samples) for x in (busiest, mean, empty)),
            TileWork(*(tiles / samples).tolist(), float(plain_tiles(token_layout, ring, work, None)), samples))


def _frozen(x: np.ndarray) -> np.ndarray:
    """``x`` made read-only: a cached result handed to every caller."""
    x.flags.writeable = False
    return x


def _per_round(x: np.ndarray, samples: int) -> tuple[float, ...]:
    """x / samples as ``RoundWork``'s tuple of floats: one float repeated where every round has the same value (the
    even rounds of a large ring: no float object made per round)."""
    y = x / samples
    if len(y) and (y == y[0]).all():
        return (float(y[0]),) * len(y)
    return tuple(y.tolist())


def _pack_works(work: Workload, token_layout: str, ring: int, window: int | None, samples: int):
    """Per pack, in order: (each rank's score entries, each round's busiest and mean, the tiles' ``pack_tiles``),
    each distinct pack counted once: a distribution whose documents outgrow the sequence draws many packs that are
    one whole document, all alike."""
    seen: dict[bytes, tuple] = {}
    for cu in workload_packs(work, samples):  # per rank: O(runs) or O(documents + P); rounds as round_stats
        key = cu.tobytes()
        if key not in seen:
            seen[key] = pack_work(token_layout, ring, cu, work.causal, window)
        yield seen[key]


def pack_work(token_layout: str, ring: int, cu_seqlens, causal: bool = True, window: int | None = None) -> tuple:
    """(each rank's score entries, each round's busiest and mean, ``pack_tiles``) of one pack: in closed form per
    document where it can be (``_closed_pack``), else from the layout's runs (``layout_runs``, ``round_stats``)."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    parts = None
    if ring > 1:
        closed, parts = _closed_pack(token_layout, ring, cu, causal, window)
        if closed is not None:
            return closed
    if parts is None:
        runs, p = _pack_pairs(token_layout, ring, cu, causal, window)
    else:
        runs = parts_runs(cu, ring, parts)
        p = run_rank_pairs(runs, cu, ring, causal, window)
    hi, avg = round_stats(token_layout, ring, cu, causal, window, runs, p,
                          parts if causal and window is None else None)
    return p, hi, avg, pack_tiles(token_layout, ring, cu, causal, window, runs=runs, parts=parts)


def _closed_pack(token_layout: str, ring: int, cu: np.ndarray, causal: bool, window: int | None = None) -> tuple:
    """(``pack_work`` of a pack whose rounds are taken as even, ``_even_totals``: past ROUND_CELLS runs x ranks, or
    None; the balancer's parts, placed once a pack for its runs and rounds). Contiguous, zigzag and the balancer
    count there per document in closed form (``contiguous_pack``, ``zigzag_pack``, ``balanced_pack``), O(documents
    + P), not from their runs (zigzag's about S past a ring of S/2P ranks); the same integers; under a window
    where no run is longer than the window's tiles."""
    if token_layout == "balanced":
        parts = closed_balanced_parts(cu, ring, causal, window)
        if balanced_runs(parts, ring) * ring > ROUND_CELLS:
            p, tiles = balanced_pack(cu, ring, parts, causal, window)[:2]
            return (None if tiles is None else _even_pack(p, tiles, ring)), parts
        return None, parts
    if token_layout == "zigzag" and zigzag_runs(cu, ring) * ring > ROUND_CELLS:
        p, tiles = zigzag_pack(cu, ring, causal, window)
        return (None if tiles is None else _even_pack(p, tiles, ring)), None
    if token_layout == "contiguous" and contiguous_runs(cu, ring) * ring > ROUND_CELLS:
        p, tiles = contiguous_pack(cu, ring, causal, window)
        return (None if tiles is None else _even_pack(p, tiles, ring)), None
    return None, None


def _even_pack(p: np.ndarray, tiles: tuple, ring: int) -> tuple:
    """``pack_work`` of a pack whose rounds are taken as even (``round_stats``' even rounds) from each rank's work."""
    y = p / ring
    return p, np.full(ring, y.max()), np.full(ring, y.mean()), tiles


# ---------------------------------------------------------------- chunked layouts per document, in closed form
#
# Zigzag and the balancer's spread documents cut a document into 2P chunks, rank u holding chunks u and 2P-1-u.
# Past a ring of S/2P ranks a chunk is a token or none, so their runs number about S; but a rank's work from one
# document is linear in u between a few places (where a chunk gains its extra token, or where the extras before it
# stop growing), so each document gives a few linear pieces over the ranks, summed on difference arrays:
# O(documents + P) a pack, the same integers as the runs'.


def _cyclic_below(a, n, x, P: int):
    """How many of the n ranks a, a + 1, ... (mod P) lie below x (0 <= x <= P), elementwise."""
    return np.clip(x - a, 0, np.minimum(n, P - a)) + np.clip(x, 0, np.maximum(a + n - P, 0))


def _two_chunks(s1, c1, s2, c2, L, causal: bool, window=None):
    """Score entries of a rank's two chunks of a document of L tokens (c tokens from offset s) under the mask."""
    return (prefix_pairs(s1 + c1, L, causal, window) - prefix_pairs(s1, L, causal, window)
            + prefix_pairs(s2 + c2, L, causal, window) - prefix_pairs(s2, L, causal, window))


def _zigzag_starts(doc: tuple, P: int):
    """(first-half chunk u's offset, chunk 2P-1-u's offset) as functions of u, per zigzag document."""
    q, nA, nB, a = doc[:4]
    return (lambda u: u * q + _cyclic_below(a, nA, u, P),
            lambda u: (2 * P - 1 - u) * q + nA + nB - _cyclic_below(a, nB, u + 1, P))


def _spread_starts(doc: tuple, P: int):
    """(chunk u's offset, chunk 2P-1-u's offset) as functions of u, per spread document."""
    q, rem = doc[:2]
    return lambda u: u * q + np.minimum(u, rem), lambda u: (2 * P - 1 - u) * q + np.minimum(2 * P - 1 - u, rem)


def _windowed(doc: tuple, places: np.ndarray, starts, L, P: int, causal: bool, window: int | None):
    """(doc, places) of ``_piecewise_ranks`` under a window: the window per document appended to ``doc`` (its work
    functions read it), and the ranks whose chunks hold the offsets where ``prefix_pairs`` changes form
    (window_forms.window_places, from the chunks' offsets, linear in the rank between the layout's ``places``) with
    their neighbours as places: between them each chunk's entries stay linear."""
    if window is None:
        return doc, places
    W = np.full_like(L, window)
    at = window_places(*starts(tuple(x[:, None] for x in doc), P), [W] if causal else [W, L - W], P, places)
    return doc + (W,), np.concatenate([places, _near(at, P, False)], axis=1)


def _zigzag_doc_work(doc: tuple, u, P: int, causal: bool):
    """Rank u's entries of each per-document zigzag document (q, nA, nB, a, L): chunk k < P holds q tokens and one
    extra where k is among the nA ranks from a (mod P); chunk 2P-1-u one more where u is among the first nB of
    them (``layout._zigzag_extras``)."""
    q, nA, nB, a, L, *window = doc
    inA = _cyclic_below(a, nA, u + 1, P) - _cyclic_below(a, nA, u, P)
    inB = _cyclic_below(a, nB, u + 1, P) - _cyclic_below(a, nB, u, P)
    s2 = (2 * P - 1 - u) * q + nA + nB - _cyclic_below(a, nB, u + 1, P)
    return _two_chunks(u * q + _cyclic_below(a, nA, u, P), q + inA, s2, q + inB, L, causal, *window)


def _spread_doc_work(doc: tuple, u, P: int, causal: bool):
    """Rank u's entries (before the rotation) of each document the balancer spreads (q, rem, L): 2P even pieces,
    chunk k of q + [k < rem] tokens from kq + min(k, rem) (``layout.spread_sizes``)."""
    q, rem, L, *window = doc
    k2 = 2 * P - 1 - u
    return _two_chunks(u * q + np.minimum(u, rem), q + (u < rem), k2 * q + np.minimum(k2, rem), q + (k2 < rem), L,
                       causal, *window)


def _spread_doc_tokens(doc: tuple, u, P: int, causal: bool):
    """Rank u's tokens (before the rotation) of each document the balancer spreads (``_spread_doc_work``)."""
    q, rem = doc[:2]
    return 2 * q + (u < rem) + (2 * P - 1 - u < rem)


def _spread_places(rem: np.ndarray, P: int) -> np.ndarray:
    """``_piecewise_ranks``' places of spread documents: where chunk u or 2P-1-u gains its extra token, or the
    extras before it stop growing."""
    return _near(np.stack([rem, 2 * P - rem, 2 * P - 1 - rem], axis=1), P, False)


def spread_loads(cu: np.ndarray, ring: int, spread: np.ndarray, causal: bool = True, window: int | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(work, tokens) each rank holds of the documents the balancer spreads (``layout._spread_loads``), per document
    in closed form: the same integers, the work as float64."""
    if not len(spread):
        return np.zeros(ring), np.zeros(ring, dtype=np.int64)
    L = cu[spread + 1] - cu[spread]
    q, rem = np.divmod(L, 2 * ring)
    doc, places = _windowed((q, rem, L), _spread_places(rem, ring), _spread_starts, L, ring, causal, window)
    shift = spread % ring
    return (_piecewise_ranks(_spread_doc_work, doc, places, shift, ring, causal).astype(np.float64),
            _piecewise_ranks(_spread_doc_tokens, doc, places, shift, ring, causal))


def closed_balanced_parts(cu: np.ndarray, ring: int, causal: bool = True, window: int | None = None):
    """``layout.balanced_parts`` of the mask, its work in closed form (``work_before``, ``spread_loads``)."""
    return balanced_parts(cu, ring, work_before(cu, causal, window),
                          spread_loads=lambda c, p, s: spread_loads(c, p, s, causal, window))


def _piecewise_ranks(work, doc: tuple, places: np.ndarray, shift: np.ndarray, P: int, causal: bool) -> np.ndarray:
    """(P,) int64: the sum over documents of ``work`` (per document, linear in the rank u between its ``places``,
    a (documents, k) array of u's in [0, P] that includes 0 and P) at rank (u + shift) mod P: each piece read at
    its first two ranks, rotated (split where it wraps) and laid on difference arrays of intercepts and slopes."""
    places = np.sort(places, axis=1)
    lo, hi = places[:, :-1].ravel(), places[:, 1:].ravel()
    d = np.repeat(np.arange(len(places)), places.shape[1] - 1)
    keep = hi > lo
    lo, hi, d = lo[keep], hi[keep], d[keep]
    at = tuple(x[d] for x in doc)
    y0 = work(at, lo, P, causal)
    slope = np.where(hi - lo > 1, work(at, np.minimum(lo + 1, P - 1), P, causal) - y0, 0)
    r0 = lo + shift[d]  # in [0, 2P): a piece with r0 < P < r1 wraps
    wrap = (r0 < P) & (hi + shift[d] > P)
    cut = P - shift[d][wrap]  # the u at which rank P - 1 is passed
    lo_r = np.concatenate([r0 % P, np.zeros(int(wrap.sum()), dtype=np.int64)])
    hi_r = np.concatenate([np.where(wrap, P, (hi + shift[d] - 1) % P + 1), hi[wrap] + shift[d][wrap] - P])
    y = np.concatenate([y0, y0[wrap] + slope[wrap] * (cut - lo[wrap])])
    s = np.concatenate([slope, slope[wrap]])
    icpt = y - s * lo_r
    d_icpt, d_slope = np.zeros(P + 1, dtype=np.int64), np.zeros(P + 1, dtype=np.int64)
    for acc, v in ((d_icpt, icpt), (d_slope, s)):
        np.add.at(acc, lo_r, v)
        np.add.at(acc, hi_r, -v)
    return np.cumsum(d_icpt)[:P] + np.cumsum(d_slope)[:P] * np.arange(P, dtype=np.int64)


def _near(x: np.ndarray, P: int, cyclic: bool) -> np.ndarray:
    """(documents, 3 k + 2) places in [0, P]: 0, P, and each of the (documents, k) ``x`` less one, itself and one
    more, mod P where ``cyclic``, else clipped to [0, P]."""
    near = (x[:, :, None] + np.array([-1, 0, 1])).reshape(len(x), -1)
    ends = np.broadcast_to(np.array([0, P]), (len(x), 2))
    return np.concatenate([ends, near % P if cyclic else np.clip(near, 0, P)], axis=1)


def _even_cells(q, nA, nB, P: int):
    """(tokens a rank holds, how many ranks hold them) of each document whose ranks hold 2q tokens and one more on
    nA ranks, two more on nB of those: the (document, rank) cells of ``_document_rank_sizes``."""
    return (2 * q, 2 * q + 1, 2 * q + 2), (P - nA, nA - nB, nB)


def _tile_sums(m, roots, L, causal: bool) -> tuple[int, int, float]:
    """``pack_tiles`` without a window from each document's merged runs m and the sum of the square roots of its
    cells' tokens (the entries over length: pairs x roots^2 / L^2)."""
    pairs = document_pairs(L, causal)
    per_length = pairs * roots ** 2 / (L.astype(np.float64) ** 2)
    return int((m * (m + 1) // 2 if causal else m * m).sum()), int(pairs.sum()), float(per_length.sum())


def _roots(sizes, counts) -> np.ndarray:
    """Per document, the sum of sqrt(tokens) over its cells from ``_even_cells``."""
    return sum(n * np.sqrt(s.astype(np.float64)) for s, n in zip(sizes, counts))


def zigzag_runs(cu: np.ndarray, ring: int) -> int:
    """How many runs ``layout.document_runs`` gives the per-document zigzag: 2P a document of q >= 1 tokens a
    chunk, else its tokens (one extra each)."""
    L = np.diff(cu)
    return int(np.where(L >= 2 * ring, 2 * ring, L).sum())


def zigzag_pack(cu: np.ndarray, ring: int, causal: bool = True, window: int | None = None
                ) -> tuple[np.ndarray, tuple[int, int, float] | None]:
    """(each rank's score entries, ``pack_tiles``) of the per-document zigzag, per document in closed form
    (``_zigzag_doc_work``). Tiles: a document's nonzero chunks, less one where its last first-half
    chunk and the next nonzero one share a rank (chunk k < P on rank k and 2P-1-k: the highest rank among its
    first-half extras is also among its second-half ones, always where q >= 1); under a window
    ``_chunked_tiles`` (None where a run is longer than the window's tiles)."""
    P = ring
    L = np.diff(cu)
    q, rem = np.divmod(L, 2 * P)
    a = (np.cumsum(rem) - rem) % P
    nA, nB = np.minimum(rem, P), np.maximum(rem - P, 0)
    doc, places = _windowed((q, nA, nB, a, L), _near(np.stack([a, a + nA, a + nB], axis=1), P, True),
                            _zigzag_starts, L, P, causal, window)
    p = _piecewise_ranks(_zigzag_doc_work, doc, places, np.zeros(len(L), dtype=np.int64), P, causal)
    if window is not None:
        return p, _chunked_tiles("zigzag", P, cu, causal, window)
    top = np.where(a + nA >= P, P - 1, a + nA - 1)  # the highest rank among the first-half extras
    merged = (q > 0) | ((top - a) % P < nB)
    m = np.where(q > 0, 2 * P, rem) - merged
    return p, _tile_sums(m, _roots(*_even_cells(q, nA, nB, P)), L, causal)


def contiguous_spans(cu: np.ndarray, ring: int) -> tuple[np.ndarray, np.ndarray]:
    """(each rank's first token and the sequence's end: P + 1 bounds, each document's first rank) of the contiguous
    layout (``layout.document_runs``: rank r holds [r q + min(r, e), ...), S = q P + e)."""
    q, e = divmod(int(cu[-1]), ring)
    r = np.arange(ring + 1, dtype=np.int64)
    bounds = r * q + np.minimum(r, e)
    return bounds, np.searchsorted(bounds[1:], cu[:-1], side="right")


def contiguous_runs(cu: np.ndarray, ring: int) -> int:
    """How many runs the contiguous layout makes: each document one a rank it reaches."""
    bounds, first = contiguous_spans(cu, ring)
    return int((np.searchsorted(bounds[1:], cu[1:] - 1, side="right") - first + 1).sum())


def contiguous_pack(cu: np.ndarray, ring: int, causal: bool = True, window: int | None = None
                    ) -> tuple[np.ndarray, tuple[int, int, float] | None]:
    """(each rank's score entries, ``pack_tiles``) of the contiguous layout from its P + 1 bounds
    (``contiguous_spans``), not its runs: a rank's entries are the work before its last bound less that before its
    first (``work_before``'s integers); a document's tiles are the ranks it reaches, its cells a first and a last
    partial rank and whole ranks of q + 1 tokens (below e) or q between; under a window those four blocks of equal
    runs counted by window_forms.block_tiles (None where a run is longer than the window's tiles)."""
    L = np.diff(cu)
    bounds, a = contiguous_spans(cu, ring)
    z = np.searchsorted(bounds[1:], cu[1:] - 1, side="right")  # each document's last rank
    done = np.concatenate([[0], np.cumsum(document_pairs(L, causal, window))])
    d = np.minimum(np.searchsorted(cu, bounds, side="right") - 1, len(L) - 1)
    p = np.diff(done[d] + prefix_pairs(bounds - cu[d], L[d], causal, window))
    q, e = divmod(int(cu[-1]), ring)
    big = np.clip(np.minimum(z, e) - a - 1, 0, None)  # whole ranks of q + 1 tokens
    inner = np.maximum(z - a - 1, 0)
    ends = np.where(z > a, np.sqrt((bounds[a + 1] - cu[:-1]).astype(np.float64))
                    + np.sqrt((cu[1:] - bounds[z]).astype(np.float64)), np.sqrt(L.astype(np.float64)))
    roots = ends + big * np.sqrt(q + 1.0) + (inner - big) * np.sqrt(float(q))
    if window is None:
        return p, _tile_sums(z - a + 1, roots, L, causal)
    one, spans = np.ones_like(L), z > a
    n = np.stack([one, big, np.where(q > 0, inner - big, 0), spans.astype(np.int64)], axis=1)
    size = np.stack([np.where(spans, bounds[a + 1] - cu[:-1], L), np.full_like(L, q + 1), np.full_like(L, max(q, 1)),
                     cu[1:] - bounds[z]], axis=1)
    cut = min(max(window, MIN_TILE), int(cu[-1]))
    if int(np.where(n > 0, size, 0).max()) > cut:
        return p, None
    pairs = document_pairs(L, causal, window)
    per_length = np.maximum(pairs * roots ** 2 / (L.astype(np.float64) ** 2), pairs / cut)
    F = np.cumsum(n * size, axis=1) - n * size
    return p, (block_tiles(F, n, size, window, causal), int(pairs.sum()), float(per_length.sum()))


def balanced_pack(cu: np.ndarray, ring: int, parts, causal: bool = True, window: int | None = None
                  ) -> tuple[np.ndarray, tuple[int, int, float] | None, int]:
    """(each rank's score entries, ``pack_tiles``, its runs) of the balancer from its ``parts``
    (``layout.balanced_parts``): the spread documents per document in closed form (``_spread_doc_work``, rotated by
    their index), 2P - 1 runs each (chunks P - 1 and P share a rank); the runs placed whole or poured as runs.
    Under a window the tiles are ``_chunked_tiles``' (None where a run is longer than the window's tiles)."""
    P = ring
    spread, (start, stop, rank) = parts
    L = np.diff(cu)
    p, m, roots = np.zeros(P, dtype=np.int64), np.zeros(len(L), dtype=np.int64), np.zeros(len(L))
    if len(start):
        o = np.argsort(start, kind="stable")
        start, stop, rank, doc = _merged(start[o], stop[o], rank[o], run_documents(start[o], cu))
        p = run_rank_pairs((start, stop, rank), cu, P, causal, window)
        m = np.bincount(doc, minlength=len(L))
        sizes, owner = _document_rank_sizes(doc, rank, stop - start, len(L), P)
        roots = np.bincount(owner, weights=np.sqrt(sizes), minlength=len(L))
    if len(spread):
        q, rem = np.divmod(L[spread], 2 * P)
        doc, places = _windowed((q, rem, L[spread]), _spread_places(rem, P), _spread_starts, L[spread], P, causal,
                                window)
        p = p + _piecewise_ranks(_spread_doc_work, doc, places, spread % P, P, causal)
        m[spread] = 2 * P - 1
        roots[spread] = _roots(*_even_cells(q, np.minimum(rem, P), np.maximum(rem - P, 0), P))
    if window is not None:
        return p, _chunked_tiles("balanced", P, cu, causal, window, parts), balanced_runs(parts, P)
    return p, _tile_sums(m, roots, L, causal), balanced_runs(parts, P)


def balanced_runs(parts, ring: int) -> int:
    """How many runs the balancer's ``parts`` make (``layout.parts_runs``): 2P - 1 a spread document (its chunks
    P - 1 and P share a rank, and none is empty), and the placed ones, maximal already (a document poured goes to
    distinct ranks)."""
    spread, placed = parts
    return len(placed[0]) + len(spread) * (2 * ring - 1)


def layer_windows(work: Workload, layers: int) -> tuple[tuple[int | None, int], ...]:
    """(window, how many layers) of the workload's layers: its window on the windowed ones, None on global ones."""
    w = work.window
    if w is None:
        return ((None, layers),)
    local = w.windowed_layers(layers)
    return tuple((win, n) for win, n in ((w.size, local), (None, layers - local)) if n)


@lru_cache(maxsize=1024)
def mask_fraction(work: Workload, layers: int) -> float:
    """The mask's expected score entries per sequence over its S^2, averaged over the layers' windows."""
    mix = layer_windows(work, layers)
    S = work.seq_len
    pairs = sum(n * busiest_rank_pairs(work, "contiguous", 1, w).pairs for w, n in mix) / sum(n for _, n in mix)
    return pairs / (S * S)


class RoundWork(NamedTuple):
    """Per ring round i (rank r holds the K, V of rank r - i), in expectation over the workload's packs: the busiest
    rank's score entries, the ranks' mean, and the share of packs in which no rank has work (a transfer to skip)."""

    busiest: tuple[float, ...]
    mean: tuple[float, ...]
    empty: tuple[float, ...]
    samples: int


def round_pairs(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(P,) busiest and mean score entries of each ring round of a ``pair_matrix``: round i pairs rank r's queries
    with rank (r - i) mod P's keys."""
    P = len(matrix)
    r = np.arange(P)
    rounds = np.stack([matrix[r, (r - i) % P] for i in range(P)])
    return rounds.max(axis=1), rounds.mean(axis=1)


def ring_round_pairs(work: Workload, token_layout: str, ring: int, window: int | None = None) -> RoundWork:
    """Each ring round's busiest rank's and mean score entries per sequence, and how often the mask empties the
    round, in expectation over PACK_SAMPLES seeded packs (one without documents) under ``window``: a ring round
    waits on its busiest rank, and a round the mask empties needs no transfer (a windowed ring's far ranks)."""
    return RoundWork(*(_per_round(x, 1) for x in round_arrays(work, token_layout, ring, window)),
                     _layout_work(work, token_layout, ring, window)[0].samples)


def round_arrays(work: Workload, token_layout: str, ring: int, window: int | None = None) -> tuple[np.ndarray, ...]:
    """``ring_round_pairs``' busiest, mean and empty per round as (P,) read-only float64 arrays (the same floats),
    for callers that compute on them: no P-long tuple of floats made and read back."""
    return _layout_work(work, token_layout, ring, window)[1]


def _ramp(n, nb):
    """sum_{u=1..n} min(u, nb), 0 for n <= 0 (int64 arrays)."""
    n = np.maximum(n, 0)
    m = np.minimum(n, nb)
    n -= m
    n *= nb  # each u past nb adds nb
    out = m + 1
    out *= m
    out >>= 1  # m >= 0: a shift halves exactly, and costs less than a division
    out += n  # in place: three arrays made, not seven
    return out


def _pairs_at_least(y, a0, a1, b0, nb):
    """Pairs (t, k) of query run [a0, a1) and key run [b0, b0 + nb) with t - k >= y: sum_t clamp(t - y - b0 + 1, 0,
    nb) = ramp(a1 - y - b0) - ramp(a0 - y - b0)."""
    return _ramp(a1 - y - b0, nb) - _ramp(a0 - y - b0, nb)


#: rows of runs x ranks built at once by ``_causal_run_matrix`` (its memory: 8 bytes each)
RUN_BLOCK_CELLS = 1 << 22


def _doc_counts(doc: np.ndarray, rank: np.ndarray, n: np.ndarray, docs: int, ring: int) -> np.ndarray:
    """(documents, P) tokens of each rank in each document."""
    return np.bincount(doc * ring + rank, weights=n, minlength=docs * ring).reshape(docs, ring)


def _causal_run_matrix(start, stop, rank, doc, docs: int, ring: int) -> np.ndarray:
    """(P, P) float causal pairs without a window: run A's n_A queries see the keys of its document before it, K(a0) -
    K(document start) per rank (K: keys before a position), and n_A(n_A + 1)/2 of its own. The K(a0) term is built
    over runs in blocks of RUN_BLOCK_CELLS; the document-start term is C^T (C's exclusive cumsum), C the documents'
    rank counts. O(runs x P) in all."""
    n = (stop - start).astype(np.float64)
    out = np.zeros((ring, ring))
    carry = np.zeros(ring)
    step = max(1, RUN_BLOCK_CELLS // ring)
    for i in range(0, len(n), step):
        nb, rb = n[i:i + step], rank[i:i + step]
        y = np.zeros((len(nb), ring))
        y[np.arange(len(nb)), rb] = nb
        k = np.cumsum(y, axis=0) - y + carry  # keys of each rank before each run
        carry = carry + y.sum(axis=0)
        order = np.argsort(rb, kind="stable")
        present, first = np.unique(rb[order], return_index=True)
        out[present] += np.add.reduceat(nb[order, None] * k[order], first, axis=0)
    c = _doc_counts(doc, rank, n, docs, ring)
    out -= c.T @ (np.cumsum(c, axis=0) - c)  # the keys before each document's start
    out[np.diag_indices(ring)] += np.bincount(rank, weights=n * (n + 1) / 2, minlength=ring)
    return out


def _windowed_run_matrix(start, stop, rank, ds, de, ring: int, causal: bool, window: int) -> np.ndarray:
    """(P, P) float pairs under a window: every pair of runs A (queries) and B (keys) of one document within the
    window's reach, its pairs with offset t - k in the mask's range in closed form (``_windowed_run_cells``)."""
    qr, kr, pairs = _windowed_run_cells(start, stop, rank, ds, de, causal, window)
    return np.bincount(qr * ring + kr, weights=pairs, minlength=ring * ring).reshape(ring, ring)


def _windowed_run_cells(start, stop, rank, ds, de, causal: bool, window: int) -> tuple[np.ndarray, ...]:
    """(query rank, key rank, float pairs) of every pair of runs of one document within the window's reach
    (``_pairs_at_least``), in the order ``_windowed_run_matrix`` sums them."""
    reach = window - 1
    lo = np.maximum(ds, start - reach)  # the first key any query of the run sees
    hi = stop - 1 if causal else np.minimum(de - 1, stop - 1 + reach)  # the last
    first = np.searchsorted(stop, lo, side="right")
    n = np.searchsorted(start, hi, side="right") - first
    offset = np.cumsum(n) - n  # run a's cells: offset[a] .. offset[a] + n[a] - 1, keys first[a], first[a] + 1, ...
    b = np.arange(int(n.sum())) + np.repeat(first - offset, n)
    size = stop - start
    nb, na = size[b], np.repeat(size, n)  # a run's own values repeated over its cells, not gathered
    d1 = np.repeat(stop, n) - start[b]  # a1 - b0 (and a0 - b0 = d1 - n_A)
    # _pairs_at_least(y) - _pairs_at_least(window) on the offsets, exact integers
    if causal:
        k = np.arange(len(start)) - first  # run a's place among its keys
        pairs = _causal_full((offset + k)[(k >= 0) & (k < n)], na, nb)
    else:
        pairs = _ramp(d1 + reach, nb) - _ramp(d1 - na + reach, nb)
    far = np.flatnonzero(d1 > window)  # the others lie within the window: both of its ramps are 0
    d1, na, nb = d1[far], na[far], nb[far]
    pairs[far] -= _ramp(d1 - window, nb) - _ramp(d1 - na - window, nb)
    return np.repeat(rank, n), rank[b], pairs


def _causal_full(own, na, nb):
    """``_pairs_at_least(0)`` of query run a and key run b <= a of disjoint runs in token order: b before a ends
    by a's start (a0 - b0 >= n_B, both ramps past n_B: n_A n_B), a run with itself (cells ``own``) n(n + 1)/2."""
    full = na * nb
    full[own] = (na[own] * (na[own] + 1)) >> 1
    return full


def _cell_round_stats(qr: np.ndarray, kr: np.ndarray, pairs: np.ndarray, ring: int) -> tuple[np.ndarray, np.ndarray]:
    """(P,) busiest and mean score entries of each ring round from cells (query rank, key rank, pairs) without the
    (P, P) matrix: each rank pair's cells summed in their order and rounded as ``run_pair_matrix`` sums and rounds
    them, then per round (query rank less key rank, mod P) the largest (0 where no rank has any) and the sum over
    P (float64 sums of exact integers, as the matrix's mean)."""
    key, where = np.unique(qr * ring + kr, return_inverse=True)
    v = np.rint(np.bincount(where, weights=pairs, minlength=len(key))).astype(np.int64)
    rnd = (key // ring - key % ring) % ring
    busiest = np.zeros(ring, dtype=np.int64)
    np.maximum.at(busiest, rnd, v)
    return busiest, np.bincount(rnd, weights=v, minlength=ring) / ring


#: pairs of runs under a window, over P^2, below which ``round_stats`` reads the rounds off them (not the matrix)
CELL_SHARE = 1 / 8


def _pairs_of_runs(n: np.ndarray, rank: np.ndarray, doc: np.ndarray, ring: int) -> np.ndarray:
    """(P, P) float causal pairs without a window of runs in token order (``n`` tokens each, ``doc`` nondecreasing):
    every pair of runs of one document, B before A, adds n_A n_B at [rank A, rank B], and each run n(n + 1)/2 of
    its own on the diagonal. O(pairs of runs): for documents of few runs."""
    first = np.searchsorted(doc, doc, side="left")
    cnt = np.arange(len(n)) - first
    a = np.repeat(np.arange(len(n)), cnt)
    b = first[a] + np.arange(len(a)) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    out = np.bincount(rank[a] * ring + rank[b], weights=n[a] * n[b], minlength=ring * ring).astype(np.float64)
    out = out.reshape(ring, ring)  # (an empty count comes back as ints)
    out[np.diag_indices(ring)] += np.bincount(rank, weights=n * (n + 1) / 2, minlength=ring)
    return out


#: documents from which ``_cross`` multiplies in float64 through BLAS (its fixed cost beaten), below by einsum's loop
BLAS_ROWS = 16


def _cross(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """A^T B of (documents, P) int64 arrays: [r, j] = sum_d A[d, r] B[d, j]. Many documents: a float64 product, exact
    while each entry (score entries between two ranks of one sequence, at most S^2) stays below 2^53."""
    if len(A) < BLAS_ROWS:
        return np.einsum("dr,dj->rj", A, B)
    return (A.astype(np.float64).T @ B.astype(np.float64)).astype(np.int64)


def _zigzag_pair_matrix(F: np.ndarray, G: np.ndarray) -> np.ndarray:
    """(P, P) float causal pairs without a window of documents laid as zigzag chunks: F[d, r] the tokens of document
    d's chunk on rank r in its first half (ranks ascending), G[d, r] in its second half (ranks descending). Rank r's
    first chunk sees the first chunks of ranks j < r; its second chunk every first chunk and the second chunks of
    ranks j > r; each chunk c(c + 1)/2 of itself: tril(F^T F) + G^T F + triu(G^T G) and the diagonal, three matrix
    products, O(D P^2) multiply-adds."""
    F = F.astype(np.int64)  # integer products: exact, and einsum's own loop (no BLAS threads for small products)
    out = np.tril(_cross(F, F), -1)
    if G is not None:  # None: no second half (contiguous)
        G = G.astype(np.int64)
        out += _cross(G, F) + np.triu(_cross(G, G), 1)
        out[np.diag_indices(len(out))] += (G * (G + 1) // 2).sum(axis=0)
    out[np.diag_indices(len(out))] += (F * (F + 1) // 2).sum(axis=0)
    return out


def _zigzag_halves(sizes: np.ndarray, ring: int) -> tuple[np.ndarray, np.ndarray]:
    """(F, G) of ``_zigzag_pair_matrix`` from (documents, 2P) chunk sizes, chunk k < P on rank k, 2P-1-k on k."""
    return sizes[:, :ring], sizes[:, ring:][:, ::-1]


#: a document with runs on at least this share of the ranks goes through the matrix products
#: (``_zigzag_pair_matrix``, P^2 a document); one with fewer through pairs of runs (runs^2)
DENSE_SHARE = 1 / 6


def _zigzag_causal_matrix(cu: np.ndarray, ring: int) -> np.ndarray:
    """(P, P) float causal pairs without a window of the per-document zigzag (layout._zigzag_sizes)."""
    sizes, chunk_rank = _zigzag_sizes(cu, ring)
    dense = (sizes > 0).sum(axis=1) >= DENSE_SHARE * 2 * ring
    out = _zigzag_pair_matrix(*_zigzag_halves(sizes[dense], ring)).astype(np.float64)
    sparse = sizes[~dense]
    if len(sparse):
        doc, chunk = np.nonzero(sparse)  # row-major: documents in order, each one's chunks in token order
        out += _pairs_of_runs(sparse[doc, chunk].astype(np.float64), chunk_rank[chunk], doc, ring)
    return out


def _balanced_causal_matrix(cu: np.ndarray, ring: int, before) -> np.ndarray:
    """(P, P) float causal pairs without a window of the balancer (layout.balanced_parts): its spread documents
    zigzag chunks rotated by their index d (``_zigzag_pair_matrix`` per rotation, rolled by d mod P), the others
    pairs of runs (one run a whole document, a few a poured one)."""
    spread, (start, stop, rank) = balanced_parts(cu, ring, before)
    order = np.argsort(start, kind="stable")
    start, stop, rank = start[order], stop[order], rank[order]
    out = _pairs_of_runs((stop - start).astype(np.float64), rank, np.searchsorted(cu, start, side="right"), ring)
    sizes, shift = spread_sizes(cu, ring, spread), spread % ring
    for s in np.unique(shift):
        _add_rolled(out, _zigzag_pair_matrix(*_zigzag_halves(sizes[shift == s], ring)), int(s))
    return out


def _run_pair_cells(n: np.ndarray, rank: np.ndarray, doc: np.ndarray) -> tuple[np.ndarray, ...]:
    """``_pairs_of_runs`` as cells: (query rank, key rank, entries) of every pair of runs of one document, B before
    A, then (rank, entries) of each run's own n(n + 1)/2."""
    first = np.searchsorted(doc, doc, side="left")
    cnt = np.arange(len(n)) - first
    a = np.repeat(np.arange(len(n)), cnt)
    b = first[a] + np.arange(len(a)) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    return rank[a], rank[b], n[a] * n[b], rank, n * (n + 1) // 2


def _changes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, position) of each entry of a (D, P) array that differs from the one before it, cyclically."""
    return np.nonzero(x != np.roll(x, 1, axis=1))


def _chunk_round_stats(F: np.ndarray, G: np.ndarray, shift: np.ndarray, ring: int, cells) -> tuple[np.ndarray, ...]:
    """(P,) busiest and summed score entries of each causal ring round of documents laid as zigzag chunks (F, G: the
    first and second half's chunk sizes on each rank, ``_zigzag_pair_matrix``; document d rolled by shift[d]) plus
    ``cells`` (``_run_pair_cells`` of the other runs), without the (P, P) matrix. Document d gives its rank u (rank
    u + shift[d]) in round i >= 1 F[u - i] H[u] where u >= i (its first-half keys of rank u - i precede every query
    of rank u) and G[u] H[u - i + P] below (its second-half queries see every key of the rank after it), H = F + G:
    along a round the entries change only where F, G or H change (shifted by i) or at u = 0 and u = i, so each
    round is a few constant pieces, each read once at its first rank: O(P x pieces x documents)."""
    P = ring
    D = len(F)
    H = F + G
    rows = np.arange(D)
    fixed, moving = [(rows, np.zeros(D, dtype=np.int64))], [(rows, np.zeros(D, dtype=np.int64))]
    fixed += [_changes(H), _changes(G)]
    moving += [_changes(F), _changes(H)]
    at = lambda parts: np.concatenate([(shift[d] + u) % P for d, u in parts])  # noqa: E731 - ranks
    base, step = np.append(at(fixed), 0), at(moving)  # rank 0: a piece even without documents
    i = np.arange(1, P)[:, None]
    starts = np.sort(np.concatenate([np.broadcast_to(base, (P - 1, len(base))), (step[None, :] + i) % P], axis=1),
                     axis=1)  # (rounds, pieces): each piece's first rank
    length = np.diff(starts, axis=1, append=starts[:, :1] + P)
    value = np.zeros(starts.shape, dtype=np.int64)
    for d in range(D):
        u = (starts - shift[d]) % P
        hi = u >= i
        value += np.where(hi, F[d][(u - i) % P] * H[d][u], G[d][u] * H[d][(u - i) % P])
    busiest = np.concatenate([[0], value.max(axis=1)])
    total = np.concatenate([[0], (value * length).sum(axis=1)])
    diag = np.zeros(P, dtype=np.int64)
    for d in range(D):
        np.add.at(diag, (np.arange(P) + shift[d]) % P, F[d] * (F[d] + 1) // 2 + G[d] * (G[d] + 1) // 2 + G[d] * F[d])
    qr, kr, w, own_rank, own = cells
    rnd = (qr - kr) % P
    np.add.at(diag, own_rank, own)
    np.add.at(diag, qr[rnd == 0], w[rnd == 0])  # earlier runs of a document on the same rank
    busiest[0], total[0] = diag.max(), diag.sum()
    qr, rnd, w = qr[rnd > 0], rnd[rnd > 0], w[rnd > 0]
    if len(w):
        key, where = np.unique(rnd * P + qr, return_inverse=True)
        extra = np.bincount(where, weights=w).astype(np.int64)  # exact: integer entries below 2^53
        ci, cr = key // P, key % P
        dense = np.zeros(len(key), dtype=np.int64)
        for d in range(D):
            u = (cr - shift[d]) % P
            dense += np.where(u >= ci, F[d][(u - ci) % P] * H[d][u], G[d][u] * H[d][(u - ci) % P])
        np.maximum.at(busiest, ci, dense + extra)
        total += np.bincount(ci, weights=extra, minlength=P).astype(np.int64)
    return busiest, total


def _zigzag_chunk_parts(cu: np.ndarray, ring: int) -> tuple:
    """(F, G, shift, cells) of ``_chunk_round_stats`` for the per-document zigzag: its dense documents' halves
    (``_zigzag_causal_matrix``' split), the other chunks as runs."""
    sizes, chunk_rank = _zigzag_sizes(cu, ring)
    dense = (sizes > 0).sum(axis=1) >= DENSE_SHARE * 2 * ring
    F, G = _zigzag_halves(sizes[dense].astype(np.int64), ring)
    sparse = sizes[~dense]
    doc, chunk = np.nonzero(sparse)  # row-major: documents in order, each one's chunks in token order
    cells = _run_pair_cells(sparse[doc, chunk].astype(np.int64), chunk_rank[chunk], doc)
    return F, G, np.zeros(len(F), dtype=np.int64), cells


def _balanced_chunk_parts(cu: np.ndarray, ring: int, before, parts=None) -> tuple:
    """(F, G, shift, cells) of ``_chunk_round_stats`` for the balancer (``_balanced_causal_matrix``' split): its
    spread documents' halves rolled by their index, the whole and poured runs as cells; ``parts``: ``balanced_parts``' causal ones, where built."""
    spread, (start, stop, rank) = balanced_parts(cu, ring, before) if parts is None else parts
    order = np.argsort(start, kind="stable")
    start, stop, rank = start[order], stop[order], rank[order]
    cells = _run_pair_cells(stop - start, rank, np.searchsorted(cu, start, side="right"))
    F, G = _zigzag_halves(spread_sizes(cu, ring, spread).astype(np.int64), ring)
    return F, G, spread % ring, cells


#: a round's pieces in ``_chunk_round_stats``, over the ring degree, up to which they are counted rather than the
#: (P, P) matrix
PIECES_SHARE = 1 / 4


def chunk_round_stats(token_layout: str, ring: int, cu_seqlens, parts=None) -> tuple[np.ndarray, np.ndarray]:
    """(P,) busiest and mean score entries of each causal ring round (no window) of zigzag or the balancer from
    their chunks' pieces (``_chunk_round_stats``), the max and mean of the counted rounds; or, where the documents
    cut each round into so many pieces that the matrix costs less, from the same chunks (``_chunk_matrix``)."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    parts = (_zigzag_chunk_parts(cu, ring) if token_layout == "zigzag"
             else _balanced_chunk_parts(cu, ring, work_before(cu, True, None), parts))
    F, G = parts[0], parts[1]
    pieces = 2 * len(F) + sum(len(_changes(x)[0]) for x in (F, G, F + G))
    if pieces > PIECES_SHARE * ring or len(parts[3][0]) > ring * ring // 8:
        by_rank = _diagonals(_chunk_matrix(*parts[:3], ring, parts[3]))
        return by_rank.max(axis=0)[::-1], by_rank.mean(axis=0)[::-1]  # exact integer sums: any order
    busiest, total = _chunk_round_stats(*parts[:3], ring, parts[3])
    return busiest, total / ring  # as the mean of the exact integers: their float64 sum over P


def _chunk_matrix(F: np.ndarray, G: np.ndarray, shift: np.ndarray, ring: int, cells) -> np.ndarray:
    """(P, P) int64 pair matrix of ``_chunk_round_stats``' documents and cells (``causal_layout_matrix`` of zigzag or
    the balancer): each shift's documents by ``_zigzag_pair_matrix``, rolled, and the cells counted in."""
    qr, kr, w, own_rank, own = cells
    out = np.bincount(qr * ring + kr, weights=w, minlength=ring * ring).astype(np.int64).reshape(ring, ring)
    out[np.diag_indices(ring)] += np.bincount(own_rank, weights=own, minlength=ring).astype(np.int64)
    for s in np.unique(shift):
        _add_rolled(out, _zigzag_pair_matrix(F[shift == s], G[shift == s]), int(s))
    return out


def _add_rolled(out: np.ndarray, z: np.ndarray, s: int) -> None:
    """out += np.roll(z, (s, s), axis=(0, 1)), in place by its four blocks (no rolled copy of a P x P matrix)."""
    n = len(z) - s
    out[s:, s:] += z[:n, :n]
    if s:
        out[:s, :s] += z[n:, n:]
        out[s:, :s] += z[:n, n:]
        out[:s, s:] += z[n:, :n]


def causal_layout_matrix(token_layout: str, ring: int, cu_seqlens) -> np.ndarray:
    """(P, P) int64 ``pair_matrix`` of a causal mask without a window under contiguous, zigzag or balanced, from the
    layout's structure: contiguous by pairs of runs (a document's runs are on consecutive ranks), zigzag and the
    balancer's spread documents by matrix products of their chunk sizes (``_zigzag_pair_matrix``)."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    if token_layout == "zigzag":
        m = _zigzag_causal_matrix(cu, ring)
    elif token_layout == "balanced":
        m = _balanced_causal_matrix(cu, ring, work_before(cu, True, None))
    else:
        m = _contiguous_causal_matrix(cu, ring)
    return np.rint(m).astype(np.int64)


def _contiguous_causal_matrix(cu: np.ndarray, ring: int) -> np.ndarray:
    """(P, P) float causal pairs without a window of the contiguous layout: a document's runs lie on consecutive
    ranks in rank order, so the documents spanning many ranks are ``_zigzag_pair_matrix`` with no second half (their
    rank counts F), the others pairs of runs."""
    start, stop, rank = document_runs("contiguous", ring, cu)
    doc = np.searchsorted(cu, start, side="right") - 1
    n = (stop - start).astype(np.float64)
    dense = (np.bincount(doc, minlength=len(cu) - 1) >= DENSE_SHARE * ring)[doc]
    out = _pairs_of_runs(n[~dense], rank[~dense], doc[~dense], ring)
    if dense.any():
        rows = np.unique(doc[dense], return_inverse=True)[1]
        F = np.zeros((rows.max() + 1, ring), dtype=np.int64)
        F[rows, rank[dense]] = n[dense]
        out += _zigzag_pair_matrix(F, None)
    return out


def run_pair_matrix(runs: tuple[np.ndarray, np.ndarray, np.ndarray], cu_seqlens, ring: int, causal: bool = True,
                    window: int | None = None) -> np.ndarray:
    """(P, P) ``pair_matrix`` from ``runs`` (start, stop, rank: intervals of one rank's tokens inside one document,
    layout.document_runs) instead of tokens: causal without a window by prefix counts (``_causal_run_matrix``),
    bidirectional without one C^T C (C: the documents' rank counts), under a window by pairs of runs in reach
    (``_windowed_run_matrix``). A window no shorter than the longest document is none. Sums in float64: exact below
    2^53 score entries per rank pair."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    start, stop, rank = runs
    doc = np.searchsorted(cu, start, side="right") - 1
    if window is not None and window >= int(np.diff(cu).max()):
        window = None
    if window is not None:
        m = _windowed_run_matrix(start, stop, rank, cu[doc], cu[doc + 1], ring, causal, window)
    else:
        if causal:
            m = _causal_run_matrix(start, stop, rank, doc, len(cu) - 1, ring)
        else:
            c = _doc_counts(doc, rank, (stop - start).astype(np.float64), len(cu) - 1, ring)
            m = c.T @ c
    return np.rint(m).astype(np.int64)


def _residues(n, P: int):
    """(D, P): how many x in [0, n) have x = c (mod P), for each row's n and each residue c."""
    return np.maximum(0, (np.asarray(n)[:, None] - np.arange(P) + P - 1) // P)


def _striped_side(first: np.ndarray, step: int, lengths: np.ndarray, window: int | None, P: int) -> np.ndarray:
    """(P rounds, P ranks) of one side of each query's reach when a document's offset o lives on rank (first + step
    o) mod P: the offsets d in [0, reach(o)] with d = i (mod P), reach(o) = min(o, W - 1). Per residue c of o, the
    offsets below a = min(L, W) reach o itself (qP + c for q = 0..K-1: sum q = K(K-1)/2, each at residue c), those
    from a on reach W - 1 (q_W P + rho_W each): O(D P) for D documents."""
    a = lengths if window is None else np.minimum(lengths, window)
    below = _residues(a, P)
    beyond = _residues(lengths, P) - below
    q_far, rho_far = divmod(window - 1, P) if window is not None else (0, 0)
    rank = (first[:, None] + step * np.arange(P)) % P
    flat = rank.ravel()
    q = np.bincount(flat, weights=(below * (below - 1) // 2 + beyond * q_far).ravel(), minlength=P)
    hist = np.bincount((rank * P + np.arange(P)).ravel(), weights=below.ravel(), minlength=P * P).reshape(P, P)
    hist[:, rho_far] += np.bincount(flat, weights=beyond.ravel(), minlength=P)
    at_least = hist[:, ::-1].cumsum(axis=1)[:, ::-1]  # [r, i]: queries of rank r whose reach's residue is >= i
    return (q[:, None] + at_least).T


def _striped_reach(cu: np.ndarray, window: int | None, P: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(q, rank, column, weight) of ``_striped_side``'s causal rounds, R[i, r] = q[r] + the weights of rank r's
    entries whose column is at least i: the queries' whole periods q, and per document and offset residue c (on rank
    (start + c) mod P) the queries reaching residue c (column c) or, past the window's first W, W - 1 (column
    (W - 1) mod P). Only a document's min(L, P) residues: O(sum of min(L, P)), not D x P."""
    lengths = np.diff(cu)
    m = np.minimum(lengths, P)
    doc = np.repeat(np.arange(len(lengths)), m)
    c = np.arange(len(doc), dtype=np.int64) - np.repeat(np.cumsum(m) - m, m)
    L = lengths[doc]
    a = L if window is None else np.minimum(L, window)
    below = a // P + (c < a % P)  # offsets below min(L, W) of residue c
    beyond = L // P + (c < L % P) - below
    q_far, rho_far = divmod(window - 1, P) if window is not None else (0, 0)
    rank = (cu[:-1][doc] + c) % P
    q = np.bincount(rank, weights=below * (below - 1) // 2 + beyond * q_far, minlength=P)
    hit, far = below > 0, beyond > 0
    return (np.rint(q).astype(np.int64), np.concatenate([rank[hit], rank[far]]),
            np.concatenate([c[hit], np.full(int(far.sum()), rho_far, dtype=np.int64)]),
            np.concatenate([below[hit], beyond[far]]))


def contiguous_round_stats(cu_seqlens, ring: int, runs=None) -> tuple[np.ndarray, np.ndarray]:
    """(P,) busiest and mean score entries of each causal ring round (no window) of the contiguous layout, from its
    documents alone, O(P + documents), as the max and mean over the ranks of the counted rounds. The ring's first
    round (i = 0) is each rank's runs, n(n + 1)/2 each. In round i >= 1 rank r computes its queries on the keys of
    rank r - i; only a document on both ranks joins them (the keys of r - i < r all come first), and only one can span two ranks, so
    a document on m consecutive ranks a.. with tokens g[0..m-1] gives rank a + k the entry g[k] g[k - i] for
    k >= i. Its middle ranks are whole: rank sizes q + [rank < S mod P], non-increasing, so of the middle pairs
    (k from i + 1 to m - 2) the first is the largest and their sum is counted from how many hold q + 1. ``runs``:
    the layout's (``layout_runs``), where already built."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    P = ring
    q, e = divmod(int(cu[-1]), P)
    start, stop, rank = document_runs("contiguous", P, cu) if runs is None else runs
    n = stop - start
    doc = np.searchsorted(cu, start, side="right") - 1
    first = np.flatnonzero(np.concatenate([[True], doc[1:] != doc[:-1]]))
    m = np.diff(np.append(first, len(doc)))  # ranks each document spans
    a, g0, gl = rank[first], n[first], n[first + m - 1]
    d = np.repeat(np.arange(len(m)), m - 1)  # (document, round i) for i = 1 .. m - 1
    i = np.arange(len(d), dtype=np.int64) - np.repeat(np.cumsum(m - 1) - (m - 1), m - 1) + 1
    M, A = m[d], a[d]
    size = lambda r: q + (r < e)  # noqa: E731 - whole ranks' tokens (_even_pieces)
    last_pair = (M - 1 > i)  # k = m - 1 pairs with a middle rank m - 1 - i (k = i: the first rank)
    v_first = np.where(i <= M - 2, size(A + i), gl[d]) * g0[d]
    v_last = np.where(last_pair, gl[d] * size(A + M - 1 - i), 0)
    middle = np.maximum(M - 2 - i, 0)
    v_mid = np.where(middle > 0, size(A + i + 1) * size(A + 1), 0)
    t = np.clip(e - A - 1, 0, np.maximum(M - 2, 0))  # middle ranks of q + 1 tokens: k = 1 .. t
    both = np.maximum(np.minimum(t, M - 2) - i, 0)  # k <= t (so k - i <= t too)
    key_big = np.maximum(np.minimum(t, M - 2 - i), 0)  # k - i <= t
    total = np.bincount(i, weights=v_first + v_last + middle * q * q + q * (both + key_big) + both, minlength=P)
    busiest = np.zeros(P, dtype=np.int64)
    np.maximum.at(busiest, i, np.maximum(np.maximum(v_first, v_last), v_mid))
    diag = np.rint(np.bincount(rank, weights=n * (n + 1) // 2, minlength=P)).astype(np.int64)
    busiest[0], total[0] = diag.max(), diag.sum()
    return busiest, np.rint(total) / P  # as the mean of the exact integers: their float64 sum over P


def _few_reach_entries(cu_seqlens, ring: int) -> bool:
    """Whether ``striped_round_stats``' entries (a document's min(L, P) residues) number under REACH_SHARE of the P^2
    rounds' matrix: many short documents fill it, and its dense count (``striped_rounds``) costs no more there."""
    return int(np.minimum(np.diff(np.asarray(cu_seqlens, dtype=np.int64)), ring).sum()) < REACH_SHARE * ring * ring


#: the share of the P^2 rounds' matrix below which striped rounds are counted from their reach entries
REACH_SHARE = 1 / 8


def striped_round_stats(cu_seqlens, ring: int, window: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(P,) busiest and mean score entries of each causal ring round when token t lives on rank t mod P, as the max
    and mean over the ranks of ``striped_rounds`` without its (P, P) matrix. A rank's work in round i, q[r] plus
    its reach entries of column >= i (``_striped_reach``), only grows as i falls, so the busiest rank of round i is
    that of round i + 1 or one whose entry sits at column i: each entry's rank total (its rank's weights from the
    highest column down to it) read once, then a running max from the last round down. Exact integers."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    P = ring
    q, rank, col, w = _striped_reach(cu, window, P)
    small = np.int16 if P <= np.iinfo(np.int16).max else np.int64  # stable sorts of int16: radix sorts
    order = np.argsort((P - 1 - col).astype(small), kind="stable")  # columns high to low, then (stable) ranks:
    order = order[np.argsort(rank[order].astype(small), kind="stable")]  # each rank's entries from its highest down
    r, c, w = rank[order], col[order], w[order]
    run = np.cumsum(w)
    first = np.searchsorted(r, r, side="left")  # each rank's first entry
    value = q[r] + run - (run[first] - w[first])  # q[r] + its weights at columns >= c
    at = np.full(P, -1, dtype=np.int64)
    np.maximum.at(at, c, value)
    busiest = np.maximum.accumulate(np.maximum(at, q.max())[::-1])[::-1]
    total = int(q.sum()) + np.cumsum(np.bincount(c, weights=w, minlength=P)[::-1])[::-1]
    return busiest, np.rint(total) / P  # as the mean of the exact integers: their float64 sum over P


def striped_rounds(cu_seqlens, ring: int, causal: bool = True, window: int | None = None) -> np.ndarray:
    """(P rounds, P ranks) score entries of ring round i on rank r when token t lives on rank t mod P: in round i
    rank r holds the keys k = t - d with d = i (mod P), so each query counts the offsets of that residue in its
    reach, behind (d in [0, min(offset, W - 1)]) and, bidirectional, ahead (-d in [1, min(L - 1 - offset, W - 1)]),
    per document in closed form (``_striped_side``)."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    lengths = np.diff(cu)
    out = _striped_side(cu[:-1] % ring, 1, lengths, window, ring)
    if not causal:  # ahead: offset o' = L - 1 - o on rank (start + L - 1 - o') mod P
        out = out + _striped_side((cu[1:] - 1) % ring, -1, lengths, window, ring)[(-np.arange(ring)) % ring]
        out[0] -= _residues(cu[-1:], ring)[0]  # offset 0 counted on both sides: each rank's tokens
    return np.rint(out).astype(np.int64)


#: runs x ranks past which a layout's rounds are taken as even (``even_rounds``): per-document zigzag and the
#: balancer cut long documents into 2P pieces, so at rings of hundreds their runs approach one per token
ROUND_CELLS = 1 << 22


def _even_totals(token_layout: str, ring: int, cu_seqlens, causal: bool, window: int | None, runs=None,
                 totals=None) -> np.ndarray | None:
    """Each rank's exact work where its rounds are taken as even (``even_rounds``): past ROUND_CELLS runs x ranks
    (striped: ranks^2, its rounds' matrix); else None, the rounds counted. ``runs``, ``totals``: the layout's runs
    and each rank's work (``layout_pairs``), if known."""
    if token_layout == "striped":
        if ring * ring <= ROUND_CELLS:
            return None
        return totals if totals is not None else striped_pairs(cu_seqlens, ring, causal, window)
    if len(runs[0]) * ring > ROUND_CELLS:
        return totals if totals is not None else run_rank_pairs(runs, cu_seqlens, ring, causal, window)
    return None


def even_rounds(token_layout: str, ring: int, cu_seqlens, causal: bool = True, window: int | None = None
                ) -> np.ndarray:
    """(P rounds, P ranks) float: each rank's exact work (``rank_pairs``) spread evenly over the P rounds, none empty.
    The layouts that cut documents into 2P pieces (zigzag, balanced) aim at even rounds, and striped's are even but
    for a document's edges; this takes them as even where counting the rounds would cost more than ROUND_CELLS (a
    lower estimate of their rounds' busiest rank)."""
    return np.tile(layout_pairs(token_layout, ring, cu_seqlens, causal, window) / ring, (ring, 1))


def _counted_matrix(token_layout: str, ring: int, cu_seqlens, causal: bool, window: int | None, runs) -> np.ndarray:
    """(P, P) ``pair_matrix`` of contiguous, zigzag or balanced from the layout's structure (causal without a window
    inside any document: ``causal_layout_matrix``) or its runs (``run_pair_matrix``)."""
    if causal and (window is None or window >= int(np.diff(cu_seqlens).max())):
        return causal_layout_matrix(token_layout, ring, cu_seqlens)
    return run_pair_matrix(runs, cu_seqlens, ring, causal, window)


def _diagonals(m: np.ndarray) -> np.ndarray:
    """(P ranks, P rounds) read-only view of a (P, P) pair matrix's rounds, reversed: [r, P - 1 - i] = m[r, (r - i)
    mod P], from m laid twice side by side (entry [r, r - i + P], at r (2P + 1) + 1 + P - 1 - i of it) without index
    arrays; each rank's row contiguous, so reductions over the ranks run row by row."""
    P = len(m)
    flat = np.concatenate([m, m], axis=1).ravel()
    s = flat.strides[0]
    return np.lib.stride_tricks.as_strided(flat[1:], shape=(P, P), strides=((2 * P + 1) * s, s), writeable=False)


def round_stats(token_layout: str, ring: int, cu_seqlens, causal: bool = True, window: int | None = None,
                runs=None, totals=None, parts=None) -> tuple[np.ndarray, np.ndarray]:
    """(P,) busiest and mean score entries of each ring round of one pack (``layout_rounds``' max and mean over the
    ranks), without the (P, P) rounds where they are even (``even_rounds``: every round the same), nor for causal
    contiguous (``contiguous_round_stats``) and striped (``striped_round_stats``, where its documents leave the
    matrix sparse), which count them from the documents. ``runs`` and
    ``totals``: the layout's runs (``layout_runs``) and each rank's work (``layout_pairs``), where already built."""
    if ring == 1:
        x = mask_pairs(cu_seqlens, causal, window)
        return np.array([x], dtype=np.int64), np.array([float(x)])
    if runs is None and token_layout != "striped":
        runs = layout_runs(token_layout, ring, cu_seqlens, causal, window)
    totals = _even_totals(token_layout, ring, cu_seqlens, causal, window, runs, totals)
    if totals is not None:
        y = totals / ring
        return np.full(ring, y.max()), np.full(ring, y.mean())
    if token_layout == "contiguous" and causal and (window is None or window >= int(np.diff(cu_seqlens).max())):
        return contiguous_round_stats(cu_seqlens, ring, runs)
    whole_documents = window is None or window >= int(np.diff(cu_seqlens).max())
    if token_layout in ("zigzag", "balanced") and causal and whole_documents:
        return chunk_round_stats(token_layout, ring, cu_seqlens, parts)
    if token_layout == "striped" and causal and _few_reach_entries(cu_seqlens, ring):
        return striped_round_stats(cu_seqlens, ring, window)
    if token_layout == "striped":
        rounds = striped_rounds(cu_seqlens, ring, causal, window)
    elif not whole_documents:  # a window inside a document: pairs of runs in its reach
        cu = np.asarray(cu_seqlens, dtype=np.int64)
        start, stop, rank = runs
        doc = np.searchsorted(cu, start, side="right") - 1
        cells = _windowed_run_cells(start, stop, rank, cu[doc], cu[doc + 1], causal, window)
        if len(cells[0]) < CELL_SHARE * ring * ring:
            return _cell_round_stats(*cells, ring)
        by_rank = _diagonals(np.rint(np.bincount(cells[0] * ring + cells[1], weights=cells[2],
                                                 minlength=ring * ring)).astype(np.int64).reshape(ring, ring))
        return by_rank.max(axis=0)[::-1], by_rank.mean(axis=0)[::-1]  # exact integer sums: any order
    else:
        by_rank = _diagonals(_counted_matrix(token_layout, ring, cu_seqlens, causal, window, runs))
        return by_rank.max(axis=0)[::-1], by_rank.mean(axis=0)[::-1]  # exact integer sums: any order
    return rounds.max(axis=1), rounds.mean(axis=1)


def layout_rounds(token_layout: str, ring: int, cu_seqlens, causal: bool = True, window: int | None = None
                  ) -> np.ndarray:
    """(P rounds, P ranks): score entries of ring rank r's queries on the K, V of rank (r - i) mod P in round i, under
    a balancing policy (``round_pairs`` of the ``pair_matrix``, counted from runs of tokens or the layout's chunks,
    or for striped from offsets' residues; past ROUND_CELLS, ``even_rounds``)."""
    if ring == 1:
        return np.array([[mask_pairs(cu_seqlens, causal, window)]], dtype=np.int64)
    runs = None if token_layout == "striped" else layout_runs(token_layout, ring, cu_seqlens, causal, window)
    totals = _even_totals(token_layout, ring, cu_seqlens, causal, window, runs)
    if totals is not None:
        return np.tile(totals / ring, (ring, 1))
    if token_layout == "striped":
        return striped_rounds(cu_seqlens, ring, causal, window)
    return np.array(_diagonals(_counted_matrix(token_layout, ring, cu_seqlens, causal, window, runs)).T[::-1])


class SampleWork(NamedTuple):
    """One sample pack's documents and, per ring rank, its tokens and score entries (what ``sp-plan show`` prints)."""

    cu_seqlens: np.ndarray
    tokens: np.ndarray
    pairs: np.ndarray


def sample_rank_work(work: Workload, token_layout: str, ring: int, window: int | None = None,
                     sample: int = 0) -> SampleWork:
    """Tokens and score entries per ring rank of the workload's ``sample``-th pack under a balancing policy, from its
    runs (striped: rank r holds tokens r, r + P, ...) and ``layout_pairs``, not a token list a rank."""
    cu = workload_packs(work, sample + 1)[sample]
    if token_layout == "striped":
        tokens = (int(cu[-1]) - np.arange(ring, dtype=np.int64) + ring - 1) // ring
    else:
        start, stop, rank = layout_runs(token_layout, ring, cu, work.causal, window)
        tokens = np.bincount(rank, weights=stop - start, minlength=ring).astype(np.int64)  # exact below 2^53
    return SampleWork(cu, tokens, layout_pairs(token_layout, ring, cu, work.causal, window))


# ---------------------------------------------------------------- the kernel calls of a masked block
#
# Under a document mask or a window a block of one rank's queries against another's keys runs as tiles: one kernel
# call per pair of runs (a rank's consecutive tokens inside one document, cut to a window's reach) that the mask
# connects (runtime/kernels.py ``block_tiles``). A tile runs at the kernel's efficiency for its own size, and each
# pays a call's fixed cost, so a policy that cuts documents finely (zigzag's 2P pieces of every document) runs many
# small, slow calls.

#: the fewest tokens of a windowed tile (runtime/kernels.py MIN_TILE: tiles follow the window, not below this)
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


def pack_tiles(token_layout: str, ring: int, cu_seqlens, causal: bool = True, window: int | None = None,
               span: int | None = None, runs=None, parts=None) -> tuple[int, int, float]:
    """(tiles, score entries, entries over length) of one pack under a balancing policy, all ranks and rounds.

    Tiles: each query run (``tile_runs``; under a window cut into pieces of max(ceil(W / step), MIN_TILE) tokens,
    and into pieces of ``span`` where given: Ulysses alone attends each document in tiles of at most S/U tokens,
    runtime ulysses.span_tiles) against every key run of its document whose tokens meet its reach (causal: up to its
    last token; a window: from W - 1 before its first). Without a window a document's m disjoint runs make
    m (m + 1) / 2 tiles causal, m^2 not (striped's interleaved runs in closed form, ``_striped_tiles``); under one,
    two sorted searches count them, O(runs log runs), striped's pair by pair (``_strided_pairs_tiles``) or, past
    its limit, from the documents' periods (window_forms.striped_cut_tiles), zigzag's
    and the balancer's spread documents per document in closed form (``_chunked_tiles``; ``parts``: the balancer's,
    where built). Entries over length: a
    document's pieces (n_r tokens of it on rank r, or in span piece r) meet pairwise in tiles of length
    sqrt(n_r n_j) holding its entries in proportion n_r n_j (exact without causality; causal, a pair of pieces
    splits its entries between its two blocks), so the document adds pairs (sum_r sqrt(n_r))^2 / L^2; under a
    window no piece is longer than the tiles it is cut into."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    L = np.diff(cu)
    if window is not None and span is None and ring > 1 and token_layout in ("zigzag", "balanced"):
        closed = _chunked_tiles(token_layout, ring, cu, causal, window, parts)
        if closed is not None:
            return closed
    pairs = document_pairs(L, causal, window)
    if token_layout == "striped" and window is not None and ring > 1 and span is None:
        closed = _striped_window_tiles(ring, cu, causal, window, pairs)
        if closed is None:
            closed = _striped_cut_pack(ring, cu, causal, window, pairs)
        if closed is not None:
            return closed
    if token_layout == "striped" and window is None:
        return _striped_tiles(L, ring, causal), int(pairs.sum()), float(
            (pairs * _striped_roots(L, ring) ** 2 / (L.astype(np.float64) ** 2)).sum())
    first, last, step, n, rank, doc = tile_runs(token_layout, ring, cu, causal, window, runs)
    if span is not None and span < n.max():
        _, _, sizes, _, owner = _pieces(first, last, step, n, rank, doc, span)
    else:
        sizes, owner = _document_rank_sizes(doc, rank, n, len(L), ring)
    per_length = pairs * np.bincount(owner, weights=np.sqrt(sizes), minlength=len(L)) ** 2 / (L.astype(np.float64) ** 2)
    cut = min(x for x in (span, None if window is None else max(-(-window // step), MIN_TILE), int(cu[-1])) if x)
    if window is not None:
        per_length = np.maximum(per_length, pairs / cut)
    tiles = None
    if step > 1 and window is not None:  # past the candidate pairs' limit, from the documents' periods, not pieces
        tiles = striped_cut_tiles(cu, step, cut, window, causal, step * (min(cut, int(n.max())) - 1),
                                  _striped_limit(step, causal, window))
        if tiles is not None:
            return tiles, int(pairs.sum()), float(per_length.sum())
    if cut < n.max():
        first, last, n, rank, doc = _pieces(first, last, step, n, rank, doc, cut)
    if window is None:  # disjoint runs in token order: a causal one meets those before it and itself
        m = np.bincount(doc, minlength=len(L))
        return int((m * (m + 1) // 2 if causal else m * m).sum()), int(pairs.sum()), float(per_length.sum())
    ds, de = cu[doc], cu[doc + 1] - 1
    lo = np.maximum(ds, first - window + 1)
    hi = last if causal else np.minimum(de, last + window - 1)
    if step > 1:  # within the limit: pair by pair
        tiles = _strided_pairs_tiles(first, last, n, lo, hi, step, causal, window)
    if tiles is None:
        tiles = _reach_tiles(first, last, lo, hi, step == 1 and causal, int(cu[-1]))
    return tiles, int(pairs.sum()), float(per_length.sum())


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


@lru_cache(maxsize=4096)
def layout_tiles(work: Workload, token_layout: str, ring: int, window: int | None = None, span: int | None = None
                 ) -> TileWork:
    """``pack_tiles`` of a layout and ring degree per sequence, in expectation over PACK_SAMPLES seeded packs (one
    without documents), under ``window`` (a layer's, ``layer_windows``), in tiles of at most ``span`` tokens."""
    if span is None or span >= work.seq_len:
        return _layout_work(work, token_layout, ring, window)[2]
    samples = PACK_SAMPLES if work.documents is not None else 1
    total, seen = np.zeros(3), {}
    for cu in workload_packs(work, samples):  # each distinct pack counted once (``_pack_works``)
        key = cu.tobytes()
        if key not in seen:
            seen[key] = pack_tiles(token_layout, ring, cu, work.causal, window, span)
        total += seen[key]
    return TileWork(*(total / samples).tolist(), float(plain_tiles(token_layout, ring, work, span)), samples)


def plain_tiles(token_layout: str, ring: int, work: Workload, span: int | None) -> int:
    """The tiles of one document per sequence without a window: the calls an unmasked schedule's blocks stand for
    (zigzag and the balancer in closed form where no span cuts them, ``zigzag_pack``, ``balanced_pack``)."""
    cu = np.array([0, work.seq_len], dtype=np.int64)
    if ring > 1 and (span is None or span >= work.seq_len) and token_layout in ("zigzag", "balanced"):
        if token_layout == "zigzag":
            return zigzag_pack(cu, ring, work.causal)[1][0]
        return balanced_pack(cu, ring, closed_balanced_parts(cu, ring, work.causal), work.causal)[1][0]
    return pack_tiles(token_layout, ring, cu, work.causal, None, span)[0]


@lru_cache(maxsize=1024)
def mask_tiles(work: Workload, token_layout: str, ring: int, layers: int, ulysses: int = 1) -> TileWork:
    """``layout_tiles`` averaged over the layers' windows (``layer_windows``), weighted by their layer counts; ring 1
    (Ulysses alone) in tiles of S/U."""
    mix = layer_windows(work, layers)
    total = sum(n for _, n in mix)
    span = -(-work.seq_len // ulysses) if ring == 1 else None
    parts = [(n, layout_tiles(work, token_layout, ring, w, span)) for w, n in mix]
    tiles, pairs, per_length = (sum(n * t[i] for n, t in parts) / total for i in range(3))
    return TileWork(tiles, pairs, per_length, parts[0][1].plain, parts[0][1].samples)
