"""What the schedules price per layout and ring degree, in expectation over seeded packs of the workload's
documents: each rank's work (``busiest_rank_pairs``), the rounds' arrays and the tiles, from one pass over the packs
(``_layout_work``, ``pack_work``).
"""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from ..documents import check_cu_seqlens, workload_packs
from ..layout import parts_runs
from ..model import Workload
from .balanced import balanced_pack, balanced_runs, closed_balanced_parts
from .chunked import contiguous_pack, contiguous_runs, zigzag_pack, zigzag_runs
from .layout_ranks import layout_runs
from .limits import ROUND_CELLS
from .pairs import run_rank_pairs, striped_pairs
from .rounds import round_stats
from .tiles import pack_tiles, plain_tiles
from .tiling import TileWork


#: packs drawn per priced layout: the expected busiest rank is the mean over this many seeded sequences
PACK_SAMPLES = 8


class RankWork(NamedTuple):
    """Per sequence, in expectation over the workload's packs: all score entries, the busiest rank's, the ratio."""

    pairs: float
    busiest: float
    imbalance: float
    samples: int


def busiest_rank_pairs(work: Workload, token_layout: str, ring: int, window: int | None = None) -> RankWork:
    """Score entries of the busiest of ``ring`` ranks per sequence, in expectation over PACK_SAMPLES seeded packs of
    the workload's documents (one pack without documents: it is the same every time), under ``window`` (a layer's:
    the workload's window applies per layer, ``layer_windows``)."""
    if work.documents is None and window is None:  # no rounds or tiles will be asked for: count the rank alone
        return _busiest_alone(work, token_layout, ring)
    return _layout_work(work, token_layout, ring, window)[0]


@lru_cache(maxsize=4096)
def _busiest_alone(work: Workload, token_layout: str, ring: int) -> RankWork:
    """``busiest_rank_pairs`` of one unmasked sequence (causal or full) without building its rounds and tiles, which
    ring and USP price in closed form there: the same sums as ``_layout_work``'s."""
    _, p = _pack_pairs(token_layout, ring, next(iter(workload_packs(work, 1))), work.causal, None)
    total, top = float(p.sum()), float(p.max())
    return RankWork(total, top, top * ring / total if total else 1.0, 1)


def _pack_pairs(token_layout: str, ring: int, cu, causal: bool, window: int | None) -> tuple:
    """(the layout's runs of each rank, or None where striped; each rank's score entries) of one pack ``cu``."""
    runs = None if token_layout == "striped" else layout_runs(token_layout, ring, cu, causal, window)
    p = (striped_pairs(check_cu_seqlens(cu), ring, causal, window) if runs is None
         else run_rank_pairs(runs, cu, ring, causal, window))
    return runs, p


@lru_cache(maxsize=4096)
def _layout_work(work: Workload, token_layout: str, ring: int, window: int | None
                 ) -> tuple[RankWork, tuple[np.ndarray, ...], TileWork]:
    """``busiest_rank_pairs``, ``round_arrays`` and ``layout_tiles`` of one layout and ring degree, from one pass
    over the packs: a search prices all three (all-gather; ring and USP; the tiles of either) for every layout and
    degree, and each pack's layout runs and rank totals, the most of their cost, serve them all."""
    samples = PACK_SAMPLES if work.documents is not None else 1
    total = top = 0.0
    busiest, mean, empty = np.zeros(ring), np.zeros(ring), np.zeros(ring)
    tiles = np.zeros(3)
    for p, hi, avg, t in _pack_works(work, token_layout, ring, window, samples):
        total, top = total + float(p.sum()), top + float(p.max())
        busiest, mean, empty = busiest + hi, mean + avg, empty + (hi == 0)
        tiles += t
    return (RankWork(total / samples, top / samples, top * ring / total if total else 1.0, samples),
            tuple(_frozen(x / samples) for x in (busiest, mean, empty)),
            TileWork(*(tiles / samples).tolist(), float(plain_tiles(token_layout, ring, work, None)), samples))


def _frozen(x: np.ndarray) -> np.ndarray:
    """``x`` made read-only: a cached result handed to every caller."""
    x.flags.writeable = False
    return x


def _per_round(x: np.ndarray, samples: int) -> tuple[float, ...]:
    """x / samples as ``RoundWork``'s tuple of floats: one float repeated where every round has the same value (the
    even rounds of a large ring: no float object made per round)."""
    y = x / samples
    if len(y) and (y == y[0]).all():
        return (float(y[0]),) * len(y)
    return tuple(y.tolist())


def _pack_works(work: Workload, token_layout: str, ring: int, window: int | None, samples: int):
    """Per pack, in order: (each rank's score entries, each round's busiest and mean, the tiles' ``pack_tiles``),
    each distinct pack counted once: a distribution whose documents outgrow the sequence draws many packs that are
    one whole document, all alike."""
    seen: dict[bytes, tuple] = {}
    for cu in workload_packs(work, samples):  # per rank: O(runs) or O(documents + P); rounds as round_stats
        key = cu.tobytes()
        if key not in seen:
            seen[key] = pack_work(token_layout, ring, cu, work.causal, window)
        yield seen[key]


def pack_work(token_layout: str, ring: int, cu_seqlens, causal: bool = True, window: int | None = None) -> tuple:
    """(each rank's score entries, each round's busiest and mean, ``pack_tiles``) of one pack: in closed form per
    document where it can be (``_closed_pack``), else from the layout's runs (``layout_runs``, ``round_stats``)."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    parts = None
    if ring > 1:
        closed, parts = _closed_pack(token_layout, ring, cu, causal, window)
        if closed is not None:
            return closed
    if parts is None:
        runs, p = _pack_pairs(token_layout, ring, cu, causal, window)
    else:
        runs = parts_runs(cu, ring, parts)
        p = run_rank_pairs(runs, cu, ring, causal, window)
    hi, avg = round_stats(token_layout, ring, cu, causal, window, runs, p,
                          parts if causal and window is None else None)
    return p, hi, avg, pack_tiles(token_layout, ring, cu, causal, window, runs=runs, parts=parts)


def _closed_pack(token_layout: str, ring: int, cu: np.ndarray, causal: bool, window: int | None = None) -> tuple:
    """(``pack_work`` of a pack whose rounds are taken as even, ``_even_totals``: past ROUND_CELLS runs x ranks, or
    None; the balancer's parts, placed once a pack for its runs and rounds). Contiguous, zigzag and the balancer
    count there per document in closed form (``contiguous_pack``, ``zigzag_pack``, ``balanced_pack``), O(documents
    + P), not from their runs (zigzag's about S past a ring of S/2P ranks); the same integers; under a window
    where no run is longer than the window's tiles."""
    if token_layout == "balanced":
        parts = closed_balanced_parts(cu, ring, causal, window)
        if balanced_runs(parts, ring) * ring > ROUND_CELLS:
            p, tiles = balanced_pack(cu, ring, parts, causal, window)[:2]
            return (None if tiles is None else _even_pack(p, tiles, ring)), parts
        return None, parts
    if token_layout == "zigzag" and zigzag_runs(cu, ring) * ring > ROUND_CELLS:
        p, tiles = zigzag_pack(cu, ring, causal, window)
        return (None if tiles is None else _even_pack(p, tiles, ring)), None
    if token_layout == "contiguous" and contiguous_runs(cu, ring) * ring > ROUND_CELLS:
        p, tiles = contiguous_pack(cu, ring, causal, window)
        return (None if tiles is None else _even_pack(p, tiles, ring)), None
    return None, None


def _even_pack(p: np.ndarray, tiles: tuple, ring: int) -> tuple:
    """``pack_work`` of a pack whose rounds are taken as even (``round_stats``' even rounds) from each rank's work."""
    y = p / ring
    return p, np.full(ring, y.max()), np.full(ring, y.mean()), tiles


@lru_cache(maxsize=4096)
def layout_tiles(work: Workload, token_layout: str, ring: int, window: int | None = None, span: int | None = None
                 ) -> TileWork:
    """``pack_tiles`` of a layout and ring degree per sequence, in expectation over PACK_SAMPLES seeded packs (one
    without documents), under ``window`` (a layer's, ``layer_windows``), in tiles of at most ``span`` tokens."""
    if span is None or span >= work.seq_len:
        return _layout_work(work, token_layout, ring, window)[2]
    samples = PACK_SAMPLES if work.documents is not None else 1
    total, seen = np.zeros(3), {}
    for cu in workload_packs(work, samples):  # each distinct pack counted once (``_pack_works``)
        key = cu.tobytes()
        if key not in seen:
            seen[key] = pack_tiles(token_layout, ring, cu, work.causal, window, span)
        total += seen[key]
    return TileWork(*(total / samples).tolist(), float(plain_tiles(token_layout, ring, work, span)), samples)
