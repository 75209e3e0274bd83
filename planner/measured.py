"""Plans that `sp-plan tune` ran on the cluster rank by what they measured.

A profile keeps every candidate its tune measured. For the model and workload it tuned, a measured step is what a
prediction only approximates (the posterior mean at a measured point is the measurement, up to its noise), so a
plan of the same layout is ranked at its measured step time and carries the figures (``Plan.measured``); every
other plan keeps its calibrated prediction. Without this, ``plan`` after a tune could rank first a layout the
tune measured slower than another (two layouts the calibrated model prices within its error of each other).
"""
from __future__ import annotations

from .cluster import Cluster
from .candidate import Candidate
from .equivalent import Row
from .errors import PlanError
from .estimate import Estimator
from .model import ModelSpec, Workload
from .params import Params
from .plan import Measured, Plan
from .profile import MeasuredCandidate, Profile
from .ranking import step_time


def twins(profile: Profile | None, model: ModelSpec, workload: Workload) -> dict[str, MeasuredCandidate]:
    """The profile's candidates that ran ``model`` and ``workload`` and finished, by ``Plan.summary()`` (the layout:
    algorithm, degrees, mesh order, token layout, placement, memory policy); the fastest of a repeated layout."""
    out: dict[str, MeasuredCandidate] = {}
    for c in profile.candidates if profile else []:
        if c.status != "ok" or not c.measured_s:
            continue
        try:
            p = Plan.model_validate(c.plan)
        except (PlanError, ValueError):  # a candidate stored without its plan document (an older or written profile)
            continue
        if p.model != model or p.workload != workload:
            continue
        key = p.summary()
        if key not in out or c.measured_s < out[key].measured_s:
            out[key] = c
    return out


def measured_of(c: MeasuredCandidate, profile: Profile) -> Measured:
    """A measured candidate's figures as a plan file records them."""
    how = "; ".join(f"{k}: {v}" for k, v in c.detail.items() if isinstance(v, (str, int, float)))
    return Measured(step_time_s=c.measured_s, peak_memory_bytes=c.measured_memory or 0.0, profile=profile.id,
                    measured_at=profile.created_at, how=how)


def measured_plan(cluster: Cluster, profile: Profile, params: Params, c: MeasuredCandidate) -> Plan:
    """A measured candidate as a plan file: its prediction under ``params`` and its measured figures beside."""
    plan = Plan.model_validate(c.plan)
    est = Estimator(cluster, plan.model, plan.workload, params=params)
    return plan.model_copy(update={
        "cluster": cluster.name, "cluster_fingerprint": cluster.fingerprint(), "profile": profile.id or "file",
        "predicted": est.predict(Candidate.from_plan(plan)),
        "measured": measured_of(c, profile)}).with_groups()


def mark(plans: list[Plan], profile: Profile | None, model: ModelSpec, workload: Workload) -> list[Plan]:
    """``plans`` with the figures of those tune measured (``Plan.measured``), sorted by ``step_time`` (stable)."""
    found = twins(profile, model, workload)
    out = [p.model_copy(update={"measured": measured_of(found[p.summary()], profile)}) if p.summary() in found else p
           for p in plans]
    return sorted(out, key=step_time)


def rank_rows(rows: list[Row], cluster: Cluster, profile: Profile | None, params: Params, model: ModelSpec,
              workload: Workload) -> list[Row]:
    """Ranking rows with the profile's measured twins: each row's plan that tune measured carries its figures, the
    measured layouts missing from the rows join them, and the rows are re-sorted by ``step_time`` (stable)."""
    found = twins(profile, model, workload)
    if not found:
        return rows
    out = []
    for r in rows:
        c = found.pop(r.plan.summary(), None)
        alts = [a for a in r.alternatives if a.summary() not in found]  # a measured alternative gets a row of its own
        out.append(Row(r.plan.model_copy(update={"measured": measured_of(c, profile)}) if c else r.plan, alts,
                       r.parameter if alts else None))
    out += [Row(measured_plan(cluster, profile, params, c), []) for c in found.values()]
    return sorted(out, key=lambda r: step_time(r.plan))
