"""Alpha-beta fits of link measurements and their write-back into a Cluster (no torch.distributed here).

A measurement of ``op`` on a group of ``n`` ranks moving ``S`` bytes in ``t`` seconds is fitted as
``t = alpha + S * factor / busbw`` with nccl-tests' bus-bandwidth factors (PERFORMANCE.md): 1 for
send/recv, (n-1)/n for all-gather, reduce-scatter and all-to-all, 2(n-1)/n for all-reduce. ``S`` is
nccl-tests' size: the bytes sent (send/recv), the gathered output, the scattered input, the all-to-all
buffer of one rank.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from sp_plan.planner.calibration import bus_factor  # noqa: F401 - the link fits' factors, public here too
from sp_plan.planner.cluster import NET, Cluster
from sp_plan.planner.engine import LinkEngine

OPS = ("p2p", "p2p_bidir", "all_gather", "reduce_scatter", "all_to_all")


@dataclass
class Sample:
    """One measured point (seconds per operation, slowest rank), or a failure with its reason."""

    link_class: str
    op: str
    group_size: int
    nbytes: int
    seconds: float | None
    error: str = ""

    @property
    def busbw(self) -> float:
        return self.nbytes * bus_factor(self.op, self.group_size) / self.seconds if self.seconds else 0.0


@dataclass
class Fit:
    """``t = alpha + bytes * factor / busbw`` for one link class and op."""

    link_class: str
    op: str
    group_size: int
    alpha: float
    busbw: float
    peak_busbw: float
    points: int


def fit_alpha_beta(x: list[float], t: list[float]) -> tuple[float, float]:
    """(alpha seconds, beta bytes/s) minimizing relative error of ``t = alpha + x / beta``; alpha >= 0."""
    x_a, t_a = np.asarray(x, float), np.asarray(t, float)
    peak = float(np.max(x_a / t_a))
    if len(x_a) < 2 or np.ptp(x_a) == 0:
        return 0.0, peak
    a = np.stack([1 / t_a, x_a / t_a], axis=1)
    (alpha, inv_beta), *_ = np.linalg.lstsq(a, np.ones_like(t_a), rcond=None)
    if alpha < 0:  # pure bandwidth: refit the slope alone
        alpha, inv_beta = 0.0, float(np.sum(x_a / t_a) / np.sum((x_a / t_a) ** 2))
    if inv_beta <= 0 or not math.isfinite(inv_beta):  # latency-bound everywhere: best seen rate
        return float(np.min(t_a)), peak
    return float(alpha), float(1 / inv_beta)


def fit_samples(samples: list[Sample]) -> list[Fit]:
    """One Fit per (link class, op, group size) from its successful samples."""
    keys = dict.fromkeys((s.link_class, s.op, s.group_size) for s in samples)
    fits = []
    for cls, op, n in keys:
        ok = [s for s in samples if (s.link_class, s.op, s.group_size) == (cls, op, n) and s.seconds]
        if not ok:
            continue
        f = bus_factor(op, n)
        alpha, beta = fit_alpha_beta([s.nbytes * f for s in ok], [s.seconds for s in ok])
        fits.append(Fit(cls, op, n, alpha, beta, max(s.busbw for s in ok), len(ok)))
    return fits


def _route(cluster: Cluster, src: int, dst: int):
    """Node-0 edges (with attributes) and path latency of a flow, as the cost engine prices it."""
    eng = LinkEngine(cluster)
    edges, lat = eng.route(src, dst)
    remote = cluster.node_of(src) != cluster.node_of(dst)
    return [(e, eng.local.edges[e]) for e in edges], lat, remote


def apply_fits(cluster: Cluster, fits: list[Fit], pairs: dict[str, tuple[int, int]]) -> tuple[Cluster, dict]:
    """Scale a link kind so the measured pair's one-way fit holds; set that kind's latency from alpha.

    Within a node the kind is the slowest link on the pair's path; across nodes it is the network link
    into the fabric. Intra-node classes go first. Returns the new cluster and, per kind, what was applied.
    """
    data = cluster.model_dump()
    applied: dict[str, dict] = {}
    for cls in sorted(pairs, key=lambda c: (not c.startswith("intra"), c)):
        fit = next((f for f in fits if f.link_class == cls and f.op == "p2p"), None)
        if fit is None:
            continue
        cur = Cluster.model_validate(data)
        edges, lat, remote = _route(cur, *pairs[cls])
        if remote:  # across nodes: the network links (into the fabric), whatever else the path holds
            edges_k = [e for e in edges if NET in e[0]]
        else:  # within a node: the slowest link on the path
            edges_k = [min(edges, key=lambda e: e[1]["capacity"])] if edges else []
        if not edges_k:
            continue
        attrs = edges_k[0][1]
        kind, cap = attrs["kind"], attrs["capacity"]
        mult = 2 if remote else 1
        n_kind = mult * sum(1 for _, a in edges if a["kind"] == kind)
        other = lat - n_kind * attrs["latency"]
        new_lat = max(0.0, (fit.alpha - other) / n_kind)
        scale = fit.busbw / cap
        for nt in data["node_types"].values():
            for link in nt["links"]:
                if link["kind"] == kind:
                    link["capacity"] *= scale
                    link["latency"] = new_lat
            for sw in nt["switches"]:
                if sw["kind"] == "nic" and sw.get("network") == kind and sw.get("rate"):
                    sw["rate"] *= scale
        applied[kind] = {"class": cls, "scale": scale, "bottleneck_capacity": fit.busbw, "latency": new_lat,
                         "pair": list(pairs[cls])}
    return Cluster.model_validate(data), applied


def calibrate(cluster: Cluster, samples: list[Sample], pairs: dict[str, tuple[int, int]], meta: dict) -> Cluster:
    """The cluster with fitted capacities and ``calibration['links']`` (fits, samples, failures, what was applied)."""
    fits = fit_samples(samples)
    before = cluster.fingerprint()
    new, applied = apply_fits(cluster, fits, pairs)
    classes: dict[str, dict] = {}
    for f in fits:
        c = classes.setdefault(f.link_class, {"pair": list(pairs.get(f.link_class, ())), "ops": {}})
        c["ops"][f.op] = {"group_size": f.group_size, "alpha_s": f.alpha, "busbw": f.busbw, "peak_busbw": f.peak_busbw,
                          "points": f.points}
    cal = dict(new.calibration)
    cal["links"] = {**meta, "discovered_fingerprint": before, "classes": classes, "applied": applied,
                    "samples": [{k: v for k, v in asdict(s).items() if k != "error"} | {"busbw": s.busbw}
                                for s in samples if s.seconds],
                    "failed": [{"link_class": s.link_class, "op": s.op, "group_size": s.group_size, "nbytes": s.nbytes,
                                "error": s.error} for s in samples if not s.seconds]}
    return new.model_copy(update={"calibration": cal})
