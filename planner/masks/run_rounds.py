"""(P, P) pair matrices of a layout's runs (``run_pair_matrix``), causal or windowed, and each ring round's
busiest and mean work read off the windowed pairs of runs without the matrix.
"""
from __future__ import annotations

import numpy as np


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
