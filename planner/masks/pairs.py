"""Score entries (query-key pairs) of a mask in closed form: per document, per query row, per rank's tokens or
runs, per strided (striped) rank, and per pair of ranks (``pair_matrix``: what a ring round between them computes).
"""
from __future__ import annotations

import numpy as np


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
