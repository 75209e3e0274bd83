"""Sensitivity: does the winner hold when a link class is slower or faster, or compute runs below its model?

Each scenario changes one physical input and re-ranks (grid search, best plan only): every link class's
bandwidth (a link kind of the cluster graph: nvswitch, pcie, ib, ...) halved and doubled, and every compute
efficiency (GEMM and attention, the device's or the profile's curves) at 80 %. For each it records the new
winner, the old winner's step time under the same change, and so what keeping the old winner would lose.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TypeVar

from .cluster import NET, Cluster
from .engine import LinkEngine
from .errors import of_type
from .estimate import Estimator
from .model import ModelSpec, Workload
from .params import CURVES, Curve, Params
from .plan import Plan
from .profile import pure_inputs

LINK_FACTORS = (0.5, 2.0)
COMPUTE_FACTOR = 0.8
#: relative step-time difference under which two plans count as tied (equal-cost variants)
TIE = 1e-9

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class Scenario:
    """One changed input, its winner, and the old winner priced under the same change."""

    name: str  # e.g. "ib x0.5"
    what: str  # e.g. "ib bandwidth halved (inter-node links)"
    winner: Plan  # the best plan under the change
    old_winner_s: float  # the base winner's step time under the change
    base_s: float  # the base winner's step time without the change

    @property
    def holds(self) -> bool:
        """The base winner is still (one of) the fastest under the change."""
        return self.old_winner_s <= self.winner.predicted.step_time_s * (1 + TIE)

    @property
    def loss(self) -> float:
        """Relative step time the base winner gives up against the new winner (0 when it holds)."""
        return 0.0 if self.holds else self.old_winner_s / self.winner.predicted.step_time_s - 1

    def line(self) -> str:
        """One line: does the winner hold, how its step time moves, what it would lose."""
        moved = f"winner's step {_secs(self.base_s)} -> {_secs(self.old_winner_s)} ({self.old_winner_s / self.base_s - 1:+.1%})"
        if self.holds:
            return f"{self.what}: winner holds; {moved}"
        return (f"{self.what}: winner changes to {self.winner.summary()} ({_secs(self.winner.predicted.step_time_s)}); "
                f"keeping the winner loses {self.loss:.1%}; {moved}")


@dataclass
class Sensitivity:
    """The base winner and every scenario."""

    winner: Plan
    scenarios: list[Scenario]

    @property
    def robust(self) -> bool:
        return all(s.holds for s in self.scenarios)


def _secs(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.3f} s"


def link_classes(cluster: Cluster) -> dict[str, str]:
    """Link kind -> "inter-node" (links into the fabric) or "intra-node", for the kinds this cluster has."""
    out: dict[str, str] = {}
    for t in set(cluster.nodes):
        for l in cluster.node_types[t].links:
            if cluster.num_nodes == 1 and NET in (l.src, l.dst):
                continue  # a lone node's NIC carries nothing
            out.setdefault(l.kind, "inter-node" if NET in (l.src, l.dst) else "intra-node")
    return dict(sorted(out.items(), key=lambda kv: (kv[1] != "intra-node", kv[0])))


def scale_links(cluster: Cluster, kind: str, factor: float) -> Cluster:
    """A copy of ``cluster`` whose links of ``kind`` carry ``factor`` times their capacity."""
    types = {name: nt.model_copy(update={"links": [l.model_copy(update={"capacity": l.capacity * factor})
                                                   if l.kind == kind else l for l in nt.links]})
             for name, nt in cluster.node_types.items()}
    return cluster.model_copy(update={"node_types": types})


def _scale_curve(c: Curve | None, factor: float) -> Curve | None:
    """``c`` with every efficiency times ``factor``: a what-if, so a point scaled below a profile's floor stays."""
    return None if c is None else c.model_copy(update={"points": tuple((x, y * factor) for x, y in c.points)})


def scale_compute(cluster: Cluster, params: Params, factor: float) -> tuple[Cluster, Params]:
    """``cluster`` and ``params`` with every compute efficiency (GEMM, attention) times ``factor``."""
    types = {}
    for name, nt in cluster.node_types.items():
        devs = [d.model_copy(update={"matmul_efficiency": d.matmul_efficiency * factor,
                                     "attn_efficiency": d.attn_efficiency * factor}) for d in nt.devices]
        types[name] = nt.model_copy(update={"devices": devs})
    scaled = params.model_copy(update={k: _scale_curve(getattr(params, k), factor)
                                       for k in CURVES})
    return cluster.model_copy(update={"node_types": types}), scaled


def _best(cluster: Cluster, model: ModelSpec, workload: Workload, params: Params) -> Plan | None:
    from .search import finish, grid_search

    res = grid_search(cluster, model, workload, keep=1, params=params, variants=False)  # the winner alone
    return finish(res, cluster, model, workload, 1)[0] if res.ranked else None


def scenarios(cluster: Cluster, params: Params) -> list[tuple[str, str, Cluster, Params]]:
    """(name, description, cluster, params) of every change: link classes halved and doubled, compute at 80 %."""
    out = []
    for kind, where in link_classes(cluster).items():
        for f in LINK_FACTORS:
            how = "halved" if f == 0.5 else ("doubled" if f == 2 else f"x{f:g}")
            out.append((f"{kind} x{f:g}", f"{kind} bandwidth {how} ({where} links)", scale_links(cluster, kind, f), params))
    c, p = scale_compute(cluster, params, COMPUTE_FACTOR)
    out.append((f"compute x{COMPUTE_FACTOR:g}", f"compute efficiency at {COMPUTE_FACTOR:.0%}", c, p))
    return out


def unrouted(base: Estimator, changed: Cluster) -> bool:
    """Every route of ``changed`` is ``base``'s and crosses no link whose capacity differs: no price can move, so
    the ranking is the base one (a link kind no flow takes, such as the CPU sockets' link on a DGX)."""
    engine = LinkEngine(changed)
    routes = engine.routes()
    if routes != base.engine.routes():
        return False
    edges = {e for route, _ in routes for e in route}
    return all(engine.local.edges[e]["capacity"] == base.engine.local.edges[e]["capacity"] for e in edges)


def in_order(fn: Callable[[T], R], items: list[T]) -> list[R]:
    """``[fn(x) for x in items]``: the re-rankings one after another (``sensitivity``'s default)."""
    return [fn(x) for x in items]


def sensitivity(cluster: Cluster, model: ModelSpec, workload: Workload, winner: Plan,
                params: Params | None = None, each: Callable[[Callable, list], list] = in_order) -> Sensitivity:
    """Re-rank under every scenario and price ``winner`` under each (the search's own engine); a change that no
    route crosses (``unrouted``) keeps the base ranking without a search. ``each(fn, items)`` runs the
    re-rankings, ``[fn(x) for x in items]`` in some order or processes of the caller's (``workers.forked_map``)."""
    pure_inputs(cluster, model, workload, None)
    of_type("winner", winner, Plan, "a Plan (Plan.load(file), or one sp_plan.plan returned)")
    of_type("params", params, (Params, type(None)), "a Params, or None for the uncalibrated engine")
    params = params if params is not None else Params()
    base = Estimator(cluster, model, workload, params=params)
    base_s = base(winner).step_time_s
    loose = winner.model_copy(update={"cluster_fingerprint": None})  # the changed clusters hash differently
    changes = []  # (name, what, cluster, params, the winner's step under it, whether the ranking stays the base one)
    for name, what, c, p in scenarios(cluster, params):
        old = Estimator(c, model, workload, params=p)(loose).step_time_s
        changes.append((name, what, c, p, old, p is params and old == base_s and unrouted(base, c)))
    bests = iter(each(lambda cp: _best(cp[0], model, workload, cp[1]), [(c, p) for *_, c, p, _, kept in changes
                                                                          if not kept]))
    out = []
    for name, what, _, _, old, kept in changes:
        best = winner if kept else next(bests)
        if best is None:  # nothing fits: memory does not change with bandwidth or efficiency, so never here
            continue
        out.append(Scenario(name, what, best, old, base_s))
    return Sensitivity(winner, out)
