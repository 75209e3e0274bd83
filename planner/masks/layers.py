"""The workload's windows over the model's layers, and what they average: the mask's share of the S^2 pairs
(``mask_fraction``) and the tiles of a layer (``mask_tiles``).
"""
from __future__ import annotations

from functools import lru_cache

from ..model import Workload
from .tiling import TileWork
from .work import busiest_rank_pairs, layout_tiles


def layer_windows(work: Workload, layers: int) -> tuple[tuple[int | None, int], ...]:
    """(window, how many layers) of the workload's layers: its window on the windowed ones, None on global ones."""
    w = work.mask_window  # a window covering every document is full attention
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


@lru_cache(maxsize=1024)
def mask_tiles(work: Workload, token_layout: str, ring: int, layers: int, ulysses: int = 1) -> TileWork:
    """``layout_tiles`` averaged over the layers' windows (``layer_windows``), weighted by their layer counts; ring 1
    (Ulysses alone) in tiles of S/U."""
    mix = layer_windows(work, layers)
    total = sum(n for _, n in mix)
    span = -(-work.seq_len // ulysses) if ring == 1 else None
    parts = [(n, layout_tiles(work, token_layout, ring, w, span)) for w, n in mix]
    tiles, pairs, per_length = (sum(n * t[i] for n, t in parts) / total for i in range(3))
    return TileWork(tiles, pairs, per_length, parts[0][1].plain, parts[0][1].samples)
