"""Equivalent candidates: ranked plans with the same predicted cost that differ in one parameter only
(TokenRing x Ring's team 2, 4 and 8 at one step time) are shown as one row naming the alternatives."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

from .candidate import Candidate
from .plan import Plan

REL_TOL = 1e-9  # costs equal to rounding: the same predicted step and peak memory


@dataclass
class Row:
    """One row of a ranking: a plan and the plans equivalent to it (same cost, one parameter different)."""

    plan: Plan
    alternatives: list[Plan]
    parameter: str | None = None  # the parameter the alternatives differ in

    def label(self) -> str:
        """The plan's summary, plus the alternatives' values, e.g. '... team2 ... (same: team 4, 8)'."""
        if not self.alternatives:
            return self.plan.summary()
        return f"{self.plan.summary()} (same: {self.parameter} {', '.join(_value(p, self.parameter) for p in self.alternatives)})"


def _value(p: Plan, parameter: str) -> str:
    v = getattr(Candidate.from_plan(p), parameter)
    return "<".join(o for o in v if p.degrees.get(o, 1) > 1) if parameter == "order" else str(v)


def differing(a: Plan, b: Plan) -> list[str]:
    """The layout parameters (algorithm, degrees, team, order, token layout, memory policy, placement) that differ."""
    ca, cb = Candidate.from_plan(a), Candidate.from_plan(b)
    return [f.name for f in fields(Candidate) if getattr(ca, f.name) != getattr(cb, f.name)]


def same_cost(a: Plan, b: Plan) -> bool:
    pa, pb = a.predicted, b.predicted
    return (pa is not None and pb is not None and math.isclose(pa.step_time_s, pb.step_time_s, rel_tol=REL_TOL)
            and math.isclose(pa.peak_memory_bytes, pb.peak_memory_bytes, rel_tol=REL_TOL))


def group(plans: list[Plan]) -> list[Row]:
    """Rows of a ranking (fastest first): each plan joins the first earlier row of the same cost whose plan it
    differs from in the same single parameter as that row's other alternatives; otherwise it starts a row."""
    rows: list[Row] = []
    for p in plans:
        for r in rows:
            diff = differing(r.plan, p)
            if same_cost(r.plan, p) and len(diff) == 1 and r.parameter in (None, diff[0]):
                r.alternatives.append(p)
                r.parameter = diff[0]
                break
        else:
            rows.append(Row(p, []))
    return rows


def exact_prefix(ranked: list, keep: int) -> int:
    """How many of a ranking's first entries are exact: the first ``keep`` and any after them at the same time
    (a best-first search keeps every candidate no slower than its keep-th best)."""
    if len(ranked) <= keep:
        return len(ranked)
    n, last = keep, ranked[keep - 1][0]
    while n < len(ranked) and math.isclose(ranked[n][0], last, rel_tol=REL_TOL):
        n += 1
    return n


def top_rows(search, finish, top: int, complete: bool = False):
    """(search result, the first ``top`` distinct rows): ``search(keep)`` ranks with its best ``keep`` exact,
    ``finish(result, n)`` makes Plans of the first n; ``keep`` doubles (a new search unless ``complete``, a
    ranking that is exact throughout) until the rows number ``top`` or the ranking ends."""
    keep = top
    res = search(keep)
    while True:
        n = exact_prefix(res.ranked, keep)
        rows = group(finish(res, n))
        if len(rows) >= top or n >= len(res.ranked) and (complete or len(res.ranked) < keep):
            return res, rows[:top]
        keep *= 2
        if not complete:
            res = search(keep)
