"""Equivalent candidates: ranked plans with the same predicted cost that differ in one parameter only
(TokenRing x Ring's team 2, 4 and 8 at one step time) are shown as one row naming the alternatives."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

from .candidate import Candidate
from .plan import Plan, order_text

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
    return order_text(v, p.degrees) if parameter == "order" else str(v)


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
            if not same_cost(r.plan, p):  # first: the parameters compared only where the costs agree
                continue
            diff = differing(r.plan, p)
            if len(diff) == 1 and r.parameter in (None, diff[0]):
                r.alternatives.append(p)
                r.parameter = diff[0]
                break
        else:
            rows.append(Row(p, []))
    return rows


def distinct_prefix(ranked: list, k: int) -> int:
    """How many of a ranking's first entries hold its first ``k`` distinct step times (a time within REL_TOL of
    the first time of its class belongs to that class): what a search keeping ``k`` distinct times ranks exactly
    (``grid_search(distinct=True)``)."""
    n, classes, first = 0, 0, None
    for t, *_ in ranked:
        if first is None or not math.isclose(t, first, rel_tol=REL_TOL):
            classes += 1
            if classes > k:
                break
            first = t
        n += 1
    return n


def top_rows(result, finish, top: int) -> list[Row]:
    """The first ``top`` distinct rows of ``result``, a ranking whose first ``top`` distinct step times are exact
    (``grid_search(..., keep=top, distinct=True)``, or a complete ranking): the plans of those times, finished
    once by ``finish(result, n)``, grouped. Distinct times never share a row, so there are ``top`` rows unless the
    ranking holds fewer."""
    return group(finish(result, distinct_prefix(result.ranked, top)))[:top]
