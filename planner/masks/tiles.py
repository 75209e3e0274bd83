"""The kernel calls of a masked block: a pack's tiles by layout (``pack_tiles``), and those of one sequence
without a mask (``plain_tiles``).
"""
from __future__ import annotations

import numpy as np

from ..model import Workload
from ..window_forms import striped_cut_tiles
from .balanced import balanced_pack, closed_balanced_parts
from .chunked import zigzag_pack
from .pairs import document_pairs
from .striped_tiles import (_strided_pairs_tiles as _strided_pairs_tiles, _striped_cut_pack as _striped_cut_pack,
                            _striped_limit as _striped_limit, _striped_roots as _striped_roots,
                            _striped_tiles as _striped_tiles, _striped_window_tiles as _striped_window_tiles)
from .tiling import MIN_TILE, _chunked_tiles, _document_rank_sizes, _pieces, _reach_tiles, tile_runs


def pack_tiles(token_layout: str, ring: int, cu_seqlens, causal: bool = True, window: int | None = None,
               span: int | None = None, runs=None, parts=None) -> tuple[int, int, float]:
    """(tiles, score entries, entries over length) of one pack under a balancing policy, all ranks and rounds.

    Tiles: each query run (``tile_runs``; under a window cut into pieces of max(ceil(W / step), MIN_TILE) tokens, and
    into pieces of ``span`` where given: Ulysses alone attends each document in tiles of at most S/U tokens, runtime
    ulysses.span_tiles) against every key run of its document whose tokens meet its reach (causal: up to its last token;
    a window: from W - 1 before its first). Without a window a document's m disjoint runs make m (m + 1) / 2 tiles
    causal, m^2 not (striped's interleaved runs in closed form, ``_striped_tiles``); under one, two sorted searches
    count them, O(runs log runs), striped's pair by pair (``_strided_pairs_tiles``) or, past its limit, from the
    documents' periods (window_forms.striped_cut_tiles), zigzag's and the balancer's spread documents per document in
    closed form (``_chunked_tiles``; ``parts``: the balancer's, where built). Entries over length: a document's pieces
    (n_r tokens of it on rank r, or in span piece r) meet pairwise in tiles of length sqrt(n_r n_j) holding its entries
    in proportion n_r n_j (exact without causality; causal, a pair of pieces splits its entries between its two blocks),
    so the document adds pairs (sum_r sqrt(n_r))^2 / L^2; under a window no piece is longer than the tiles it is cut
    into."""
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


def plain_tiles(token_layout: str, ring: int, work: Workload, span: int | None) -> int:
    """The tiles of one document per sequence without a window: the calls an unmasked schedule's blocks stand for
    (zigzag and the balancer in closed form where no span cuts them, ``zigzag_pack``, ``balanced_pack``)."""
    cu = np.array([0, work.seq_len], dtype=np.int64)
    if ring > 1 and (span is None or span >= work.seq_len) and token_layout in ("zigzag", "balanced"):
        if token_layout == "zigzag":
            return zigzag_pack(cu, ring, work.causal)[1][0]
        return balanced_pack(cu, ring, closed_balanced_parts(cu, ring, work.causal), work.causal)[1][0]
    return pack_tiles(token_layout, ring, cu, work.causal, None, span)[0]
