"""What the shares of one grid search (``planner.partition``) tell each other while they run: the least K-th time and
each algorithm variant's best time that any of them has priced.

Each is the time of a layout some share ranked, so neither is below the whole search's K-th time or a variant's
best: a share may prune against them (``search.grid_search``'s ``reach``) and the merged ranking still holds every
layout the whole search ranks. A share that learns them early prunes as the one search would. The buffer is a
sequence of floats that the processes share (``workers.shared_floats``, a shared mapping); a write that
a concurrent one overtakes is lost, never wrong, since every value written is a priced time."""
from __future__ import annotations

from typing import MutableSequence

INF = float("inf")


class Exchange:
    """The K-th time (slot 0) and each variant key's best time (its slot in ``keys`` order + 1) in ``values``."""

    def __init__(self, keys: list[tuple], values: MutableSequence[float]):
        if len(values) != len(keys) + 1:
            raise ValueError(f"{len(values)} slots for {len(keys)} variant keys and the K-th time")
        self.slots = {k: i + 1 for i, k in enumerate(keys)}
        self.values = values

    def trade(self, kth: float, vkey: tuple, best_of: dict[tuple, float]) -> float:
        """Publish this share's K-th time and ``vkey``'s best, then ``pull``."""
        v = self.values
        if kth < v[0]:
            v[0] = kth
        i = self.slots.get(vkey)
        if i is not None and best_of.get(vkey, INF) < v[i]:
            v[i] = best_of[vkey]
        return self.pull(kth, best_of)

    def beaten(self, vkey: tuple, t: float) -> bool:
        """Whether some share priced a layout of ``vkey`` faster than ``t`` (as the merged ranking orders times, to 12
        digits): a layout at ``t`` is then not that variant's best."""
        i = self.slots.get(vkey)
        return i is not None and round(self.values[i], 12) < round(t, 12)

    def pull(self, kth: float, best_of: dict[tuple, float]) -> float:
        """``best_of`` lowered to every share's bests (in place); the least of ``kth`` and every share's K-th time."""
        v = self.values
        for k, i in self.slots.items():
            t = v[i]
            if t < best_of.get(k, INF):
                best_of[k] = t
        return min(kth, v[0])


def empty(keys: list[tuple]) -> list[float]:
    """A buffer for ``Exchange(keys, ...)`` that nothing has been published to (one process: tests)."""
    return [INF] * (len(keys) + 1)
