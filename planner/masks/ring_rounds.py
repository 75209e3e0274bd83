"""Each ring round's busiest and mean score entries and empty share in expectation over the packs
(``ring_round_pairs``, ``round_arrays``).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..model import Workload
from .work import _layout_work, _per_round


class RoundWork(NamedTuple):
    """Per ring round i (rank r holds the K, V of rank r - i), in expectation over the workload's packs: the busiest
    rank's score entries, the ranks' mean, and the share of packs in which no rank has work (a transfer to skip)."""

    busiest: tuple[float, ...]
    mean: tuple[float, ...]
    empty: tuple[float, ...]
    samples: int


def ring_round_pairs(work: Workload, token_layout: str, ring: int, window: int | None = None) -> RoundWork:
    """Each ring round's busiest rank's and mean score entries per sequence, and how often the mask empties the
    round, in expectation over PACK_SAMPLES seeded packs (one without documents) under ``window``: a ring round
    waits on its busiest rank, and a round the mask empties needs no transfer (a windowed ring's far ranks)."""
    return RoundWork(*(_per_round(x, 1) for x in round_arrays(work, token_layout, ring, window)),
                     _layout_work(work, token_layout, ring, window)[0].samples)


def round_arrays(work: Workload, token_layout: str, ring: int, window: int | None = None) -> tuple[np.ndarray, ...]:
    """``ring_round_pairs``' busiest, mean and empty per round as (P,) read-only float64 arrays (the same floats),
    for callers that compute on them: no P-long tuple of floats made and read back."""
    return _layout_work(work, token_layout, ring, window)[1]
