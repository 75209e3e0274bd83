"""`sp-plan tune`: measure links, kernels and the best candidates on the running world, calibrate, store.

Collective: every rank of the torchrun world calls ``tune``; rank 0 alone reads and writes the store and makes
the choices, which it broadcasts, so all ranks run the same candidate. The steps (``steps.py``: links, kernels,
candidates, reread, confirm) each checkpoint in the store, so a tune killed at any moment resumes and loses at
most the candidate in flight. A candidate that fails (out of memory, an exception, a timeout) is a recorded
result; the tune goes on (design.md, "Profile once per cluster"). ``--max-minutes`` bounds the whole tune.
"""
from __future__ import annotations

import datetime
import time
from dataclasses import dataclass, field
from typing import Callable

import torch.distributed as dist

from sp_plan.planner.cluster import Cluster
from sp_plan.planner.measured import measured_plan
from sp_plan.planner.model import ModelSpec, Workload
from sp_plan.planner.params import Params
from sp_plan.planner.plan import Plan
from sp_plan.planner.profile import Profile

from . import steps
from .budget import Budget, fmt
from .kernels import chosen_backends
from .measure import (alone_shape, base_params, device, dtype_of, kernel_timing, measure_alone,  # noqa: F401
                      measure_kernels_step, measure_links, run_candidate, with_round_probe)
from .pool import (attention_predicted, budget_check, candidate_pool, estimates, first_estimate,  # noqa: F401
                   masked, measurable, predict, ranked_plans)
from .readings import (confirm_order, confirmed, contenders, reading_spread, readings_of,  # noqa: F401
                       surprises)
from .settings import SETTINGS, TuneSettings
from .software import software_stack
from .steps import check_world  # noqa: F401

# the names above stay importable from here, where benchmarks and tests have found them

#: progress(step, done, total, label): step is "links", "kernels", "rounds", "candidates", "reread" or "confirm"
Progress = Callable[[str, int, "int | None", str], None]


@dataclass
class TuneOptions:
    """What `sp-plan tune` may spend and how it measures (CLI flags), and the settings behind them."""

    budget: int = 5  # candidates measured at most (failed ones count)
    max_minutes: float = 30.0
    candidate_timeout: float = 600.0
    pool: int = 12  # distinct layouts the choice draws from
    layers: int = 2  # layers run per candidate (the rest scaled)
    warmup: int = 1
    iters: int = 3
    link_sizes: list[int] | None = None
    link_timeout: float = 60.0
    kernel_repeats: int = 3
    #: "each": every rank times each kernel (median of kernel_repeats) as it gets there; "shared": all ranks time each
    #: kernel at once through one shared window (kernels.shared_windows: the kernels under full contention where
    #: ranks share cores); "auto": shared on CPU ranks (they share the hosts' cores), each on GPUs (their own)
    kernel_timing: str = "auto"
    #: readings more of each contender for the best (``contenders``): 0 reads every candidate once
    confirm: int = 2
    #: candidates read once and far slower than the fit without them predicts, read once more (``surprises``): at most
    reread: int = 2
    #: a measured candidate within this share of the best measured contends with it
    confirm_within: float = 0.10
    #: test hook: candidate summary, or "#i" for the i-th candidate measured, -> fault ("raise", "oom", "hang", "@rank")
    faults: dict[str, str] = field(default_factory=dict)
    #: the clock --max-minutes is read on (a test passes its own)
    clock: Callable[[], float] = time.monotonic
    #: the reading of ``clock`` --max-minutes counts from (the CLI passes its process's start); None: when tune starts
    started: float | None = None
    settings: TuneSettings = SETTINGS


@dataclass
class TuneReport:
    """What rank 0 prints: the profile (with every measured candidate), the best measured plan, the story."""

    profile: Profile
    best: Plan | None
    resumed: bool
    reused: list[str]
    stop_reason: str
    run_id: int | None = None
    not_fitted: list[str] = field(default_factory=list)  # the fit's notes: what it left at its base value, and why
    skipped: list[str] = field(default_factory=list)  # what the time budget left out, and why
    budget_notes: list[str] = field(default_factory=list)  # the tune's estimate against --max-minutes, what was spent

    def to_pandas(self):
        """The measured candidates as a pandas DataFrame, one row each (``candidates_frame``)."""
        return candidates_frame(self.profile)


#: the columns of ``candidates_frame``
FRAME_COLUMNS = ("layout", "status", "measured_s", "readings", "predicted_before_s", "predicted_after_s",
                 "error_after", "measured_memory", "predicted_memory_after", "wall_s", "estimate_s", "rank", "reason")


def candidates_frame(profile: Profile):
    """A profile's measured candidates, one row each: layout, status, the step measured (the fastest reading) and
    how many readings, predicted before and after calibration and the error after, peak memory measured and
    predicted, the seconds the measurement took against its estimate, the failing rank and why."""
    import pandas as pd  # noqa: PLC0415 - pandas only where a frame is asked for

    rows = []
    for c in profile.candidates:
        err = (c.predicted_after_s - c.measured_s) / c.measured_s if c.measured_s and c.predicted_after_s else None
        rows.append({"layout": c.summary, "status": c.status, "measured_s": c.measured_s,
                     "readings": len(c.detail.get("readings_s") or [c.measured_s]) if c.status == "ok" else 0,
                     "predicted_before_s": c.predicted_before_s, "predicted_after_s": c.predicted_after_s,
                     "error_after": err, "measured_memory": c.measured_memory,
                     "predicted_memory_after": c.predicted_memory_after, "wall_s": c.detail.get("wall_s"),
                     "estimate_s": c.detail.get("estimate_s"), "rank": c.rank, "reason": c.reason or None})
    return pd.DataFrame(rows, columns=list(FRAME_COLUMNS))


def tune(cluster: Cluster, model: ModelSpec, work: Workload, store=None, opts: TuneOptions | None = None,
         progress: Progress | None = None) -> TuneReport:
    """Profile this cluster on the running world within ``opts.max_minutes`` (collective; ``store`` is used on rank
    0 only): links, kernels, candidates, reread, confirm, each a step of ``steps.py``."""
    opts = opts or TuneOptions()
    check_world(cluster, dist.get_world_size())
    limit = opts.max_minutes * 60.0 - opts.settings.finish_s
    r = steps.TuneRun(cluster, model, work, store, opts, progress or (lambda *a: None),
                      Budget(limit, opts.clock, opts.started), dist.get_rank())
    resumed, links = steps.start(r)
    pool = steps.first_pool(r)
    links = steps.links_step(r, links)
    kernels = steps.kernels_step(r, pool, links)
    cal = steps.calibrate(r, kernels, links)
    steps.candidates_step(r, cal)
    steps.reread_step(r, cal)
    steps.confirm_step(r, cal)
    return finish(r, cal, links, kernels, resumed)


def finish(r: steps.TuneRun, cal: steps.Calibration, links, kernels: steps.Kernels, resumed: bool) -> TuneReport:
    """Store the profile (rank 0) and return the report on every rank."""
    profile = best_plan = None
    r.notes.append(f"spent {fmt(r.budget.elapsed())} of --max-minutes {r.opts.max_minutes:g}")
    if r.rank == 0:
        result = cal.result
        profile = _profile(r.cluster, r.model, r.work, software_stack(device().type), cal.base, cal.said, result,
                           list(r.measured.values()), links, kernels.samples, kernels.rounds_s)
        if r.skipped:
            profile.measurements["skipped"] = list(r.skipped)
        profile.id = r.store.save_profile(profile, finishing=r.run_id)  # stored and the run done: one transaction
        best_plan = best_measured(r.cluster, profile, result.params if result else cal.base)
    profile, best_plan, not_fitted = r.decide(lambda: (profile, best_plan,
                                                       list(cal.result.notes) if cal.result else []))
    return TuneReport(profile, best_plan, resumed, r.reused, cal.stop, r.run_id, not_fitted, list(r.skipped),
                      list(r.notes))


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _profile(cluster, model, work, stack, base, said, result, measured, links, kernels, rounds_s=None) -> Profile:
    """The Profile document: fitted parameters, what was fitted, every candidate before/after/measured."""
    params = result.params if result else base
    fitted = list(said) + (list(result.fitted) if result else [])
    cands = []
    for mc in measured:
        plan = Plan.model_validate(mc.plan)
        b_s, b_m = predict(cluster, plan, Params())
        a_s, a_m = predict(cluster, plan, params)
        detail = mc.detail
        if detail.get("attention"):  # measured under the mask: the model's price of the same, before and after
            detail = {**detail, "attention": {**detail["attention"],
                                              "predicted_before_s": attention_predicted(cluster, plan, Params()),
                                              "predicted_after_s": attention_predicted(cluster, plan, params)}}
        cands.append(mc.model_copy(update={"predicted_before_s": b_s, "predicted_memory_before": b_m,
                                           "predicted_after_s": a_s, "predicted_memory_after": a_m,
                                           "detail": detail}))
    if kernels and chosen_backends(kernels):  # the block kernel the runtime chose (the stack's is the default)
        stack = {**stack, "attention_backend_chosen": chosen_backends(kernels)}
    return Profile(cluster=cluster.name, cluster_fingerprint=cluster.topology_fingerprint(), stack=stack,
                   created_at=_now(), params=params, fitted=fitted,
                   workloads=[{"model": model.name, **work.model_dump(mode="json")}], candidates=cands,
                   loo_error_before=result.loo_error_before if result else None,
                   loo_error_after=result.loo_error_after if result else None,
                   loo_memory_error_before=result.memory_error_before if result else None,
                   loo_memory_error_after=result.memory_error_after if result else None,
                   measurements={"links": links or {}, "kernels": kernels,
                                 "cluster_capacity_fingerprint": cluster.fingerprint(),
                                 **({"rounds_s": rounds_s} if rounds_s else {})})


def best_measured(cluster: Cluster, profile: Profile, params: Params) -> Plan | None:
    """The fastest measured candidate as a plan file: predictions under the profile, measured figures beside."""
    ok = [c for c in profile.candidates if c.status == "ok" and c.measured_s]
    if not ok:
        return None
    return measured_plan(cluster, profile, params, min(ok, key=lambda m: m.measured_s))
