"""Each ring round's busiest and mean score entries of one pack (``round_stats``, ``layout_rounds``): counted
from the fastest form the layout and mask allow, or taken as even past ROUND_CELLS.
"""
from __future__ import annotations

import numpy as np

from .chunk_rounds import _diagonals, causal_layout_matrix, chunk_round_stats
from .document_rounds import _few_reach_entries, contiguous_round_stats, striped_round_stats, striped_rounds
from .layout_ranks import layout_pairs, layout_runs
from .limits import ROUND_CELLS
from .pairs import mask_pairs, run_rank_pairs, striped_pairs
from .run_rounds import _cell_round_stats, _windowed_run_cells, run_pair_matrix


def round_pairs(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(P,) busiest and mean score entries of each ring round of a ``pair_matrix``: round i pairs rank r's queries
    with rank (r - i) mod P's keys."""
    P = len(matrix)
    r = np.arange(P)
    rounds = np.stack([matrix[r, (r - i) % P] for i in range(P)])
    return rounds.max(axis=1), rounds.mean(axis=1)


#: pairs of runs under a window, over P^2, below which ``round_stats`` reads the rounds off them (not the matrix)
CELL_SHARE = 1 / 8


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
