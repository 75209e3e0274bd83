"""Bayesian search (optuna) over the same space as the grid.

A trial chooses the degrees (dp, pp, tp, ulysses; ring is the rest of the world). Those choices
are what make the space large and what a measured trial on a real cluster costs; for a chosen
set of degrees, the algorithm variant, token layout, mesh order and memory policy are priced
together exactly (they share the cached per-layer costs), and the trial's value is the best of
them. Invalid degrees (a product that does not divide the world, heads not divisible, a sequence
that does not split, nothing fits in memory) are scored with a penalty and never become plans.
TPE by default, seeded; an optional storage URL (e.g. sqlite:///study.db) resumes a study.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import optuna

from .candidate import Candidate
from .cluster import Cluster
from .errors import PlanError
from .estimate import Estimator
from .model import MAX_SEED, ModelSpec, Workload
from .params import Params
from .search import Degrees, SearchResult, Space, _sort_key, degree_groups, degree_size, divisors, price_group

PENALTY = 1e12  # score of an invalid trial (seconds); far above any real step time


@dataclass
class BayesResult(SearchResult):
    trials: int = 0
    visited: int = 0  # candidates of the degrees choices its trials sampled (``space``: all of them)
    best_trial: int = -1  # index of the first trial that reached the best value
    study: optuna.Study | None = None


def _choices(space: Space) -> dict[str, list[int]]:
    """Fixed categorical choices per degree (optuna's TPE needs the same distribution every trial)."""
    W, m, w = space.world, space.model, space.work
    return {"dp": [d for d in divisors(W) if w.batch % d == 0],
            "pp": [d for d in divisors(W) if d <= m.layers],
            "tp": [d for d in divisors(W) if not m.tp_problem(d) and (not space.tp_max or d <= space.tp_max)],
            "ulysses": [d for d in divisors(W) if m.heads % d == 0]}


def _open_study(sampler, storage: str | None, study_name: str | None) -> optuna.Study:
    """A new study, or the named one in ``storage`` (resumed); a storage that cannot be opened is a PlanError."""
    # optuna's RDB storage is SQLAlchemy, which optuna itself loads only for a storage (~0.3 s)
    from sqlalchemy.exc import SQLAlchemyError  # noqa: PLC0415

    try:
        return optuna.create_study(direction="minimize", sampler=sampler, storage=storage,
                                   study_name=study_name, load_if_exists=storage is not None)
    except (SQLAlchemyError, ImportError, ValueError, OSError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise PlanError("storage", f"cannot open optuna storage {storage!r} ({first})",
                        "pass a database URL such as sqlite:///study.db (its directory must exist)") from None


def bayes_search(cluster: Cluster, model: ModelSpec, workload: Workload, trials: int = 100, seed: int = 0,
                 storage: str | None = None, study_name: str | None = None, space: Space | None = None,
                 sampler: optuna.samplers.BaseSampler | None = None,
                 progress: Callable[[int, int], None] | None = None, params: Params | None = None) -> BayesResult:
    """Run ``trials`` optuna trials; return every priced layout ranked, and where the best was found
    (``params``: calibrated physical parameters, planner/params.py; None: the uncalibrated engine)."""
    if trials < 1:
        raise PlanError("trials", f"must be at least 1, got {trials}", "pass --trials 1 or more")
    if not 0 <= seed <= MAX_SEED:
        raise PlanError("seed", f"must be from 0 to {MAX_SEED:,}, got {seed}", f"give a seed from 0 to {MAX_SEED:,}")
    est = Estimator(cluster, model, workload, params=params)
    space = space or Space(cluster.world_size, model, workload)
    choices = _choices(space)
    valid = {(d.dp, d.pp, d.tp, d.ulysses): d for d in space.degrees()}
    priced: dict[tuple, list[tuple[float, Candidate]]] = {}
    batches: dict = {}
    counts = {"visited": 0, "rejected": 0, "evaluated": 0}

    def objective(trial: optuna.Trial) -> float:
        key = tuple(trial.suggest_categorical(n, choices[n]) for n in ("dp", "pp", "tp", "ulysses"))
        d: Degrees | None = valid.get(key)
        if d is None:
            trial.set_user_attr("invalid", "degrees do not form a valid layout")
            return PENALTY
        if key not in priced:
            found, n, r = degree_groups(est, space, d)
            counts["visited"] += n
            counts["rejected"] += r
            priced[key] = [tc for base, orders, fitting in found for tc in price_group(est, base, orders, fitting, batches)]
            counts["evaluated"] += sum(len(o) * len(f) for _, o, f in found)
        if not priced[key]:
            trial.set_user_attr("invalid", "no memory policy fits")
            return PENALTY
        return min(t for t, _ in priced[key])

    optuna.logging.set_verbosity(logging.WARNING)
    sampler = sampler or optuna.samplers.TPESampler(seed=seed)
    study = _open_study(sampler, storage, study_name)
    callbacks = [lambda st, tr: progress(len(st.trials), trials)] if progress else None
    study.optimize(objective, n_trials=trials, callbacks=callbacks)
    ranked = sorted((tc for v in priced.values() for tc in v), key=lambda tc: (round(tc[0], 12), _sort_key(tc[1])))
    values = [t.value for t in study.trials if t.value is not None]
    best = min(values) if values else PENALTY
    first = next((i for i, v in enumerate(values) if v <= best * (1 + 1e-12)), -1)
    # the space is every degrees choice's candidates, as the grid counts it, not only those the trials visited
    total = sum(degree_size(space, d) for d in valid.values())
    return BayesResult(ranked, counts["evaluated"], total, counts["rejected"], est,
                       trials=len(study.trials), best_trial=first, study=study, visited=counts["visited"])


def trials_to_reach(result: BayesResult, target: float, tolerance: float = 0.01) -> int | None:
    """1-based number of trials after which the best value is within ``tolerance`` of ``target``."""
    best = float("inf")
    for i, t in enumerate(result.study.trials):
        if t.value is not None:
            best = min(best, t.value)
        if best <= target * (1 + tolerance):
            return i + 1
    return None
