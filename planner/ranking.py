"""A ranking as the user reads it: rows of plans, fastest first, each with its equivalent plans, and why a row is
slower than the first (the phase whose exposed time grows most, or the measured difference)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from .errors import PlanError, whole_number

if TYPE_CHECKING:  # names for the annotations only: this module reads plans without loading their modules
    import pandas as pd

    from .equivalent import Row
    from .plan import Plan


def step_time(plan: Plan) -> float:
    """What a plan is ranked by: its measured step where tune measured it, else its predicted step."""
    return plan.measured.step_time_s if plan.measured else plan.predicted.step_time_s


def largest_extra_cost(p: Plan, winner: Plan) -> tuple[str, float]:
    """The phase whose exposed time grows most from the winner to ``p`` (name, extra seconds)."""
    w = {x.name: x.exposed_seconds for x in winner.predicted.breakdown}
    q = {x.name: x.exposed_seconds for x in p.predicted.breakdown}
    diffs = {n: q.get(n, 0.0) - w.get(n, 0.0) for n in set(w) | set(q)}
    name = max(sorted(diffs), key=lambda n: diffs[n])
    return name, diffs[name]


def summarize(p: Plan) -> dict[str, float]:
    """Exposed seconds by category: compute, communication per dimension, pipeline bubble."""
    out: dict[str, float] = {}
    for ph in p.predicted.breakdown:
        key = "compute" if ph.kind == "compute" else ("pipeline bubble" if ph.kind == "bubble" else f"comm {ph.group}")
        out[key] = out.get(key, 0.0) + ph.exposed_seconds
    return out


def secs(x: float) -> str:
    """Seconds as the tables print them: milliseconds below one second."""
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.3f} s"


def versus_first(p: Plan, winner: Plan, first: bool = False) -> str:
    """Why ``p`` ranks below ``winner``: the phase whose exposed time grows most ('comm ring +3.1 ms'), or where tune
    measured either, the measured difference ('2.0 ms slower (both measured)'); '-' for the first row."""
    if first:
        return "-"
    if p.measured or winner.measured:  # ranked by a measurement: the phases do not say why
        both = " (both measured)" if p.measured and winner.measured else ""
        return f"{secs(step_time(p) - step_time(winner))} slower{both}"
    name, extra = largest_extra_cost(p, winner)
    if extra > 0:
        return f"{name} +{secs(extra)}"
    return f"{secs(p.predicted.step_time_s - winner.predicted.step_time_s)} slower"


class RankedPlans(list):
    """Ranked plans, fastest first: one plan per row of the ranking, each row's equivalent plans (same cost, one
    parameter different: planner/equivalent.py) in ``equivalents(i)``; a list of ``Plan`` as before. ``notes``: what
    `sp-plan plan` prints as ``note:`` lines about the inputs (a window that covers the sequence, a cluster whose
    nodes differ)."""

    def __init__(self, rows: Iterable[Row] = (), notes: Iterable[str] = ()):
        rows = list(rows)
        super().__init__(r.plan for r in rows)
        self.rows = rows
        self.notes = list(notes)

    def equivalents(self, i: int) -> list[Plan]:
        """The plans equivalent to the ``i``-th (none: an empty list)."""
        n = len(self.rows)
        if not n:
            raise PlanError("i", "the ranking has no rows", "ask for the equivalents of a ranking with plans")
        return list(self.rows[whole_number("i", i, 0, f"pass a row index from 0 to {n - 1}", high=n - 1)].alternatives)

    def flat(self) -> list[Plan]:
        """Every plan, each row's equivalents after its plan: what ``PlanResponse.plans`` holds."""
        return [q for r in self.rows for q in [r.plan, *r.alternatives]]

    def to_pandas(self) -> pd.DataFrame:
        """One row per plan with the columns `sp-plan plan`'s table shows (times in seconds, memory in bytes)."""
        import pandas as pd  # noqa: PLC0415 - pandas loads in ~0.5 s; only a caller of to_pandas pays for it

        win = self[0] if self else None
        return pd.DataFrame([{"rank": i + 1, "layout": r.label(), "step_s": r.plan.predicted.step_time_s,
                              "measured_s": r.plan.measured.step_time_s if r.plan.measured else None,
                              "tokens_per_s": r.plan.predicted.tokens_per_s, "mfu": r.plan.predicted.mfu,
                              "peak_memory_bytes": r.plan.predicted.peak_memory_bytes,
                              "equivalents": [q.summary() for q in r.alternatives],
                              "vs_first": versus_first(r.plan, win, first=i == 0)} for i, r in enumerate(self.rows)],
                            columns=["rank", "layout", "step_s", "measured_s", "tokens_per_s", "mfu",
                                     "peak_memory_bytes", "equivalents", "vs_first"])


def mfu_text(pred, causal: bool = True) -> str:
    """'MFU 20.7%', and where a mask cuts the attention the MFU counted with full causal attention, as papers count
    it ('MFU 20.7% (23.3% counting full causal attention)'), or full attention for a ``causal`` False workload; that
    count can pass 100 % under a narrow mask, which leaves most of the FLOPs it counts uncomputed, and then says so."""
    if pred.mfu_causal is None:
        return f"MFU {pred.mfu:.1%}"
    over = ": above the peak, as the mask skips most of those FLOPs" if pred.mfu_causal > 1 else ""
    return f"MFU {pred.mfu:.1%} ({pred.mfu_causal:.1%} counting full{' causal' if causal else ''} attention{over})"
