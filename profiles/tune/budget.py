"""The time budget of `sp-plan tune` (``--max-minutes``): what is left of it, and what a step or candidate costs.

The whole tune keeps to it: links, the kernel sweep, the round probe, candidates, reread and confirm. The clock is
a callable (``time.monotonic`` unless a caller passes another), so a test drives the budget deterministically.
A candidate's run time is estimated from the model's price of each stack its measurement builds (1 and 2 blocks a
stage, each with the embedding, the LM head, the loss and the optimizer step that a step of the full depth spreads
over all its layers), times the runs it takes there (warm-up, timed steps, a memory step in the first stack), plus a
child world's start; once candidates have run, scaled by what they took against their estimates (``learned_ratio``).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

from .settings import SETTINGS, TuneSettings

Clock = Callable[[], float]


@dataclass
class Budget:
    """``limit_s`` seconds from ``start`` (a reading of ``clock``; default: the moment it is made)."""

    limit_s: float
    clock: Clock = time.monotonic
    start: float | None = field(default=None)

    def __post_init__(self) -> None:
        if self.start is None:
            self.start = self.clock()

    def elapsed(self) -> float:
        """Seconds spent since the budget started."""
        return self.clock() - self.start

    def left(self) -> float:
        """Seconds left (0 once spent)."""
        return max(self.limit_s - self.elapsed(), 0.0)

    def spent(self) -> bool:
        """Whether nothing is left."""
        return self.left() <= 0.0


def runs_per_count(warmup: int, iters: int, first: bool = True) -> int:
    """Steps a measurement runs at a block count: warm-up, at most ``iters`` timed and, in the ``first`` stack it
    builds, one memory step; a later stack reads its memory in its last warm-up step, one at least
    (``candidate._measure_stack``)."""
    return warmup + iters + 1 if first else max(warmup, 1) + iters


def candidate_seconds(stack_runs_s: list[float], warmup: int, iters: int,
                      overhead_s: float = SETTINGS.candidate_overhead_s) -> float:
    """A first estimate of a candidate's wall seconds: ``overhead_s`` (its child world's start and its stacks'
    builds) plus ``runs_per_count`` runs of each stack it builds, ``stack_runs_s`` the model's seconds for one run of
    each (``pool.stack_runs``), the first built first."""
    return overhead_s + sum(runs_per_count(warmup, iters, i == 0) * s for i, s in enumerate(stack_runs_s))


def at_iters(estimate: float, iters: int, warmup: int, full_iters: int,
             overhead_s: float = SETTINGS.candidate_overhead_s) -> float:
    """``estimate`` (a candidate timed at ``full_iters`` steps) at ``iters`` timed steps instead (its two stacks'
    runs counted as if they cost alike)."""
    runs = lambda k: runs_per_count(warmup, k) + runs_per_count(warmup, k, first=False)  # noqa: E731
    return overhead_s + runs(iters) / runs(full_iters) * max(estimate - overhead_s, 0.0)


def learned_ratio(walls: list[float], first_estimates: list[float],
                  overhead_s: float = SETTINGS.candidate_overhead_s) -> float | None:
    """The median of measured wall seconds over the first estimate, beyond the fixed overhead (None before any)."""
    ratios = [(w - overhead_s) / (e - overhead_s) for w, e in zip(walls, first_estimates) if e > overhead_s and w > 0]
    return max(statistics.median(ratios), 0.1) if ratios else None


def scaled(first_estimate: float, ratio: float | None, overhead_s: float = SETTINGS.candidate_overhead_s) -> float:
    """``first_estimate`` corrected by what the measured candidates took against theirs."""
    if ratio is None:
        return first_estimate
    return overhead_s + ratio * max(first_estimate - overhead_s, 0.0)


def kernel_budget(left_s: float, candidates_s: float, settings: TuneSettings = SETTINGS) -> float:
    """Seconds the kernel sweep may take: ``settings.kernel_share`` of what is left, less where the candidates need
    more, at least ``settings.kernel_min_s``."""
    return max(settings.kernel_min_s, min(settings.kernel_share * left_s, left_s - candidates_s))


def fmt(seconds: float) -> str:
    """Seconds as m:ss."""
    s = max(int(round(seconds)), 0)
    return f"{s // 60}:{s % 60:02d}"
