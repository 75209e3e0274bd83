"""Kernel calls (tiles) of zigzag-chunked documents under a sliding window, per document in closed form.

A layout that cuts a document into 2P zigzag chunks (the per-document zigzag; the balancer's spread documents)
tiles it, in token order, with runs of a few sizes: chunk k < P on rank k and chunk 2P-1-k on the same rank, each
of q = L // 2P tokens or q + 1, the extra ones on a cyclic interval of ranks per half, and chunks P - 1 and P
joined (one rank's consecutive tokens). So a document's runs are at most seven blocks of equal runs
(``chunk_blocks``). Under a window W a query run meets every run of its document that ends at most W - 1 tokens
before its first token (and, bidirectional, starts at most W - 1 after its last): of a document's n runs,
n(n + 1)/2 causal or n^2 bidirectional pairs, less the pairs (j, i) with last_j + W <= first_i (once causal,
twice bidirectional). Between two blocks of equal runs those are a floor sum (``floor_sum``), so a document costs
O(blocks^2 log) and a pack O(documents), not O(S) runs sorted and searched (``masks.pack_tiles``: the same
integers, which the tests hold them to).
"""
from __future__ import annotations

import numpy as np


def floor_sum(n, m, a, b) -> np.ndarray:
    """sum_{t=0}^{n-1} floor((a t + b) / m) elementwise, for int64 arrays n >= 0, m >= 1, a >= 0, b >= 0: the
    Euclid-like reduction (AtCoder Library's floor_sum), O(log m) rounds over all entries at once."""
    n, m, a, b = (np.array(x, dtype=np.int64) for x in np.broadcast_arrays(n, m, a, b))
    out = np.zeros(n.shape, dtype=np.int64)
    live = n > 0
    while live.any():
        qa, qb = a // m, b // m
        out += np.where(live, n * (n - 1) // 2 * qa + n * qb, 0)
        a, b = a - qa * m, b - qb * m
        y = a * n + b
        live &= y >= m
        # the next round sums over the swapped roles: n' = y // m, b' = y mod m, (m, a) -> (a, m)
        n, b, m, a = (np.where(live, y // m, 0), np.where(live, y % m, 0), np.where(live, a, 1),
                      np.where(live, m, 0))
    return out


def _ceil_div(x, y):
    """ceil(x / y) of int64 arrays, y >= 1."""
    return -((-x) // y)


def far_pairs(F, n, s, W: int) -> np.ndarray:
    """Per document, the pairs of its runs (j, i) with last_j + W <= first_i: blocks k of n[:, k] runs of s[:, k]
    tokens each from offset F[:, k] ((D, K) int64 arrays, the blocks in token order). Run t of block i starts at
    F_i + s_i t; block j's runs ending W or more before it are floor((s_i t + F_i - F_j - s_j + 1 - W) / s_j) + 1 of
    them, clipped to [0, n_j]: zero before t0, n_j from t1 on, a floor sum between."""
    D, K = F.shape
    i, j = np.triu_indices(K)  # j <= i in token order: a later block's runs never end before an earlier one's start
    i, j = j, i
    i, j = np.broadcast_to(i, (D, len(i))), np.broadcast_to(j, (D, len(j)))
    rows = np.arange(D)[:, None]
    Fi, ni, si = F[rows, i], n[rows, i], np.maximum(s[rows, i], 1)
    Fj, nj, sj = F[rows, j], n[rows, j], np.maximum(s[rows, j], 1)
    d = Fi - Fj - sj + 1 - W
    t0 = np.clip(_ceil_div(-d, si), 0, ni)
    t1 = np.clip(_ceil_div((nj - 1) * sj - d, si), t0, ni)
    mid = t1 - t0
    counted = floor_sum(mid, sj, si, np.where(mid > 0, si * t0 + d, 0)) + mid + (ni - t1) * nj
    return np.where((ni > 0) & (nj > 0), counted, 0).sum(axis=1)


def block_tiles(F, n, s, W: int, causal: bool) -> int:
    """Tiles of documents tiled by blocks of equal runs (``far_pairs``' F, n, s) under a window W: per document of
    N runs, N(N + 1)/2 - far pairs causal, N^2 - 2 far pairs bidirectional."""
    N = n.sum(axis=1)
    far = far_pairs(F, n, s, W)
    return int((N * (N + 1) // 2 - far).sum() if causal else (N * N - 2 * far).sum())


def _cyclic_blocks(a, k, P: int, q):
    """(counts, sizes) of three blocks over positions 0 .. P - 2 ascending whose chunk holds q + 1 tokens where the
    position lies in the cyclic interval [a, a + k) of 0 .. P - 1, else q."""
    wrap = a + k > P
    x1 = np.where(wrap, a + k - P, np.minimum(a, P - 1))
    x2 = np.where(wrap, a, np.minimum(a + k, P - 1))
    counts = (x1, x2 - x1, P - 1 - x2)
    sizes = (q + wrap, q + ~wrap, q + wrap)
    return counts, sizes


def chunk_blocks(L, q, nA, a, nB, b, P: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(F, n, s) (D, 7): the runs of documents of L tokens cut into 2P chunks, chunk k < P (rank k) of q tokens and
    one more where k lies in the cyclic interval [a, a + nA), chunk 2P-1-u (rank u) one more where u lies in
    [b, b + nB), in token order: the first half's chunks 0 .. P - 2, chunks P - 1 and P joined, the second half's
    ranks P - 2 .. 0. Where q = 0 a document is its nA + nB one-token chunks, the last of the first half and the
    first of the second joined where they share a rank (the first half's highest rank among the second's)."""
    c1, z1 = _cyclic_blocks(a, nA, P, q)
    c2, z2 = _cyclic_blocks(b, nB, P, q)  # ascending ranks: the second half runs them descending
    last_a = q + ((P - 1 - a) % P < nA)
    last_b = q + ((P - 1 - b) % P < nB)
    n = np.stack([*c1, np.ones_like(L), *c2[::-1]], axis=1)
    s = np.stack([*z1, last_a + last_b, *z2[::-1]], axis=1)
    top = np.where(a + nA >= P, P - 1, a + nA - 1)  # the first half's highest rank holding a token (q = 0)
    joined = (nB > 0) & ((top - b) % P < nB)
    zero_n = np.stack([np.where(joined, nA - 1, L), joined.astype(np.int64), np.where(joined, nB - 1, 0)], axis=1)
    zero_s = np.stack([np.ones_like(L), 2 * np.ones_like(L), np.ones_like(L)], axis=1)
    pad = np.zeros((len(L), 4), dtype=np.int64)
    short = (q == 0)[:, None]
    n = np.where(short, np.concatenate([zero_n, pad], axis=1), n)
    s = np.where(short, np.concatenate([zero_s, pad + 1], axis=1), s)
    F = np.cumsum(n * s, axis=1) - n * s
    return F, n, s


def zigzag_blocks(cu: np.ndarray, P: int) -> tuple[np.ndarray, ...]:
    """``chunk_blocks`` of the per-document zigzag (layout._zigzag_extras: the extras of a document go round the
    ring from where the last document's stopped, a second one to chunk 2P-1-u of the first nB ranks)."""
    L = np.diff(cu)
    q, rem = np.divmod(L, 2 * P)
    a = (np.cumsum(rem) - rem) % P
    nA, nB = np.minimum(rem, P), np.maximum(rem - P, 0)
    return chunk_blocks(L, q, nA, a, nB, a, P)


def spread_blocks(L: np.ndarray, P: int) -> tuple[np.ndarray, ...]:
    """``chunk_blocks`` of documents the balancer spreads (layout.spread_sizes: chunk k one more for k < L mod 2P,
    so the first half's ranks below nA, and the second half's chunks P .. P + nB - 1, ranks P - nB .. P - 1)."""
    q, rem = np.divmod(L, 2 * P)
    nA, nB = np.minimum(rem, P), np.maximum(rem - P, 0)
    zero = np.zeros_like(L)
    return chunk_blocks(L, q, nA, zero, nB, (P - nB) % P, P)


# ---------------------------------------------------------------- striped runs under a window
#
# Striped, a document's offset o lives on rank (start + o) mod P: its runs are offsets o < min(L, P), every P-th
# token from o, cut into pieces of c tokens (every P-th), so the pieces' first tokens are the offsets x < L with
# x mod Pc < P, and their last ones the offsets y < L - min(L, P) with y mod Pc >= P(c - 1) (a full piece another
# follows) and the last min(L, P) offsets (each run's last token). Counting those below a bound is arithmetic.


def striped_firsts(x, L, P: int, c: int):
    """How many of a striped document's pieces (L tokens, pieces of c every P-th) start at offsets <= x."""
    full, r = np.divmod(np.maximum(np.minimum(x, L - 1) + 1, 0), P * c)  # maximum: np.clip's dispatch costs more
    return full * P + np.minimum(r, P)


def striped_lasts(x, L, P: int, c: int):
    """How many of a striped document's pieces end at offsets < x."""
    m = np.minimum(L, P)
    full, r = np.divmod(np.maximum(np.minimum(x, L - m), 0), P * c)
    return full * P + np.maximum(r - P * (c - 1), 0) + np.minimum(np.maximum(x - (L - m), 0), m)  # m >= 0


def striped_reach_tiles(first, last, doc, lo, hi, cu: np.ndarray, P: int, c: int, span: int, limit: int):
    """Tiles of striped pieces (``first``, ``last`` tokens, document ``doc``) whose reach is [lo, hi], counted as
    ``masks.pack_tiles`` counts them past ``limit`` candidate pairs (every piece whose tokens' interval meets the
    reach: those starting by hi less those ending before lo, inside the query's document), or None where the
    candidates (pieces starting in [lo - span, hi], ``span`` the longest piece's) may be no more than ``limit``:
    they are at least those of the query's own document (a negative limit: counted whatever their number)."""
    ds, L = cu[doc], cu[doc + 1] - cu[doc]
    below = striped_firsts(hi - ds, L, P, c)
    if limit >= 0 and int((below - striped_firsts(lo - span - 1 - ds, L, P, c)).sum()) <= limit:
        return None
    return int((below - striped_lasts(lo - ds, L, P, c)).sum())


def _comb_count(z, T, u, w):
    """How many t in [0, z) have t mod T in [u, u + w), for z >= 0 (int64 arrays, u + w <= T)."""
    q, r = np.divmod(z, T)
    return q * w + np.minimum(np.maximum(r - u, 0), w)


def _comb_prefix(Z, T, u, w):
    """sum_{z=0}^{Z-1} ``_comb_count``(z) for Z >= 0: whole periods q < Z // T add q w T each and one period's
    ramp, the last part period its r = Z mod T counts."""
    q, r = np.divmod(Z, T)
    return T * w * (q * (q - 1) // 2) + q * _ramp_to(T - u, w) + r * q * w + _ramp_to(np.maximum(r - u, 0), w)


def _set_prefix(Z, A, T, u, w, a, b):
    """sum_{z=0}^{Z-1} N(z) for Z >= 0, N(z) the offsets below z of the set {t < A: t mod T in [u, u + w)} and
    [a, b) (``_comb_count`` clipped to A, plus the interval's)."""
    Zc = np.minimum(Z, A)
    return (_comb_prefix(Zc, T, u, w) + (Z - Zc) * _comb_count(A, T, u, w)
            + _ramp_to(np.maximum(Z - a, 0), b - a))


def _comb_intervals(L, T: int, u: int, w: int, A):
    """(start, stop, document) of each document's intervals [kT + u, min(kT + u + w, A)), k = 0, 1, ... while
    kT + u < A (A per document): its offsets below A whose residue mod T lies in [u, u + w), one interval a
    period."""
    k = np.maximum(-(-(A - u) // T), 0)
    d = np.repeat(np.arange(len(L)), k)
    first = T * (np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)) + u
    return first, np.minimum(first + w, A[d]), d


def _sum_counts(Y, X: tuple, d: int) -> int:
    """sum over the offsets y of the intervals Y (``_comb_intervals``) of N_X(y + d), X's (A, T, u, w, a, b) of
    ``_set_prefix`` (arrays per document) and N_X(z) = 0 for z <= 0: each interval's difference of prefix sums."""
    s, e, doc = Y
    at = tuple(x[doc] if isinstance(x, np.ndarray) else x for x in X)
    return int((_set_prefix(np.maximum(e + d, 0), *at) - _set_prefix(np.maximum(s + d, 0), *at)).sum())


def striped_cut_tiles(cu: np.ndarray, P: int, c: int, W: int, causal: bool, span: int, limit: int):
    """``striped_reach_tiles`` of a pack's striped runs cut into pieces of ``c`` tokens (every P-th), from the
    documents' periods of Pc offsets, not their pieces: a document's pieces start at the offsets
    S = {x < L: x mod Pc < P} and end at E = {y < L - m: y mod Pc >= P(c - 1)} and [L - m, L) (m = min(L, P)), so
    the pairs counted there are sum_{y in E} N_S(y + 1) (bidirectional y + W) less sum_{x in S} N_E(x + 1 - W),
    and the candidates' lower bound the first less sum_{x in S} N_S(x + 1 - W - span) (N_X(z): X's offsets below
    z). Each sum runs over one interval a period (about L / Pc a document, not L / c pieces)."""
    L = np.diff(np.asarray(cu, dtype=np.int64))
    m, T = np.minimum(L, P), P * c
    S = (L, T, 0, P, L, L)  # (A, T, u, w, a, b) of ``_set_prefix``: the pieces' first offsets
    E = (L - m, T, P * (c - 1), P, L - m, L)  # their last ones
    starts = _comb_intervals(L, T, 0, P, L)
    ends = _comb_intervals(L, T, P * (c - 1), P, L - m)
    ends = tuple(np.concatenate([x, y]) for x, y in zip(ends, (L - m, L, np.arange(len(L)))))
    below = _sum_counts(ends, S, 1 if causal else W)
    if limit >= 0 and below - _sum_counts(starts, S, 1 - W - span) <= limit:
        return None
    return below - _sum_counts(starts, E, 1 - W)


def _ramp_to(x, M):
    """sum_{u=0}^{x-1} min(u, M) for x >= 0 (int64 arrays)."""
    k = np.minimum(x, M + 1)
    return k * (k - 1) // 2 + (x - k) * M


def clip_sum(a, b, c, M):
    """sum_{o=a}^{b-1} clip(o + c, 0, M) for b >= a (int64 arrays)."""
    return _ramp_to(np.maximum(b + c, 0), M) - _ramp_to(np.maximum(a + c, 0), M)


def striped_whole_tiles(cu: np.ndarray, P: int, W: int, causal: bool, limit: int):
    """``striped_reach_tiles`` where no run is cut (every document's runs of at most c tokens), per document in
    closed form: its m = min(L, P) runs start at offsets 0 .. m - 1 and end at o + P(Q - [o >= R]) (L = QP + R),
    the last m offsets, so each count is a clipped line in o, summed in closed form (``clip_sum``)."""
    L = np.diff(cu)
    m = np.minimum(L, P)
    Q, R = np.divmod(L, P)
    R = np.minimum(R, m)
    span = P * (int(-(-L.max() // P)) - 1)
    d = 1 if causal else W  # a run's queries reach its last token, or W - 1 past it (within its document)
    below = clip_sum(0, R, P * Q + d, m) + clip_sum(R, m, P * (Q - 1) + d, m)
    zero = np.zeros_like(L)
    if limit >= 0 and int((below - clip_sum(zero, m, 1 - W - span, m)).sum()) <= limit:
        return None
    return int((below - clip_sum(zero, m, 1 - W - (L - m), m)).sum())


# ---------------------------------------------------------------- a rank's entries under a window, per document
#
# A chunk's entries are prefix_pairs(end) - prefix_pairs(start) (planner/masks/pairs.py), one quadratic in the offset up
# to the window W and another past it (bidirectional: also past L - W). A chunk wholly on one side is linear in its
# rank between the layouts' places; only the one chunk of each half that holds such an offset is not, so it is made
# a place of its own.


def last_below(start, T, lo, hi, P: int) -> np.ndarray:
    """Per document, the last u in [0, P) with start(u) < T ((D,) thresholds), -1 where none: start nondecreasing in
    u and linear on each piece [lo, hi) ((D, k) arrays that cover [0, P)), so a piece's last u below T is read off
    its first value and slope, and the document's is the largest of its pieces'."""
    g0 = start(np.minimum(lo, P - 1))
    slope = start(np.minimum(lo + 1, P - 1)) - g0
    T = T[:, None]
    t = np.where(slope > 0, (T - 1 - g0) // np.maximum(slope, 1), hi - lo)  # steps past lo still below T
    return np.where((hi > lo) & (g0 < T), lo + np.minimum(t, hi - lo - 1), -1).max(axis=1)


def window_places(first, second, thresholds, P: int, places: np.ndarray) -> np.ndarray:
    """(D, 2 x thresholds) ranks u whose chunk (``first``: chunk u's offset, nondecreasing; ``second``: chunk
    2P-1-u's, nonincreasing; both linear in u between the (D, k) ``places`` in [0, P], which hold 0 and P, and
    taking u as a (D, k) array) is the last of its half to start below each threshold offset: every chunk before it
    ends by the threshold, every one after starts at or past it."""
    places = np.sort(places, axis=1)
    lo, hi = places[:, :-1], places[:, 1:]
    out = []
    for T in thresholds:
        out.append(last_below(first, T, lo, hi, P))
        out.append(P - 1 - last_below(lambda v: second(P - 1 - v), T, P - hi, P - lo, P))
    return np.stack(out, axis=1)
