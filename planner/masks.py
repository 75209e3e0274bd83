"""Attention work of a mask: the score entries (query-key pairs) a document mask and a sliding window keep.

A sequence's mask is its documents (``cu_seqlens``: each document attends only to itself), causal or not, with an
optional window W (a query attends keys less than W positions away: causal, itself and the W - 1 before it;
bidirectional, W - 1 on each side). Counts are exact integers: per document (closed forms below), per query token
(``row_pairs``), per rank of a token layout (``rank_pairs``, the layout from planner/layout.py), per pair of ranks
(``pair_matrix``: what a ring round between them computes). ``busiest_rank_pairs`` is what a schedule prices: the
busiest rank's pairs, in expectation over seeded packs of the workload's documents.
"""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from .documents import workload_packs
from .errors import PlanError
from .layout import document_ring_tokens
from .model import Workload

#: packs drawn per priced layout: the expected busiest rank is the mean over this many seeded sequences
PACK_SAMPLES = 8
#: the algorithms that honour packed documents and sliding windows (runtime/attention.py MASKED); the others refuse
MASKED_ALGORITHMS = ("ring", "ulysses", "usp", "allgather")


def has_mask(work: Workload | None) -> bool:
    """Whether the workload's attention is more than one causal or bidirectional document: documents or a window."""
    return work is not None and (work.documents is not None or work.window is not None)


def refuse_masks(algorithm: str, work: Workload | None) -> None:
    """A PlanError for an algorithm outside MASKED_ALGORITHMS on a workload with documents or a window."""
    if not has_mask(work) or algorithm in MASKED_ALGORITHMS:
        return
    field = "workload.documents" if work.documents is not None else "workload.window"
    raise PlanError(field, f"{algorithm} does not honour packed documents or sliding windows",
                    f"use algorithm {', '.join(MASKED_ALGORITHMS[:-1])} or {MASKED_ALGORITHMS[-1]}, which do")


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
    return np.array([int(rows[t].sum()) for t in tokens], dtype=np.int64)


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


def layout_tokens(token_layout: str, ring: int, cu_seqlens, causal: bool = True, window: int | None = None
                  ) -> list[np.ndarray]:
    """Each ring rank's tokens under a balancing policy (planner/layout.py), ``balanced`` weighted by ``row_pairs``."""
    weights = row_pairs(cu_seqlens, causal, window) if token_layout == "balanced" else None
    return document_ring_tokens(token_layout, ring, cu_seqlens, weights)


def layout_pairs(token_layout: str, ring: int, cu_seqlens, causal: bool = True, window: int | None = None
                 ) -> np.ndarray:
    """(P,) score entries each ring rank's queries compute under a balancing policy."""
    return rank_pairs(layout_tokens(token_layout, ring, cu_seqlens, causal, window), cu_seqlens, causal, window)


def imbalance(work) -> float:
    """The busiest rank's work over the ranks' mean (1.0: even)."""
    w = np.asarray(work, dtype=np.float64)
    return float(w.max() / w.mean()) if w.mean() > 0 else 1.0


class RankWork(NamedTuple):
    """Per sequence, in expectation over the workload's packs: all score entries, the busiest rank's, the ratio."""

    pairs: float
    busiest: float
    imbalance: float
    samples: int


@lru_cache(maxsize=4096)
def busiest_rank_pairs(work: Workload, token_layout: str, ring: int, window: int | None = None) -> RankWork:
    """Score entries of the busiest of ``ring`` ranks per sequence, in expectation over PACK_SAMPLES seeded packs of
    the workload's documents (one pack without documents: it is the same every time), under ``window`` (a layer's:
    the workload's window applies per layer, ``layer_windows``)."""
    samples = PACK_SAMPLES if work.documents is not None else 1
    total = busiest = 0.0
    for cu in workload_packs(work, samples):
        p = layout_pairs(token_layout, ring, cu, work.causal, window)
        total += float(p.sum())
        busiest += float(p.max())
    return RankWork(total / samples, busiest / samples, busiest * ring / total if total else 1.0, samples)


def layer_windows(work: Workload, layers: int) -> tuple[tuple[int | None, int], ...]:
    """(window, how many layers) of the workload's layers: its window on the windowed ones, None on global ones."""
    w = work.window
    if w is None:
        return ((None, layers),)
    local = w.windowed_layers(layers)
    return tuple((win, n) for win, n in ((w.size, local), (None, layers - local)) if n)


@lru_cache(maxsize=1024)
def mask_fraction(work: Workload, layers: int) -> float:
    """The mask's expected score entries per sequence over its S^2, averaged over the layers' windows."""
    mix = layer_windows(work, layers)
    S = work.seq_len
    pairs = sum(n * busiest_rank_pairs(work, "contiguous", 1, w).pairs for w, n in mix) / sum(n for _, n in mix)
    return pairs / (S * S)


class RoundWork(NamedTuple):
    """Per ring round i (rank r holds the K, V of rank r - i), in expectation over the workload's packs: the busiest
    rank's score entries, the ranks' mean, and the share of packs in which no rank has work (a transfer to skip)."""

    busiest: tuple[float, ...]
    mean: tuple[float, ...]
    empty: tuple[float, ...]
    samples: int


def round_pairs(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(P,) busiest and mean score entries of each ring round of a ``pair_matrix``: round i pairs rank r's queries
    with rank (r - i) mod P's keys."""
    P = len(matrix)
    r = np.arange(P)
    rounds = np.stack([matrix[r, (r - i) % P] for i in range(P)])
    return rounds.max(axis=1), rounds.mean(axis=1)


@lru_cache(maxsize=1024)
def ring_round_pairs(work: Workload, token_layout: str, ring: int, window: int | None = None) -> RoundWork:
    """Each ring round's busiest rank's and mean score entries per sequence, and how often the mask empties the
    round, in expectation over PACK_SAMPLES seeded packs (one without documents) under ``window``: a ring round
    waits on its busiest rank, and a round the mask empties needs no transfer (a windowed ring's far ranks)."""
    samples = PACK_SAMPLES if work.documents is not None else 1
    busiest, mean, empty = np.zeros(ring), np.zeros(ring), np.zeros(ring)
    for cu in workload_packs(work, samples):
        tokens = layout_tokens(token_layout, ring, cu, work.causal, window)
        hi, avg = round_pairs(pair_matrix(tokens, cu, work.causal, window))
        busiest += hi
        mean += avg
        empty += hi == 0
    as_tuple = lambda x: tuple(float(v) / samples for v in x)  # noqa: E731
    return RoundWork(as_tuple(busiest), as_tuple(mean), as_tuple(empty), samples)


class SampleWork(NamedTuple):
    """One sample pack's documents and, per ring rank, its tokens and score entries (what ``sp-plan show`` prints)."""

    cu_seqlens: np.ndarray
    tokens: np.ndarray
    pairs: np.ndarray


def sample_rank_work(work: Workload, token_layout: str, ring: int, window: int | None = None,
                     sample: int = 0) -> SampleWork:
    """Tokens and score entries per ring rank of the workload's ``sample``-th pack under a balancing policy."""
    cu = workload_packs(work, sample + 1)[sample]
    tokens = layout_tokens(token_layout, ring, cu, work.causal, window)
    return SampleWork(cu, np.array([len(t) for t in tokens]), rank_pairs(tokens, cu, work.causal, window))
