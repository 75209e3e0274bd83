"""Attention work of a mask: the score entries (query-key pairs) a document mask and a sliding window keep.

A sequence's mask is its documents (``cu_seqlens``: each document attends only to itself), causal or not, with an
optional window W (a query attends keys less than W positions away: causal, itself and the W - 1 before it;
bidirectional, W - 1 on each side). Counts are exact integers: per document (closed forms, ``pairs``), per query token
(``row_pairs``), per rank of a token layout (``rank_pairs``, the layout from planner/layout.py), per pair of ranks
(``pair_matrix``: what a ring round between them computes). ``busiest_rank_pairs`` and ``ring_round_pairs`` are
what the schedules price (all-gather; ring, Ulysses and USP): the busiest rank's pairs, and each ring round's, in
expectation over seeded packs of the workload's documents. They count in closed form, never token by token, so a
search can price every layout of a million-token sequence: a rank's pairs from runs of its tokens inside one
document (``prefix_pairs``: the running sum of a document's rows) or, striped, from strided sums of the rows'
linear pieces; the rounds from the layouts' chunks (``causal_layout_matrix``) or pairs of runs. The token-by-token
``rank_pairs`` and ``pair_matrix`` are the reference the tests hold them to. The algorithms outside
MASKED_ALGORITHMS refuse masks.

The modules, each on the ones before it: ``support`` (the algorithms that honour masks), ``pairs`` (closed forms per
document, row, rank and pair of ranks), ``layout_ranks`` (a layout's per-rank tokens, runs and work of one pack),
``limits`` (ROUND_CELLS), ``tiling`` and ``striped_tiles`` (runs cut into kernel tiles), ``chunked`` and
``balanced`` (contiguous, zigzag and the balancer per document in closed form), ``tiles`` (``pack_tiles``),
``run_rounds``, ``chunk_rounds`` and ``document_rounds`` (ring rounds from pairs of runs, from chunks, from the
documents alone), ``rounds`` (``round_stats``, ``layout_rounds``), ``work`` (the expectation over packs:
``busiest_rank_pairs``, ``layout_tiles``), ``ring_rounds`` (``ring_round_pairs``, ``round_arrays``) and ``layers``
(``layer_windows``, ``mask_fraction``, ``mask_tiles``).
"""
from __future__ import annotations

# every name of the modules, private ones too (the tests read them as masks.X), re-exported explicitly
from .support import MASKED_ALGORITHMS as MASKED_ALGORITHMS, has_mask as has_mask, refuse_masks as refuse_masks
from .pairs import (_min as _min, causal_pairs as causal_pairs, full_pairs as full_pairs,
                    causal_window_pairs as causal_window_pairs, full_window_pairs as full_window_pairs,
                    document_pairs as document_pairs, mask_pairs as mask_pairs, row_pairs as row_pairs,
                    rank_pairs as rank_pairs, _max0 as _max0, prefix_pairs as prefix_pairs,
                    run_documents as run_documents, run_rank_pairs as run_rank_pairs, _row_segments as _row_segments,
                    _strided_sums as _strided_sums, striped_pairs as striped_pairs, _key_ranges as _key_ranges,
                    pair_matrix as pair_matrix)
from .layout_ranks import (layout_tokens as layout_tokens, work_before as work_before, layout_runs as layout_runs,
                           layout_pairs as layout_pairs, imbalance as imbalance, SampleWork as SampleWork,
                           sample_rank_work as sample_rank_work)
from .limits import ROUND_CELLS as ROUND_CELLS
from .tiling import (MIN_TILE as MIN_TILE, TileWork as TileWork, _merged as _merged, tile_runs as tile_runs,
                     _pieces as _pieces, _even_cells as _even_cells, _roots as _roots, _chunked_tiles as _chunked_tiles,
                     _placed_tiles as _placed_tiles, _sorted as _sorted, _reach_tiles as _reach_tiles,
                     TILED_SEARCH_SHARE as TILED_SEARCH_SHARE, _document_rank_sizes as _document_rank_sizes,
                     DENSE_CELLS_PER_RUN as DENSE_CELLS_PER_RUN)
from .striped_tiles import (_striped_window_tiles as _striped_window_tiles, _striped_cut_pack as _striped_cut_pack,
                            _striped_rank_roots as _striped_rank_roots, _striped_limit as _striped_limit,
                            _striped_roots as _striped_roots, _striped_tiles as _striped_tiles,
                            _strided_pairs_tiles as _strided_pairs_tiles)
from .chunked import (_cyclic_below as _cyclic_below, _two_chunks as _two_chunks, _zigzag_starts as _zigzag_starts,
                      _windowed as _windowed, _zigzag_doc_work as _zigzag_doc_work,
                      _piecewise_ranks as _piecewise_ranks, _near as _near, _tile_sums as _tile_sums,
                      zigzag_runs as zigzag_runs, zigzag_pack as zigzag_pack, contiguous_spans as contiguous_spans,
                      contiguous_runs as contiguous_runs, contiguous_pack as contiguous_pack)
from .balanced import (_spread_starts as _spread_starts, _spread_doc_work as _spread_doc_work,
                       _spread_doc_tokens as _spread_doc_tokens, _spread_places as _spread_places,
                       spread_loads as spread_loads, closed_balanced_parts as closed_balanced_parts,
                       balanced_pack as balanced_pack, balanced_runs as balanced_runs)
from .tiles import pack_tiles as pack_tiles, plain_tiles as plain_tiles
from .run_rounds import (_ramp as _ramp, _pairs_at_least as _pairs_at_least, RUN_BLOCK_CELLS as RUN_BLOCK_CELLS,
                         _doc_counts as _doc_counts, _causal_run_matrix as _causal_run_matrix,
                         _windowed_run_matrix as _windowed_run_matrix, _windowed_run_cells as _windowed_run_cells,
                         _causal_full as _causal_full, _cell_round_stats as _cell_round_stats,
                         run_pair_matrix as run_pair_matrix)
from .chunk_rounds import (_pairs_of_runs as _pairs_of_runs, BLAS_ROWS as BLAS_ROWS, _cross as _cross,
                           _zigzag_pair_matrix as _zigzag_pair_matrix, _zigzag_halves as _zigzag_halves,
                           DENSE_SHARE as DENSE_SHARE, _zigzag_causal_matrix as _zigzag_causal_matrix,
                           _balanced_causal_matrix as _balanced_causal_matrix, _run_pair_cells as _run_pair_cells,
                           _changes as _changes, _chunk_round_stats as _chunk_round_stats,
                           _zigzag_chunk_parts as _zigzag_chunk_parts, _balanced_chunk_parts as _balanced_chunk_parts,
                           PIECES_SHARE as PIECES_SHARE, chunk_round_stats as chunk_round_stats,
                           _chunk_matrix as _chunk_matrix, _add_rolled as _add_rolled,
                           causal_layout_matrix as causal_layout_matrix,
                           _contiguous_causal_matrix as _contiguous_causal_matrix, _diagonals as _diagonals)
from .document_rounds import (_residues as _residues, _striped_side as _striped_side, _striped_reach as _striped_reach,
                              contiguous_round_stats as contiguous_round_stats,
                              _few_reach_entries as _few_reach_entries, REACH_SHARE as REACH_SHARE,
                              striped_round_stats as striped_round_stats, striped_rounds as striped_rounds)
from .rounds import (round_pairs as round_pairs, CELL_SHARE as CELL_SHARE, _even_totals as _even_totals,
                     even_rounds as even_rounds, _counted_matrix as _counted_matrix, round_stats as round_stats,
                     layout_rounds as layout_rounds)
from .work import (PACK_SAMPLES as PACK_SAMPLES, RankWork as RankWork, busiest_rank_pairs as busiest_rank_pairs,
                   _busiest_alone as _busiest_alone, _pack_pairs as _pack_pairs, _layout_work as _layout_work,
                   _frozen as _frozen, _per_round as _per_round, _pack_works as _pack_works, pack_work as pack_work,
                   _closed_pack as _closed_pack, _even_pack as _even_pack, layout_tiles as layout_tiles)
from .ring_rounds import RoundWork as RoundWork, ring_round_pairs as ring_round_pairs, round_arrays as round_arrays
from .layers import layer_windows as layer_windows, mask_fraction as mask_fraction, mask_tiles as mask_tiles
