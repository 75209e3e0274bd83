"""Each rank's tokens, runs and score entries under a token layout (planner/layout.py) of one pack, the
work before each token the balancer places by, the imbalance of a rank's work, and one seeded sample's per-rank work.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..documents import check_cu_seqlens, workload_packs
from ..layout import document_ring_tokens, document_runs
from ..model import Workload
from .pairs import document_pairs, prefix_pairs, row_pairs, run_rank_pairs, striped_pairs


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
