"""The steps of `sp-plan tune`, in order: links, kernels (with the round probe), candidates, reread, confirm.

Every rank runs every step. Two helpers carry what the steps share: ``TuneRun.decide`` (rank 0 alone reads the
store, refits and chooses; every rank gets its decision) and ``TuneRun.checkpoint`` (a step's result in the store
under its key, so that a tune killed at any moment resumes and loses at most what was in flight). The keys are
``links``, ``kernels``, ``candidate:<layout>`` (recorded "running" first), ``reread:<layout>``,
``confirm:<layout>:<k>`` and ``skip:<what>``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Callable, TypeVar

import torch.distributed as dist

from sp_plan.planner.calibration import FitResult, fit
from sp_plan.planner.cluster import Cluster
from sp_plan.planner.errors import PlanError
from sp_plan.planner.model import ModelSpec, Workload
from sp_plan.planner.params import Params
from sp_plan.planner.plan import Plan
from sp_plan.planner.profile import KernelSample, MeasuredCandidate
from sp_plan.profiles.store import run_key

from . import measure, readings
from .budget import Budget, at_iters, fmt, kernel_budget
from .choose import MIN_MEASURED, Choice, family, next_candidate, quickest_for_fit, sigma_from
from .kernels import kernel_priority, shown_group, spanned_said, spared_said, sweep_groups, token_rows
from .owner import owner, running_elsewhere
from .pool import budget_check, candidate_pool, estimates, fewest_iters, fit_minutes, fit_need, predict
from .rounds import time_rounds
from .software import software_stack

if TYPE_CHECKING:
    from .run import Progress, TuneOptions

T = TypeVar("T")


@dataclass
class TuneRun:
    """One tune's state on this rank: the world, its store checkpoints, its budget, what was measured."""

    cluster: Cluster
    model: ModelSpec
    work: Workload
    store: object
    opts: TuneOptions
    tick: Progress
    budget: Budget
    rank: int
    run_id: int | None = None
    steps: dict = field(default_factory=dict)
    measured: dict = field(default_factory=dict)
    skipped: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    reused: list = field(default_factory=list)
    candidates_s: float = 0.0  # the first estimate of the candidates a fit needs (the kernel sweep leaves them this)
    #: this rank's block-kernel decisions (runtime.choice's Key -> Decision), made once a tune: by the kernel sweep,
    #: then by each candidate for the blocks none before it ran
    backends: dict = field(default_factory=dict)

    def decide(self, choose: Callable[[], T]) -> T:
        """Rank 0's ``choose()``, the same on every rank (collective: the others receive it)."""
        box = [choose() if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def record(self, key: str, status: str, payload: dict) -> None:
        """A checkpoint in the store (rank 0)."""
        if self.rank == 0:
            self.store.record_step(self.run_id, key, status, payload)

    def stored(self, key: str) -> dict | None:
        """The payload an earlier run of this tune finished under ``key`` ("ok" or "failed"), else None."""
        status, payload = self.steps.get(key, ("", None))
        return payload if status in ("ok", "failed") else None

    def checkpoint(self, key: str, measure_it: Callable[[], T], dump: Callable[[T], dict] = lambda x: x,
                   load: Callable[[dict], T] = lambda x: x, status: Callable[[T], str] = lambda x: "ok") -> T:
        """What is stored under ``key``, else ``measure_it()`` (collective) recorded under it on rank 0."""
        got = self.stored(key)
        if got is not None:
            return load(got)
        value = measure_it()
        self.record(key, status(value), dump(value))
        return value

    def skip(self, key: str, what: str, need: float) -> None:
        """Leave ``what`` out: its estimate ``need`` seconds does not fit the time left (recorded and said)."""
        why = f"{what} skipped: estimated {fmt(need)}, {fmt(self.budget.left())} of --max-minutes " \
              f"{self.opts.max_minutes:g} left"
        if not any(w.startswith(f"{what} skipped:") for w in self.skipped):  # a confirm round asks again: said once
            self.skipped.append(why)
        self.record(f"skip:{key}", "skipped", {"what": what, "estimate_s": need, "left_s": self.budget.left()})

    def timed(self) -> list[MeasuredCandidate]:
        """The candidates measured to the end, in the order measured: what the fit is given, and what its
        per-candidate results (``FitResult.loo_times``) line up with."""
        return [m for m in self.measured.values() if m.status == "ok"]

    def refit(self, base: Params, hold) -> FitResult | None:
        """Rank 0: the model fitted to every timed candidate (None before any)."""
        ok = self.timed()
        return fit(self.cluster, base, ok, hold) if ok else None


def check_world(cluster: Cluster, world: int) -> None:
    """The cluster file must describe the running world."""
    if world != cluster.world_size:
        ranks = "1 rank" if world == 1 else f"{world} ranks"
        raise PlanError("cluster", f"the cluster {cluster.name} has {cluster.world_size} devices but the world has {ranks}",
                        f"launch {cluster.world_size} ranks (torchrun --nnodes/--nproc-per-node) or discover this world "
                        "again with `sp-plan discover`")


def start(r: TuneRun) -> tuple[bool, dict | None]:
    """Open (or resume) this run in the store; (resumed, the stored link fit) on every rank."""
    fp = r.cluster.topology_fingerprint()
    stack = software_stack(measure.device().type)
    key = run_key(fp, stack, r.model, r.work, {"layers": r.opts.layers, "iters": r.opts.iters})

    def opened():
        meta = {"cluster": r.cluster.name, "fingerprint": fp, "stack": stack, "model": r.model.name,
                "workload": r.work.model_dump(mode="json"), "owner": owner()}
        try:
            run_id, resumed = r.store.start_run(key, meta, busy=running_elsewhere)
        except PlanError as e:  # every rank raises it, none left waiting
            return e.field, e.problem, e.fix
        return run_id, resumed, r.store.steps(run_id), r.store.link_fit(fp)
    got = r.decide(opened)
    if len(got) == 3:
        raise PlanError(*got)
    r.run_id, resumed, r.steps, links = got
    return resumed, links


def first_pool(r: TuneRun) -> list[Plan]:
    """The uncalibrated pool (the kernel sweep's shapes); PlanError on every rank where nothing fits the world or the
    time; the budget's estimate noted."""
    def planned():
        pool = candidate_pool(r.cluster, r.model, r.work, Params(), r.opts.pool)
        first = list(estimates(r.cluster, pool, Params(), r.opts, {}).values())
        err, note = budget_check(first, r.budget.left(), r.opts) if pool else (None, None)
        return pool, err, note, fit_need(first, r.opts)
    pool, err, note, need = r.decide(planned)
    if not pool:
        raise PlanError("workload", f"no layout of {r.cluster.world_size} ranks fits {r.model.name} at "
                        f"{r.work.seq_len} tokens", "tune a shorter --seq-len or a smaller model")
    if err and not r.steps:
        raise PlanError("max_minutes", *err)
    r.notes += [note] if note else []
    r.candidates_s = need
    return pool


def links_step(r: TuneRun, links: dict | None) -> dict | None:
    """The stored link fit for this cluster, else measured as `profile links` does (collective)."""
    links = links if links is not None else r.stored("links")
    if links is not None:
        r.reused.append("links")
        r.tick("links", 1, 1, "links: stored fit reused")
        return links
    if dist.get_world_size() == 1:
        return None
    r.tick("links", 0, 1, "measuring links")
    links = r.checkpoint("links", lambda: measure.measure_links(r.cluster, r.opts))
    if r.rank == 0:
        r.store.save_link_fit(r.cluster.topology_fingerprint(), links)
    r.tick("links", 1, 1, "links measured")
    return links


@dataclass
class Kernels:
    """The kernel step's result: every rank's samples, how they were timed, the round probe's seconds."""

    samples: list[dict]
    timing: str
    rounds_s: float | None = None


def kernels_step(r: TuneRun, pool: list[Plan], links: dict | None) -> Kernels:
    """The kernels and the round probe: stored, else a sweep planned from the time left (collective)."""
    got = r.stored("kernels")
    if got is not None:
        r.reused.append("kernels")
        r.tick("kernels", 1, 1, "kernels: stored timings reused")
        return Kernels(got["samples"], got.get("timing", "each"), got.get("rounds_s"))
    dev, t0 = measure.device(), r.budget.elapsed()
    share = kernel_budget(r.budget.left(), r.candidates_s, r.opts.settings)
    r.tick("kernels", 0, None, f"timing attention blocks and GEMMs (planned for {fmt(share)})")
    skipped: list = []
    spared: list = []
    spanned: list = []
    total, count = len(sweep_groups([], [], token_rows(pool, r.work), kernel_priority(pool, r.model, r.work))) + 1, [0]

    def group(advanced: bool, message: str) -> None:
        count[0] += advanced
        r.tick("kernels", count[0], total, message)
    samples = measure.measure_kernels_step(pool, r.model, r.work, r.opts, share, r.budget.clock, skipped,
                                           replan=lambda least: r.decide(lambda: sweep_left(r, pool, least, links)),
                                           tick=group, spared=spared, spanned=spanned, backends=r.backends)
    if skipped:
        r.notes.append(f"kernel sweep trimmed to its {fmt(share)}: left out "
                       f"{', '.join(shown_group(g) for g in skipped)} (the planner's curves extrapolate to them)")
    s = r.opts.settings
    agreed = spared_said(spared, r.opts.kernel_repeats, s.kernel_agree) or \
        spanned_said(spanned, s.window_calls, s.window_span_s)
    r.notes += [agreed] if agreed else []
    r.tick("kernels", total, total, f"{len(samples)} kernel timings in {fmt(r.budget.elapsed() - t0)}"
           + (f"; {agreed}" if agreed else ""))
    rounds_s = None
    if dist.get_world_size() > 1 and not r.budget.spent():
        r.tick("rounds", 0, 1, "timing ring rounds")
        rounds_s = time_rounds(r.model, dev, measure.dtype_of(r.model, dev))
        r.tick("rounds", 1, 1, f"ring rounds: {rounds_s * 1e3:.1f} ms")
    timing = measure.kernel_timing(r.opts, dev)
    r.record("kernels", "ok", {"samples": samples, "timing": timing, "rounds_s": rounds_s,
                               "skipped": [list(g) for g in skipped], "seconds": r.budget.elapsed() - t0,
                               "spared": [list(x) for x in spared], "spanned": [list(x) for x in spanned]})
    return Kernels(samples, timing, rounds_s)


def sweep_left(r: TuneRun, pool: list[Plan], least: list[KernelSample], links: dict | None) -> float:
    """Rank 0: seconds the rest of the kernel sweep may take once its least part is timed: what is left after the
    candidates a fit needs, as the model prices them with the kernels timed so far, times the margin a first
    estimate needs (``settings.first_estimate_margin``)."""
    params = measure.base_params(r.cluster, r.model, [asdict(s) for s in least], links)[0]
    need = fit_need(list(estimates(r.cluster, pool, params, r.opts, {}).values()), r.opts)
    need *= r.opts.settings.first_estimate_margin
    r.candidates_s, left = need, r.budget.left()
    if need > left:
        k = min(r.opts.budget, r.opts.settings.fit_candidates)
        r.notes.append(f"the {k} candidate(s) a step-time fit needs are estimated at {fmt(need)} with the kernels "
                       f"timed ({r.opts.settings.first_estimate_margin:g} x the model's price before a candidate has "
                       f"run), over the {fmt(left)} left: the rest of the kernel sweep is left out, and the fit may "
                       f"lack them (--max-minutes {fit_minutes(r.opts, need, left)} would fit)")
    return left - need


def calibrate(r: TuneRun, kernels: Kernels, links: dict | None) -> Calibration:
    """The parameters measured before any candidate (kernels, links, round probe) and the pool they rank."""
    base, said = measure.base_params(r.cluster, r.model, kernels.samples, links)
    base, hold = measure.with_round_probe(r.cluster, r.model, base, kernels.rounds_s, said)
    if kernels.timing == "shared":
        said.append("kernels timed by every rank at once, one shared window each (kernel timing shared)")
    pool = r.decide(lambda: candidate_pool(r.cluster, r.model, r.work, base, r.opts.pool))
    cal = Calibration(base, hold, said, pool, {p.summary(): p for p in pool})
    resumed_candidates(r, cal)
    return cal


@dataclass
class Calibration:
    """What the candidates calibrate: the measured base parameters, those the fit holds, what was said of them, the
    pool (by layout too) and the latest fit."""

    base: Params
    hold: frozenset
    said: list[str]
    pool: list[Plan]
    by_name: dict[str, Plan]
    result: FitResult | None = None
    stop: str = ""


def resumed_candidates(r: TuneRun, cal: Calibration) -> None:
    """The candidates an interrupted run of this tune measured, into ``r.measured`` (and the pool)."""
    for name, (status, payload) in r.steps.items():
        if name.startswith("candidate:") and status in ("ok", "failed"):
            mc = MeasuredCandidate.model_validate(payload)
            r.measured[mc.summary] = mc
            if mc.summary not in cal.by_name:  # measured under an earlier ranking: keep it in the pool
                cal.by_name[mc.summary] = Plan.model_validate(mc.plan)
                cal.pool.append(cal.by_name[mc.summary])
    if r.measured:
        r.reused.append(f"{len(r.measured)} candidate(s)")
    spent = sum(m.detail.get("wall_s", 0.0) for m in r.measured.values())
    if "kernels" in r.reused:  # a run stopped before its first candidate left its kernel timings to reuse too
        spent += (r.steps.get("kernels", ("", {}))[1] or {}).get("seconds", 0.0)
    if spent > 0:
        r.notes.append(f"the earlier run spent {fmt(spent)} on what is reused; --max-minutes counts from the resume")


def candidates_step(r: TuneRun, cal: Calibration) -> None:
    """Measure candidates one at a time, refitting after each, until the budget, the time or the choice stops."""
    while True:  # rank 0 refits, checks the limits and chooses; every rank runs the chosen candidate
        def chosen():
            cal.result = r.refit(cal.base, cal.hold)
            return (*choose(r, cal), r.skipped)
        choice, need, iters, r.skipped = r.decide(chosen)
        if choice.index is None:
            cal.stop = choice.why
            r.tick("candidates", len(r.measured), len(r.measured), f"stopped: {choice.why}")
            return
        plan = cal.pool[choice.index]
        name, n = plan.summary(), len(r.measured)
        steps = "" if iters == r.opts.iters else f" at {iters} timed step(s)"
        r.tick("candidates", n, r.opts.budget, f"{name} ({choice.why}; estimated {fmt(need)}{steps})")
        r.record(f"candidate:{name}", "running", {"summary": name})
        fault = r.opts.faults.get(name) or r.opts.faults.get(f"#{n}")
        mc = timed(r, plan, fault, need, lambda m: r.tick("candidates", n, r.opts.budget, m), iters)
        r.record(f"candidate:{name}", "ok" if mc.status == "ok" else "failed", mc.model_dump(mode="json"))
        r.measured[name] = mc
        r.tick("candidates", len(r.measured), r.opts.budget, f"{name}: {mc.status}")


def choose(r: TuneRun, cal: Calibration) -> tuple[Choice, float, int]:
    """Rank 0: the next candidate that fits the time left (those that do not are skipped), its estimate and the
    timed steps it runs (``fit_iters``)."""
    opts, measured, pool = r.opts, r.measured, cal.pool
    params = cal.result.params if cal.result else cal.base
    ok = r.timed()
    full = estimates(r.cluster, pool, params, opts, measured)
    preds = [predict(r.cluster, p, params)[0] for p in pool]
    left_out = {w.split(" skipped")[0] for w in r.skipped}
    while True:
        if len(measured) >= opts.budget:
            return Choice(None, 0.0, f"budget of {opts.budget} candidate(s) reached"), 0.0, opts.iters
        if r.budget.spent():
            return Choice(None, 0.0, f"--max-minutes {opts.max_minutes:g} reached"), 0.0, opts.iters
        done = [p.summary() in measured or p.summary() in left_out for p in pool]
        best = min((m.measured_s for m in ok), default=None)
        sigma = sigma_from(cal.result.loo_error_after if cal.result else None, len(ok))
        skipped = sum(1 for p in pool if p.summary() in left_out and p.summary() not in measured)
        choice = next_candidate(preds, done, best, sigma, families=[family(p) for p in pool],
                                explore=opts.budget - 1 - len(measured), min_measured=MIN_MEASURED + skipped)
        if choice.index is None:
            return choice, 0.0, opts.iters
        iters, est = fit_iters(r, [full[p.summary()] for p in pool], done, len(ok))
        choice = for_the_fit(r, choice, est, done, len(ok))
        name = pool[choice.index].summary()
        if est[choice.index] <= r.budget.left():
            return choice, est[choice.index], iters
        r.skip(f"candidate:{name}", name, est[choice.index])
        left_out.add(name)
        if all(p.summary() in measured or p.summary() in left_out for p in pool):
            return Choice(None, 0.0, "no candidate left fits the time left of --max-minutes"), 0.0, opts.iters


def fit_short(r: TuneRun, ok: int) -> int:
    """Candidates the step-time fit still lacks that the budget may measure."""
    return min(r.opts.budget - len(r.measured), r.opts.settings.fit_candidates - ok)


def fit_iters(r: TuneRun, full: list[float], done: list[bool], ok: int) -> tuple[int, list[float]]:
    """Rank 0: the timed steps the next candidate runs, the most (up to --iters) at which the quickest candidates
    the step-time fit still lacks fit the time left (``pool.fewest_iters``; one where not even one does), and every
    estimate at them (``full``: at --iters). Before any candidate has shown how far off the estimates are, one step
    where --iters does not fit with ``settings.first_estimate_margin``: the time a short estimate would cost is
    banked. Each said once: fewer steps than --iters, or not even one step fitting, with the --max-minutes that
    would."""
    opts, left, need = r.opts, r.budget.left(), fit_short(r, ok)
    quick = sorted(e for e, d in zip(full, done) if not d)[:max(need, 0)]
    learned = any(m is not None and m.status == "ok" and m.detail.get("wall_s") for m in r.measured.values())
    margin = 1.0 if learned else opts.settings.first_estimate_margin
    iters = fewest_iters(quick, left / margin, opts) if need > 0 else opts.iters
    iters = iters if learned or iters == opts.iters else 1
    at = lambda k: [at_iters(e, k, opts.warmup, opts.iters, opts.settings.candidate_overhead_s)  # noqa: E731
                    for e in full]
    least = sum(at_iters(e, 1, opts.warmup, opts.iters, opts.settings.candidate_overhead_s) for e in quick)
    if need > 0 and least > left:
        said(r, "the step-time fit needs", f"the step-time fit needs {need} more candidate(s), the quickest estimated "
             f"at {fmt(least)} together at 1 timed step each, over the {fmt(left)} left: measured so, quickest first, "
             f"it may lack them (--max-minutes {fit_minutes(opts, least, left)} would fit them)")
    elif iters < opts.iters:
        said(r, "candidates timed at", f"candidates timed at {iters} of --iters {opts.iters} step(s) a block count, "
             f"so that the {need} the step-time fit still needs fit the {fmt(left)} left")
    return iters, at(iters)


def said(r: TuneRun, start: str, note: str) -> None:
    """``note`` among the tune's notes, unless one beginning with ``start`` is there."""
    if not any(n.startswith(start) for n in r.notes):
        r.notes.append(note)


def for_the_fit(r: TuneRun, choice: Choice, est: list[float], done: list[bool], ok: int) -> Choice:
    """Rank 0: ``choice``, or the quickest candidate to measure where the step-time fit still lacks candidates and
    only the quickest leave it room for them (``choose.quickest_for_fit``)."""
    left, need = r.budget.left(), fit_short(r, ok)
    i = quickest_for_fit(choice.index, est, done, need, left)
    if i == choice.index:
        return choice
    return Choice(i, choice.chance, f"the quickest to measure: the step-time fit needs {need} more candidate(s) "
                                    f"in the {fmt(left)} left")


def timed(r: TuneRun, plan: Plan, fault: str | None, need: float,
          say: Callable[[str], None], iters: int | None = None) -> MeasuredCandidate:
    """``plan`` measured, stopped where it would run past the time left; its wall seconds and estimate kept; while it
    runs, ``say`` (rank 0) gets how long it has run, about every second (the reporter prints one line in ten)."""
    t0 = r.budget.elapsed()
    left = r.decide(r.budget.left)  # one deadline for every rank
    opts = replace(r.opts, candidate_timeout=max(min(r.opts.candidate_timeout, left), 1.0),
                   iters=iters or r.opts.iters)

    def beat(seconds: float) -> None:
        say(f"{plan.summary()}: running {fmt(seconds)} of an estimated {fmt(need)}")
    mc = measure.run_candidate(plan, r.model, r.work, r.cluster, opts, fault, beat=beat if r.rank == 0 else None,
                               backends=r.backends)
    wall = r.decide(lambda: r.budget.elapsed() - t0)
    if mc.status == "timeout" and left < r.opts.candidate_timeout:
        mc = mc.model_copy(update={"reason": f"{mc.reason}; stopped at the end of --max-minutes "
                                             f"{r.opts.max_minutes:g}"})
    return mc.model_copy(update={"detail": {**mc.detail, "wall_s": wall, "estimate_s": need}})


def again(r: TuneRun, key: str, plan: Plan, say: Callable[[str], None]) -> MeasuredCandidate | None:
    """One more reading of a measured candidate: the store's, kept under ``key`` by an interrupted tune, else a
    fresh run (fault-free) where it fits the time left (its first reading's seconds), else None (skipped, said)."""
    first = r.measured[plan.summary()].detail
    need, iters = float(first.get("wall_s") or 0.0), first.get("iters")  # read as it was first: comparable
    if not r.decide(lambda: r.stored(key) is not None or need <= r.budget.left()):
        r.skip(key, f"{key.split(':')[0]} of {plan.summary()}", need)
        return None
    return r.checkpoint(key, lambda: timed(r, plan, None, need, say, iters), dump=lambda mc: mc.model_dump(mode="json"),
                        load=MeasuredCandidate.model_validate, status=lambda mc: "ok" if mc.status == "ok" else "failed")


def reread_step(r: TuneRun, cal: Calibration) -> None:
    """A candidate read once and far slower than the others predict it is read once more (noise only adds time),
    kept at its faster reading, and the model refitted."""
    todo = r.decide(lambda: [] if r.budget.spent() else rereads(r, cal))
    for j, name in enumerate(todo):
        r.tick("reread", j, len(todo), f"{name}: read again ({why_reread(r.measured[name])})")
        mc = again(r, f"reread:{name}", cal.by_name[name], lambda m: r.tick("reread", j, len(todo), m))
        ok = mc is not None and mc.status == "ok"
        before = r.measured[name]
        r.measured[name] = readings.confirmed(before, readings.readings_of(before) + ([mc.measured_s] if ok else []),
                                              readings.fits_of(before) + ([readings.fit_of(mc.detail)] if ok else []))
        r.tick("reread", j + 1, len(todo), f"{name}: {len(readings.readings_of(r.measured[name]))} readings")
    if todo and r.rank == 0:
        cal.result = r.refit(cal.base, cal.hold)


def rereads(r: TuneRun, cal: Calibration) -> list[str]:
    """The candidates to read again, ``opts.reread`` at most: those read once whose reading makes no step
    (``readings.impossible``), then the surprises (``readings.surprises``)."""
    first = readings.impossible(list(r.measured.values()), r.opts.reread)
    later = readings.surprises(cal.result, r.timed(), r.opts.reread, r.opts.settings)
    return (first + [n for n in later if n not in first])[:r.opts.reread]


def why_reread(mc: MeasuredCandidate) -> str:
    """The reread's reason, as its progress line says it."""
    return "its stacks made no step" if readings.fits_of(mc)[0][0] else "slower than predicted"


def confirm_step(r: TuneRun, cal: Calibration) -> None:
    """The best and the runners-up within opts.confirm_within (or the model's leave-one-out error, if wider) read
    again, in rounds (one reading of each contender a round), each kept at its fastest reading; then those within
    the spread their readings showed."""
    done: list[str] = []
    for _ in range(2):
        todo = r.decide(lambda: [] if r.budget.spent() else readings.contenders(
            r.measured, r.opts, predicted_after(cal), confirm_reach(r, cal, done), done))
        if not todo:
            return
        got = {name: readings.readings_of(r.measured[name]) for name in todo}
        fits = {name: readings.fits_of(r.measured[name]) for name in todo}
        order = readings.confirm_order(todo, r.opts.confirm)
        for j, (name, k) in enumerate(order):
            r.tick("confirm", j, len(order), f"{name}: reading {len(got[name]) + 1}")
            mc = again(r, f"confirm:{name}:{k}", cal.by_name[name], lambda m: r.tick("confirm", j, len(order), m))
            if mc is not None and mc.status == "ok":
                got[name].append(mc.measured_s)
                fits[name].append(readings.fit_of(mc.detail))
            r.tick("confirm", j + 1, len(order), f"{name}: {len(got[name])} readings")
        for name in todo:
            r.measured[name] = readings.confirmed(r.measured[name], got[name], fits[name])
        done += todo
        if r.rank == 0:
            cal.result = r.refit(cal.base, cal.hold)


def predicted_after(cal: Calibration) -> dict[str, float]:
    """Each measured candidate's step as the latest fit predicts it."""
    return {c.summary: c.predicted_after_s for c in cal.result.candidates if c.predicted_after_s} if cal.result else {}


def confirm_reach(r: TuneRun, cal: Calibration, done: list[str]) -> float:
    """How far behind the best a contender may be: opts.confirm_within, or wider the readings' spread (once read
    again) or the model's leave-one-out error."""
    noise = readings.reading_spread(r.measured, done) if done else (cal.result.loo_error_after if cal.result else None)
    return max(r.opts.confirm_within, noise or 0.0)
