"""Ring rounds counted from the documents alone: contiguous causal rounds, and striped rounds (token t on
rank t mod P) per document in closed form or from their reach entries.
"""
from __future__ import annotations

import numpy as np

from ..layout import document_runs


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
