"""Which candidate `sp-plan tune` measures next, and when it stops (pure functions, no torch).

The model's ranking, diversified, is the pool: one entry per (algorithm, degrees, team, placement,
token layout), its best mesh order and memory policy, so the budget is not spent on five mesh
orders of one layout. After each measurement the model is refitted; its leave-one-out error is
the uncertainty sigma of a prediction (log-normal: ln t ~ N(ln pred, sigma)). The next candidate
is the one most likely to beat the best measured step by ``margin``; tune stops when none has a
``min_chance`` of doing so, at the budget, or at the time limit (issue 10, "choice of what to measure").
"""
from __future__ import annotations

import math
from dataclasses import dataclass

#: uncertainty before anything is measured: the model's known error on real steps (1.7-2.6x on one H100)
PRIOR_SIGMA = 0.5
#: never trust the model more than this, however small its leave-one-out error
MIN_SIGMA = 0.05
#: a leave-one-out error needs this many measured candidates to mean anything; below it tune neither
#: trusts it nor stops early
MIN_MEASURED = 3


def diversity_key(plan) -> tuple:
    """What makes two candidates different layouts rather than two orders or policies of one layout."""
    d = plan.degrees
    return (plan.algorithm, tuple(sorted((k, v) for k, v in d.items() if v > 1)), plan.placement, plan.token_layout)


def diversify(plans: list, size: int) -> list:
    """The first ``size`` plans (fastest first) with distinct ``diversity_key``s."""
    seen, out = set(), []
    for p in plans:
        k = diversity_key(p)
        if k not in seen:
            seen.add(k)
            out.append(p)
            if len(out) == size:
                break
    return out


def chance_to_beat(predicted_s: float, best_measured_s: float, sigma: float, margin: float = 0.01) -> float:
    """P(measured < (1 - margin) x best measured) when ln(measured) ~ N(ln(predicted), sigma^2)."""
    if predicted_s <= 0:
        return 1.0
    z = (math.log((1 - margin) * best_measured_s) - math.log(predicted_s)) / max(sigma, 1e-9)
    return 0.5 * math.erfc(-z / math.sqrt(2))


def sigma_from(loo_error: float | None, measured: int = MIN_MEASURED) -> float:
    """The log-space uncertainty of a prediction from the model's median relative leave-one-out error over
    ``measured`` candidates (the prior below MIN_MEASURED)."""
    if loo_error is None or measured < MIN_MEASURED:
        return PRIOR_SIGMA
    # median |ln(pred/meas)| of a normal is 0.674 sigma
    return max(MIN_SIGMA, math.log1p(abs(loo_error)) / 0.674)


@dataclass
class Choice:
    index: int | None  # into the pool; None = stop
    chance: float
    why: str


def next_candidate(predicted: list[float], done: list[bool], best_measured_s: float | None, sigma: float,
                   min_chance: float = 0.05, margin: float = 0.01, min_measured: int = MIN_MEASURED) -> Choice:
    """The unmeasured candidate most likely to beat the best measured one (the model's best first); no early
    stop before ``min_measured`` candidates were measured."""
    todo = [i for i, d in enumerate(done) if not d]
    if not todo:
        return Choice(None, 0.0, "every candidate in the pool was measured")
    if best_measured_s is None:
        i = min(todo, key=lambda j: (predicted[j], j))
        return Choice(i, 1.0, "the model's best")
    chances = {i: chance_to_beat(predicted[i], best_measured_s, sigma, margin) for i in todo}
    i = max(todo, key=lambda j: (chances[j], -predicted[j], -j))
    if chances[i] < min_chance and sum(done) >= min_measured:
        return Choice(None, chances[i], f"no unmeasured candidate has a {min_chance:.0%} chance to beat the best "
                                        f"measured by {margin:.0%} (best chance {chances[i]:.1%})")
    return Choice(i, chances[i], f"{chances[i]:.0%} chance to beat the best measured by {margin:.0%}")
