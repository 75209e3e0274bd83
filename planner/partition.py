"""A grid search split into shares of its degrees choices, and the shares' results merged into the one ranking.

Each share is searched exactly (``search.grid_search`` over a ``Share``), pruned against its own K-th time and its
own variants' bests and those the other shares publish (``planner.exchange``). Those are never faster than the
whole space's, so a share ranks every one of its layouts that the whole search would rank, and more: the merged
ranking holds every layout no slower than the whole search's K-th distinct time, and each variant's exact best,
which is all that its top rows and "best of each variant" read (``equivalent.top_rows``,
``search.best_per_variant``)."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, fields
from typing import Iterator

from .search import Degrees, SearchResult, Space, _sort_key, by_policy, variant_keys


@dataclass
class Share(Space):
    """The degrees choices of ``space`` whose ring degree is one of ``rings``: the choices of one ring degree share
    its attention schedules and its masks' work over the packs, so no two shares build them both."""

    rings: frozenset = frozenset()

    def degrees(self) -> Iterator[Degrees]:
        return (d for d in super().degrees() if d.ring in self.rings)


def shares(space: Space, parts: int) -> list[Share]:
    """``space`` cut into at most ``parts`` shares that together hold each of its degrees choices once: its ring
    degrees dealt, most choices first, each to the share holding the fewest choices so far (as even as whole ring
    degrees allow)."""
    counts = Counter(d.ring for d in space.degrees())
    rings: list[set] = [set() for _ in range(min(parts, len(counts)))]
    held = [0] * len(rings)
    for ring, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        k = held.index(min(held))
        rings[k].add(ring)
        held[k] += n
    given = {f.name: getattr(space, f.name) for f in fields(Space)}
    return [space.sharing_memos(Share(**given, rings=frozenset(r))) for r in rings]


def variant_key_list(space: Space) -> list[tuple]:
    """Every variant key a search of ``space`` ranks under (``search.variant_keys``), in one order for all shares:
    the slots of their ``Exchange``."""
    by_layout = by_policy(space.work)
    keys = {k for d in space.degrees() for ks in variant_keys(space, d, space.variants(d), by_layout).values()
            for k in ks}
    return sorted(keys, key=repr)


def merged(results: list[SearchResult]) -> SearchResult:
    """One SearchResult of the shares' results: their rankings in one order (``grid_search``'s), their counts
    summed, priced by the first share's estimator."""
    ranked = sorted((tc for r in results for tc in r.ranked), key=lambda tc: (round(tc[0], 12), _sort_key(tc[1])))
    first = results[0]
    return SearchResult(ranked, sum(r.evaluated for r in results), sum(r.space for r in results),
                        sum(r.rejected for r in results), first.estimator, first.profile, first.profile_line,
                        {c: p for r in results for c, p in r.predicted.items()})
