"""A grid search split into shares of its degrees choices, and the shares' results merged into the one ranking.

Each share is searched exactly (``search.grid_search`` over a ``Share``), pruned against its own K-th time and its
own variants' bests. Those are never faster than the whole space's, so a share ranks every one of its layouts that
the whole search would rank, and more: the merged ranking holds every layout no slower than the whole search's K-th
distinct time, and each variant's exact best, which is all that its top rows and "best of each variant" read
(``equivalent.top_rows``, ``search.best_per_variant``)."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Iterator

from .search import Degrees, SearchResult, Space, _sort_key


@dataclass
class Share(Space):
    """The degrees choices of ``space`` whose position in its order is ``part`` modulo ``parts``: neighbours in
    that order differ in one degree and cost alike, so the shares' work comes out even."""

    part: int = 0
    parts: int = 1

    def degrees(self) -> Iterator[Degrees]:
        for i, d in enumerate(super().degrees()):
            if i % self.parts == self.part:
                yield d


def shares(space: Space, parts: int) -> list[Share]:
    """``space`` cut into ``parts`` shares that together hold each of its degrees choices once."""
    given = {f.name: getattr(space, f.name) for f in fields(Space)}
    return [Share(**given, part=k, parts=parts) for k in range(parts)]


def merged(results: list[SearchResult]) -> SearchResult:
    """One SearchResult of the shares' results: their rankings in one order (``grid_search``'s), their counts
    summed, priced by the first share's estimator."""
    ranked = sorted((tc for r in results for tc in r.ranked), key=lambda tc: (round(tc[0], 12), _sort_key(tc[1])))
    first = results[0]
    return SearchResult(ranked, sum(r.evaluated for r in results), sum(r.space for r in results),
                        sum(r.rejected for r in results), first.estimator, first.profile, first.profile_line)
