"""Which candidate `sp-plan tune` measures next, and when it stops (pure functions, no torch).

The model's ranking, diversified, is the pool: one entry per (algorithm, degrees, team, placement,
token layout), its best mesh order and memory policy, so the budget is not spent on five mesh
orders of one layout; plus the best layout of every *family* (what the layout exercises that the
others do not: pipeline stages, TP collectives, all-to-all, ring rounds, data-parallel sync) that the
ranking's top left out. Tune first measures the model's best of each family that is a contender
(predicted within ``EXPLORE_FACTOR`` of the best), so that calibration sees every term it fits (a
family never measured cannot be calibrated: on 4 CPU ranks the model priced TP layouts at half
their measured time, and a tune of five ring layouts never learned it); it keeps the last
candidate of the budget for the choice below. After each measurement the model is refitted; its
leave-one-out error is the uncertainty sigma of a prediction (log-normal: ln t ~ N(ln pred, sigma)).
The next candidate is the one most likely to beat the best measured step by ``margin``; tune stops
when none has a ``min_chance`` of doing so, at the budget, or at the time limit.
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
#: a family is worth measuring for calibration when its best layout is predicted within this factor of the best
EXPLORE_FACTOR = 2.0


def diversity_key(plan) -> tuple:
    """What makes two candidates different layouts rather than two orders or policies of one layout."""
    d = plan.degrees
    return (plan.algorithm, tuple(sorted((k, v) for k, v in d.items() if v > 1)), plan.placement, plan.token_layout)


def family(plan) -> str:
    """Which of the model's terms a layout exercises beyond the others: pipeline stages ("pp"), METP's own
    tensor parallelism ("metp"), Megatron TP-sp collectives ("tp"), all-to-all ("ulysses", USP included), ring
    rounds ("ring"), else data-parallel sync or nothing ("dp")."""
    d = plan.degrees
    if d.get("pp", 1) == 1 and plan.algorithm == "metp" and d.get("tp", 1) > 1:
        return "metp"
    for dim in ("pp", "tp", "ulysses", "ring"):
        if d.get(dim, 1) > 1:
            return dim
    return "dp"


def with_families(pool: list, ranked: list) -> list:
    """``pool`` plus the best plan (first in ``ranked``, fastest first) of every family it lacks."""
    have = {family(p) for p in pool}
    out = list(pool)
    for p in ranked:
        f = family(p)
        if f not in have:
            have.add(f)
            out.append(p)
    return out


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


#: families measured whatever their prediction: a pipeline stage holds fewer layers per rank than any other
#: layout, the only measurement that tells a fixed cost per layer (Params.layer_overhead_s) from the compute's
#: efficiency; a Megatron-TP layout is the only one whose TP collectives tell their fixed cost (Params.tp_overhead_s),
#: which its prediction leaves out until measured
ALWAYS_EXPLORE = ("pp", "tp")


def unexplored(predicted: list[float], done: list[bool], families: list[str], factor: float = EXPLORE_FACTOR) -> int | None:
    """The model's best plan of the contender family (best prediction within ``factor`` of the best of all, or a
    family of ``ALWAYS_EXPLORE``) that has no measured plan yet: the families of ``ALWAYS_EXPLORE`` first (they
    alone identify a parameter), then the family with the fastest such plan; None when every contender family was
    measured."""
    if not predicted:
        return None
    top = min(predicted)
    measured = {f for f, d in zip(families, done) if d}
    best: dict[str, int] = {}
    for i, (f, t) in enumerate(zip(families, predicted)):
        contender = t <= factor * top or f in ALWAYS_EXPLORE
        if f not in measured and contender and (f not in best or (t, i) < (predicted[best[f]], best[f])):
            best[f] = i
    return min(best.values(), key=lambda i: (families[i] not in ALWAYS_EXPLORE, predicted[i], i)) if best else None


def next_candidate(predicted: list[float], done: list[bool], best_measured_s: float | None, sigma: float,
                   min_chance: float = 0.05, margin: float = 0.01, min_measured: int = MIN_MEASURED,
                   families: list[str] | None = None, explore: int = 0) -> Choice:
    """The model's best first; then, for up to ``explore`` more picks, the best of each contender family
    not yet measured (``families``: family() of each candidate); then the unmeasured candidate most likely to
    beat the best measured one. No early stop before ``min_measured`` candidates were measured."""
    todo = [i for i, d in enumerate(done) if not d]
    if not todo:
        return Choice(None, 0.0, "every candidate in the pool was measured")
    if best_measured_s is None:
        i = min(todo, key=lambda j: (predicted[j], j))
        return Choice(i, 1.0, "the model's best")
    if families is not None and explore > 0:
        i = unexplored(predicted, done, families)
        if i is not None:
            return Choice(i, chance_to_beat(predicted[i], best_measured_s, sigma, margin),
                          f"the model's best {families[i]} layout: calibrates what the measured ones do not exercise")
    chances = {i: chance_to_beat(predicted[i], best_measured_s, sigma, margin) for i in todo}
    i = max(todo, key=lambda j: (chances[j], -predicted[j], -j))
    if chances[i] < min_chance and sum(done) >= min_measured:
        return Choice(None, chances[i], f"no unmeasured candidate has a {min_chance:.0%} chance to beat the best "
                                        f"measured by {margin:.0%} (best chance {chances[i]:.1%})")
    return Choice(i, chances[i], f"{chances[i]:.0%} chance to beat the best measured by {margin:.0%}")


def quickest_for_fit(index: int, estimates: list[float], done: list[bool], need: int, left: float) -> int:
    """``index``, unless it and the ``need`` - 1 quickest others to measure would not fit ``left`` seconds: then the
    quickest, so that a step-time fit that lacks ``need`` candidates gets as many as the time allows (where not even
    the ``need`` quickest fit, an estimate may be long, and the quickest first are still the fit's best chance)
    (``estimates``: seconds measuring each would take; ``done``: measured or left out)."""
    if need <= 0:
        return index
    quick = sorted((j for j, d in enumerate(done) if not d), key=lambda j: (estimates[j], j))
    with_it = estimates[index] + sum(estimates[j] for j in [j for j in quick if j != index][:need - 1])
    return index if with_it <= left else quick[0]
