"""The balancer's placement counted per document in closed form: its spread documents' loads and parts
(``closed_balanced_parts``), and each rank's score entries and tiles (``balanced_pack``).
"""
from __future__ import annotations

import numpy as np

from ..layout import balanced_parts
from .chunked import _near, _piecewise_ranks, _tile_sums, _two_chunks, _windowed
from .layout_ranks import work_before
from .pairs import run_documents, run_rank_pairs
from .tiling import _chunked_tiles, _document_rank_sizes, _even_cells, _merged, _roots


def _spread_starts(doc: tuple, P: int):
    """(chunk u's offset, chunk 2P-1-u's offset) as functions of u, per spread document."""
    q, rem = doc[:2]
    return lambda u: u * q + np.minimum(u, rem), lambda u: (2 * P - 1 - u) * q + np.minimum(2 * P - 1 - u, rem)


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
