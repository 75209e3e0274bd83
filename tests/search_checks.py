"""Checks the search tests share."""
from __future__ import annotations

from sp_plan.planner.search import best_per_variant, grid_search


def assert_pruned_ranks_as_exhaustive(cluster, model, work, params, keep: int = 5) -> None:
    """The grid pruned to its top ``keep`` prices fewer candidates and ranks what pricing every candidate ranks:
    every variant's best and the top ``keep``, times and candidates."""
    full = grid_search(cluster, model, work, keep=None, params=params)
    pruned = grid_search(cluster, model, work, keep=keep, params=params)
    assert pruned.evaluated < full.evaluated
    assert best_per_variant(pruned.ranked) == best_per_variant(full.ranked)
    top = [(round(t, 12), c) for t, c in full.ranked[:keep]]
    assert [(round(t, 12), c) for t, c in pruned.ranked[:keep]] == top
