"""Enumerate every valid layout for a world size and rank them by predicted step time (grid search)."""
from __future__ import annotations

from dataclasses import dataclass
from itertools import permutations
from typing import Callable, Iterator

from .cluster import Cluster
from .errors import PlanError
from .estimate import Estimator
from .layout import chunks_needed
from .model import ModelSpec, Workload
from .plan import Plan


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass
class Layouts:
    """The search space of the spine: (algorithm, dp, ulysses, ring, token layout, mesh order)."""

    world: int
    model: ModelSpec
    work: Workload

    def __iter__(self) -> Iterator[Plan]:
        m, w = self.model, self.work
        for dp in divisors(self.world):
            if w.batch % dp:
                continue
            sp = self.world // dp
            for u in divisors(sp):
                if m.heads % u:
                    continue
                r = sp // u
                algo = "usp" if u > 1 and r > 1 else ("ulysses" if u > 1 else "ring")
                layouts = ("contiguous", "zigzag", "striped") if (w.causal and r > 1) else ("contiguous",)
                dims = [n for n, v in (("ulysses", u), ("ring", r), ("dp", dp)) if v > 1] or ["dp"]
                for tl in layouts:
                    if w.seq_len % chunks_needed(tl, r, u):
                        continue
                    for order in permutations(dims):
                        yield Plan(algorithm=algo, degrees={"dp": dp, "ulysses": u, "ring": r}, order=list(order),
                                   token_layout=tl)


def memory_variants(training: bool) -> list[tuple[int, str]]:
    """(ZeRO stage, checkpointing) choices, cheapest first: the search keeps the fastest that fits."""
    if not training:
        return [(0, "none")]
    return [(z, c) for c in ("none", "full") for z in (0, 1, 2, 3)]


@dataclass
class SearchResult:
    ranked: list[Plan]  # fitting plans, fastest first
    evaluated: int
    rejected: int  # layouts with no memory variant that fits


def grid_search(cluster: Cluster, model: ModelSpec, workload: Workload,
                progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """Evaluate every valid layout (with its fastest fitting ZeRO stage and checkpointing) and rank them."""
    est = Estimator(cluster, model, workload)
    space = list(Layouts(cluster.world_size, model, workload))
    ranked, rejected, evaluated = [], 0, 0
    for i, base in enumerate(space):
        best = None
        for zero, ckpt in memory_variants(workload.training):
            cand = base.model_copy(update={"zero_stage": zero, "checkpointing": ckpt})
            pred = est(cand)
            evaluated += 1
            if pred.fits and (best is None or pred.step_time_s < best.predicted.step_time_s * (1 - 1e-12)):
                best = cand.model_copy(update={"predicted": pred})
        if best is None:
            rejected += 1
        else:
            ranked.append(best)
        if progress:
            progress(i + 1, len(space))
    ranked.sort(key=lambda p: (round(p.predicted.step_time_s, 15), p.summary()))
    return SearchResult(ranked, evaluated, rejected)


def plan(cluster: Cluster, model: ModelSpec, workload: Workload, top_k: int = 5,
         progress: Callable[[int, int], None] | None = None) -> list[Plan]:
    """The ``top_k`` best plans for this cluster, model and workload, fastest first (deterministic)."""
    if cluster.world_size < 1:
        raise PlanError("cluster", "has no devices", "give a cluster with at least one device")
    res = grid_search(cluster, model, workload, progress)
    if not res.evaluated:
        W = cluster.world_size
        need = min(chunks_needed("contiguous", W // d) for d in divisors(W) if workload.batch % d == 0)
        raise PlanError("seq_len", f"no layout of {W} ranks can split {workload.seq_len} tokens "
                        f"(the fewest chunks any layout needs is {need})",
                        f"use a sequence length divisible by {2 * W} (or by {need} for a contiguous ring)")
    if not res.ranked:
        raise PlanError("workload", f"no layout of {cluster.world_size} ranks fits in memory "
                        f"({res.rejected} layouts tried, {cluster.device(0).memory_bytes / 2**30:.0f} GiB per device)",
                        "use more nodes, a shorter --seq-len or a smaller --batch")
    fp = cluster.fingerprint()
    return [p.model_copy(update={"cluster": cluster.name, "cluster_fingerprint": fp, "model": model,
                                 "workload": workload, "groups": p.layout().all_groups()})
            for p in res.ranked[:top_k]]


def largest_extra_cost(p: Plan, winner: Plan) -> tuple[str, float]:
    """The phase whose exposed time grows most from the winner to ``p`` (name, extra seconds)."""
    w = {x.name: x.exposed_seconds for x in winner.predicted.breakdown}
    q = {x.name: x.exposed_seconds for x in p.predicted.breakdown}
    diffs = {n: q.get(n, 0.0) - w.get(n, 0.0) for n in set(w) | set(q)}
    name = max(sorted(diffs), key=lambda n: diffs[n])
    return name, diffs[name]
