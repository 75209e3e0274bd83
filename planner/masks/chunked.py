"""Contiguous and zigzag layouts counted per document in closed form: each rank's score entries and tiles from
linear pieces over the ranks, O(documents + P) a pack (the chunk arithmetic the balancer's spread shares).
"""
from __future__ import annotations

import numpy as np

from ..window_forms import block_tiles, window_places
from .pairs import document_pairs, prefix_pairs
from .tiling import MIN_TILE, _chunked_tiles, _even_cells, _roots


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


def _tile_sums(m, roots, L, causal: bool) -> tuple[int, int, float]:
    """``pack_tiles`` without a window from each document's merged runs m and the sum of the square roots of its
    cells' tokens (the entries over length: pairs x roots^2 / L^2)."""
    pairs = document_pairs(L, causal)
    per_length = pairs * roots ** 2 / (L.astype(np.float64) ** 2)
    return int((m * (m + 1) // 2 if causal else m * m).sum()), int(pairs.sum()), float(per_length.sum())


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
