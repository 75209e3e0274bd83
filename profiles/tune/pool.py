"""What `sp-plan tune` may measure and what measuring it should cost: the candidate pool, predictions, estimates.

Rank 0 alone calls these (the tune broadcasts what it decides); they read the planner, never the world.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from sp_plan.planner.candidate import Candidate
from sp_plan.planner.cluster import Cluster
from sp_plan.planner.errors import PlanError
from sp_plan.planner.estimate import Estimator
from sp_plan.planner.model import ModelSpec, Workload, micro_batches
from sp_plan.planner.params import Params
from sp_plan.planner.plan import Plan
from sp_plan.planner.profile import MeasuredCandidate
from sp_plan.planner.search import grid_search

from .budget import at_iters, candidate_seconds, fmt, learned_ratio, scaled
from .candidate import layer_counts, stage_depth
from .choose import diversify, with_families

if TYPE_CHECKING:
    from .run import TuneOptions


def ranked_plans(cluster: Cluster, model: ModelSpec, work: Workload, params: Params, keep: int = 200) -> list[Plan]:
    """The model's ranking as Plans (fastest first, each with its best memory policy), under ``params``."""
    res = grid_search(cluster, model, work, keep=keep, params=params)
    return [c.to_plan(cluster=cluster.name, cluster_fingerprint=cluster.fingerprint(), model=model, workload=work)
            for _, c in res.ranked]


def candidate_pool(cluster: Cluster, model: ModelSpec, work: Workload, params: Params, size: int) -> list[Plan]:
    """What tune may measure: the diversified ranking under ``params`` plus the best layout of every family its
    top left out (choose.with_families; the kernel step times their blocks too, the choice may measure them)."""
    ranked = [p for p in ranked_plans(cluster, model, work, params) if measurable(p, work)]
    return with_families(diversify(ranked, size), diversify(ranked, len(ranked)))


def masked(work: Workload) -> bool:
    """Whether the workload packs documents or slides a window (candidates run on packed batches)."""
    return work.documents is not None or work.mask_window is not None


def measurable(plan: Plan, work: Workload) -> bool:
    """Whether tune can run ``plan`` on the workload: with masks, an algorithm that honours them
    (runtime.attention.MASKED); TP pads each sequence rank's tokens to a multiple of tp (parallel.tokens_of)."""
    from sp_plan.runtime.attention import MASKED  # noqa: PLC0415 - the runtime's registry loads torch and variants

    return not masked(work) or plan.algorithm in MASKED


def attention_predicted(cluster: Cluster, plan: Plan, params: Params) -> float | None:
    """One layer's attention (forward + backward when training) as the model prices it under the plan's mask."""
    try:
        est = Estimator(cluster, plan.model, plan.workload, params=params)
        return est.attention_time(plan, backward=plan.workload.training)[0]
    except PlanError:
        return None


def predict(cluster: Cluster, plan: Plan, params: Params) -> tuple[float, float]:
    """(step seconds, peak bytes) the model predicts for ``plan`` under ``params``."""
    est = Estimator(cluster, plan.model, plan.workload, params=params)
    p = est.predict(Candidate.from_plan(plan))
    return p.step_time_s, p.peak_memory_bytes


def stack_run(cluster: Cluster, plan: Plan, params: Params, blocks: int) -> float:
    """Seconds the model prices one step of the stack a measurement builds: ``blocks`` blocks a stage with the
    embedding, head, loss and optimizer step a stage of any depth runs; a pipeline's one micro-batch of one stage
    (of the m + p - 1 its step composes), twice (``candidate.bench_step``: the second reads the gradients' sync).
    Where the planner refuses that depth, the full step's share of it."""
    d = plan.degrees
    m = micro_batches(plan.workload.batch, d["dp"], plan.micro_batch_size)
    share = 2 / (m + d["pp"] - 1) if d["pp"] > 1 else 1  # a stage's micro-batch run twice, of the m + p - 1
    short = plan.model.model_copy(update={"layers": blocks * d["pp"]})
    try:
        step = predict(cluster, plan.model_copy(update={"model": short, "stage_layers": None,
                                                         "virtual_stages": None}), params)[0]
    except (PlanError, ValueError):  # a depth the layout's stages or the model's layer pattern refuse
        step = predict(cluster, plan, params)[0] * blocks / stage_depth(plan.model, plan)
    return step * share


def first_estimate(cluster: Cluster, plan: Plan, params: Params, opts: TuneOptions) -> float:
    """Seconds measuring ``plan`` should take: each stack it builds priced by the model (``stack_run``), times its
    runs there, plus its child world's start (budget.candidate_seconds)."""
    depth = stage_depth(plan.model, plan)
    runs = [stack_run(cluster, plan, params, n) for n in layer_counts(depth, opts.layers)]
    return candidate_seconds(runs, opts.warmup, opts.iters, opts.settings.candidate_overhead_s)


def estimates(cluster: Cluster, pool: list[Plan], params: Params, opts: TuneOptions,
              measured: dict[str, MeasuredCandidate]) -> dict[str, float]:
    """Each pool plan's estimated seconds, corrected by what the measured candidates took against theirs."""
    first = {p.summary(): first_estimate(cluster, p, params, opts) for p in pool}
    done = [m for m in measured.values() if m.status == "ok" and m.detail.get("wall_s") and m.summary in first]
    over = opts.settings.candidate_overhead_s
    ran = [at_iters(first[m.summary], steps_ran(m.detail, opts.iters), opts.warmup, opts.iters, over)
           for m in done]  # each against its estimate at the timed steps it ran
    ratio = learned_ratio([m.detail["wall_s"] for m in done], ran, over)
    return {n: scaled(e, ratio, over) for n, e in first.items()}


def steps_ran(detail: dict, iters: int) -> float:
    """Timed steps a measured candidate ran a block count, on average (fewer than its iters where its readings
    agreed early, ``candidate._measure_stack``)."""
    timed = detail.get("steps_timed")
    return sum(timed.values()) / len(timed) if timed else float(detail.get("iters") or iters)


def fit_need(estimated: list[float], opts: TuneOptions) -> float:
    """Seconds the candidates a step-time fit needs should take: the quickest ``settings.fit_candidates`` of the
    pool's estimates, or ``--budget`` of them where fewer (where time is short the choice measures those first,
    ``choose.quickest_for_fit``)."""
    return sum(sorted(estimated)[:min(opts.budget, opts.settings.fit_candidates)])


def fewest_iters(quickest: list[float], left: float, opts: TuneOptions) -> int:
    """The most timed steps a candidate (up to ``--iters``) at which ``quickest``, the estimates (at ``--iters``) of
    the candidates a step-time fit still needs, fit ``left`` seconds; 1 where not even one step does (an estimate
    may be long, and one step each is the fit's best chance to get them)."""
    over = opts.settings.candidate_overhead_s
    for k in range(opts.iters, 0, -1):
        if sum(at_iters(e, k, opts.warmup, opts.iters, over) for e in quickest) <= left:
            return k
    return 1


def fit_minutes(opts: TuneOptions, need_s: float, left_s: float) -> str:
    """The --max-minutes that would leave ``need_s`` where ``left_s`` is left (a flag's value)."""
    return _minutes(opts.max_minutes * 60 + max(need_s - left_s, 0.0))


def _minutes(seconds: float) -> str:
    """Seconds as whole-tenth minutes, rounded up (a flag's value)."""
    return f"{-(-seconds // 6) / 10:g}"


def budget_check(first: list[float], left: float, opts: TuneOptions) -> tuple[tuple[str, str] | None, str | None]:
    """(a one-line error, as (problem, fix), when not even the quickest candidate fits beside the least kernel
    sweep; the estimate and the flags that would fit where the whole budget of candidates does not) from ``first``:
    the pool's estimates, the model's best first."""
    s = opts.settings
    least = min(first) + s.kernel_min_s
    if least > left:
        return (f"{opts.max_minutes:g} minute(s) cannot measure one candidate: the quickest is estimated at "
                f"{fmt(least)} with the least kernel sweep", f"pass --max-minutes {_minutes(least)} or more"), None
    need = [sum(first[:k]) / (1 - s.kernel_share) for k in range(1, len(first) + 1)]
    want = need[min(opts.budget, len(need)) - 1]
    if want <= left:
        return None, None
    fits = max((k + 1 for k, n in enumerate(need) if n <= left), default=1)
    k = min(opts.budget, s.fit_candidates)
    fit = sum(sorted(first)[:k]) / (1 - s.kernel_share)
    said = f"; the step-time fit's {k} quickest candidates, estimated {fmt(fit)} with their kernel sweep, " + \
        ("fit" if fit <= left else f"do not fit: it needs --max-minutes {fit_minutes(opts, fit, left)}")
    return None, (f"estimated {fmt(want)} for --budget {opts.budget}, over --max-minutes {opts.max_minutes:g}: "
                  f"fits --budget {fits}, or --max-minutes {_minutes(want)}; running a trimmed sweep{said}")
