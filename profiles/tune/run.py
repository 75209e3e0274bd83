"""`sp-plan tune`: measure links, kernels and the best candidates on the running world, calibrate, store.

Collective: every rank of the torchrun world calls ``tune``; rank 0 alone reads and writes the store
and makes the choices, which it broadcasts, so all ranks run the same candidate. Each step is a
checkpoint in the store (``Store.record_step``): links, kernels, and every candidate before (as
"running") and after it runs, so a tune killed at any moment resumes and loses at most the
candidate in flight. A candidate that fails (out of memory, an exception, a timeout) is a recorded
result; the tune goes on (design.md, "Profile once per cluster").
"""
from __future__ import annotations

import datetime
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

import torch
import torch.distributed as dist

from sp_plan.planner.calibration import FitResult, curve_of, fit, masked_split, measured_params
from sp_plan.planner.candidate import Candidate
from sp_plan.planner.cluster import Cluster
from sp_plan.planner.errors import PlanError
from sp_plan.planner.estimate import Estimator
from sp_plan.planner.model import ModelSpec, Workload
from sp_plan.planner.params import CURVES, Params
from sp_plan.planner.measured import measured_plan
from sp_plan.planner.plan import Plan
from sp_plan.planner.profile import KernelSample, MeasuredCandidate, Profile
from sp_plan.planner.search import grid_search

from sp_plan.profiles.store import run_key
from sp_plan.runtime.probe import gather_objects

from .budget import Budget, candidate_seconds, fmt, kernel_budget, learned_ratio, scaled
from .candidate import layer_counts, stage_depth
from .choose import MIN_MEASURED, Choice, diversify, family, next_candidate, sigma_from, with_families
from .kernels import chosen_backends
from .rounds import LAYERS as PROBE_LAYERS, TOKENS_PER_RANK as PROBE_TOKENS, round_overhead, time_rounds
from .software import software_stack

#: progress(step, done, total, label): step is "links", "kernels", "rounds", "candidates", "reread" or "confirm"
Progress = Callable[[str, int, int, str], None]


@dataclass
class TuneOptions:
    """What `sp-plan tune` may spend and how it measures (CLI flags)."""

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


def _bcast(obj, rank: int):
    box = [obj if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]



def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


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
    return work.documents is not None or work.window is not None


def measurable(plan: Plan, work: Workload) -> bool:
    """Whether tune can run ``plan`` on the workload: with masks, an algorithm that honours them
    (runtime.attention.MASKED) without TP (its sequence sharding takes equal shards; packed shards are not)."""
    from sp_plan.runtime.attention import MASKED

    return not masked(work) or (plan.algorithm in MASKED and plan.degrees["tp"] == 1)


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


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _dtype(model: ModelSpec, dev: torch.device) -> torch.dtype:
    """CPU ranks run float32 (the CPU flash kernel's best); GPUs the model's dtype."""
    if dev.type == "cpu":
        return torch.float32
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[model.dtype]


def measure_links_step(cluster: Cluster, opts: TuneOptions) -> dict:
    """`profile links` on this world: the fitted ``calibration['links']`` dict (collective)."""
    from sp_plan.cli.discover import DEFAULT_SIZES, parse_sizes
    from sp_plan.runtime import probe

    hosts = probe.gather_hosts()
    probe.check_world(cluster, hosts)
    sizes = opts.link_sizes or parse_sizes(DEFAULT_SIZES["cuda" if probe.use_cuda() else "cpu"])
    new, _ = probe.profile_links(cluster, hosts, sizes, opts.link_timeout)
    return new.calibration["links"]


def kernel_timing(opts: TuneOptions, dev: torch.device) -> str:
    """``opts.kernel_timing`` with "auto" resolved: "shared" on CPU ranks, whose kernels run among the other ranks'
    on the hosts' cores (timed as each rank gets there, short kernels meet idle peers and read up to the solo
    speedup faster than in a step: a 3.7x fall in efficiency from 256 to 512 tokens on 8 ranks sharing 2 cores),
    "each" on GPUs."""
    if opts.kernel_timing != "auto":
        return opts.kernel_timing
    return "shared" if dev.type == "cpu" else "each"


def measure_kernels_step(pool: list[Plan], model: ModelSpec, work: Workload, opts: TuneOptions,
                         budget_s: float | None = None, clock: Callable[[], float] = time.monotonic,
                         skipped: list | None = None) -> list[dict]:
    """Every rank times its own device's kernels for the pool's block shapes; all ranks' samples (collective).
    With ``budget_s`` the sweep takes the shapes the model's best candidates run first and stops where the budget
    does (``kernels.measure_kernels``; what it left out goes to ``skipped``); the solo-speedup timing is run on
    the largest block timed whose cost fits what is left."""
    from .kernels import kernel_priority, kernel_shapes, measure_kernels, shared_windows, token_rows

    dev, t0 = _device(), clock()
    blocks, heads = kernel_shapes(pool, model, work)
    shapes = kernel_priority(pool, model, work) if budget_s is not None else None
    shared = shared_windows if kernel_timing(opts, dev) == "shared" and dist.get_world_size() > 1 else None
    mine = measure_kernels(model, blocks, heads, dev, _dtype(model, dev), work.causal, repeats=opts.kernel_repeats,
                           gemm_rows=token_rows(pool, work), windows=shared, budget_s=budget_s, shapes=shapes,
                           clock=clock, skipped=skipped)
    alone = alone_shape(mine, dist.get_world_size(), opts.kernel_repeats,
                        None if budget_s is None else budget_s - (clock() - t0))
    if alone is not None:
        mine += measure_alone(model, *alone, dev, _dtype(model, dev), work.causal, opts.kernel_repeats)
    elif skipped is not None:
        skipped.append(("solo speedup",))
    return [dict(s, rank=r) for r, samples in enumerate(gather_objects([asdict(s) for s in mine])) for s in samples]


def alone_shape(samples: list[KernelSample], world: int, repeats: int, left_s: float | None) -> tuple[int, int] | None:
    """(block, heads) for measure_alone: the largest timed attention block, or with ``left_s`` the largest whose
    timings (each rank alone in turn, then together) fit it, agreed by every rank; None where none does."""
    from .kernels import _agreed

    cost: dict[tuple[int, int], float] = {}
    for s in samples:
        if s.kind.startswith("attention"):
            cost[(s.size, s.heads)] = cost.get((s.size, s.heads), 0.0) + s.seconds
    fits = [k for k, c in cost.items() if left_s is None or
            _agreed(c * (world * (repeats + 1) + TOGETHER_CALLS), True) <= left_s]
    if not fits:
        return None
    return max(fits) if left_s is None else max(fits, key=lambda k: (k[0], k[1]))


#: the shared window of measure_alone's together timing: this many calls of the slowest rank's time alone, at least
#: this many seconds
TOGETHER_CALLS = 8
TOGETHER_MIN_S = 0.2


def measure_alone(model: ModelSpec, block: int, heads: int, dev: torch.device, dtype: torch.dtype, causal: bool,
                  repeats: int) -> list[KernelSample]:
    """The largest attention block forward, timed by each rank in turn while the others wait at a barrier
    (``alone`` True), then by every rank at once (``alone`` False): each kernel back to back through one wall-clock
    window that every rank shares, ``TOGETHER_CALLS`` times the slowest rank's time alone (at least
    ``TOGETHER_MIN_S``), so that the ranks compute together for all of it: calibration.solo_speedup."""
    from .kernels import measure_kernels, shared_windows

    def fwd(alone: bool, windows=None) -> list[KernelSample]:
        return [replace(s, alone=alone) for s in measure_kernels(model, [block], [heads], dev, dtype, causal,
                                                                 repeats=repeats, gemm_rows=[], windows=windows)
                if s.kind == "attention_fwd"]

    out: list[KernelSample] = []
    rank, world = dist.get_rank(), dist.get_world_size()
    for r in range(world):
        dist.barrier()
        if r == rank:
            out = fwd(True)

    def agree(firsts: list[float]) -> tuple[float, list[float]]:
        """Once every rank has prepared its kernels: one start and window length for all, from the slowest rank's
        time alone (fwd and bwd of each mask are timed, so the bwd, about 2x, sets the window: 3x the forward)."""
        longest = 3 * max((s.seconds for s in out), default=0.0)
        start, (each,) = shared_windows([longest], calls=TOGETHER_CALLS, least=TOGETHER_MIN_S)
        return start, [each] * len(firsts)
    return out + fwd(False, agree)


def base_params(cluster: Cluster, model: ModelSpec, kernels: list[dict], links: dict | None) -> tuple[Params, list[str]]:
    """Kernel curves and collective fits: the parameters measured directly, before any candidate runs."""
    samples = [KernelSample(**{k: v for k, v in s.items() if k != "rank"}) for s in kernels]
    params = measured_params(cluster, model.dtype, samples, links)
    split = masked_split(samples)
    said = [f"{k} curve from {sum(1 for s in samples if not s.alone and curve_of(s, split) == k)} kernel timings"
            for k in CURVES if getattr(params, k) is not None]
    if kernels and chosen_backends(kernels):
        said.append(f"attention blocks on {chosen_backends(kernels)} (runtime.choice)")
    if params.comm:
        said.append("collective efficiency and latency for " + ", ".join(sorted(params.comm)))
    if any(s.alone for s in samples):
        said.append(f"solo speedup {params.solo_speedup:.2f} (a rank's attention block alone vs with every rank "
                    f"computing: uneven ring rounds cost their mean work where ranks share cores)")
    return params, said


def with_round_probe(cluster: Cluster, model: ModelSpec, base: Params, rounds_s: float | None,
                     said: list[str]) -> tuple[Params, frozenset]:
    """``base`` with the round overhead the probe measured (``rounds.round_overhead``) and the parameters the fit
    then holds; ``base`` and none where there is no probe (one rank, or a store of an older tune)."""
    ro = round_overhead(cluster, model, base, rounds_s) if rounds_s else None
    if ro is None:
        return base, frozenset()
    said.append(f"round overhead {ro * 1e3:.2f} ms per attention call, measured (Ring over every rank, "
                f"{PROBE_LAYERS} layers of {PROBE_TOKENS} tokens a rank: {rounds_s * 1e3:.1f} ms)")
    return base.model_copy(update={"round_overhead_s": ro}), frozenset({"round_overhead_s"})


def check_world(cluster: Cluster, world: int) -> None:
    """The cluster file must describe the running world."""
    if world != cluster.world_size:
        raise PlanError("--cluster", f"the cluster file has {cluster.world_size} devices but the world has {world} ranks",
                        f"launch {cluster.world_size} ranks (torchrun --nnodes/--nproc-per-node) or discover this world "
                        "again with `sp-plan discover`")


@dataclass
class _Run:
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
    candidates_s: float = 0.0  # the first estimate of the budget's candidates (the kernel sweep leaves them this)

    def record(self, key: str, status: str, payload: dict) -> None:
        """A checkpoint in the store (rank 0)."""
        if self.rank == 0:
            self.store.record_step(self.run_id, key, status, payload)

    def skip(self, key: str, what: str, need: float) -> None:
        """Leave ``what`` out: its estimate ``need`` seconds does not fit the time left (recorded and said)."""
        why = f"{what} skipped: estimated {fmt(need)}, {fmt(self.budget.left())} of --max-minutes " \
              f"{self.opts.max_minutes:g} left"
        self.skipped.append(why)
        self.record(f"skip:{key}", "skipped", {"what": what, "estimate_s": need, "left_s": self.budget.left()})


def first_estimate(cluster: Cluster, plan: Plan, params: Params, opts: TuneOptions) -> float:
    """Seconds measuring ``plan`` should take, from its predicted step (budget.candidate_seconds)."""
    depth = stage_depth(plan.model, plan)
    d = plan.degrees
    m = max(plan.workload.batch // (d["dp"] * plan.micro_batch_size), 1)
    return candidate_seconds(predict(cluster, plan, params)[0], depth, layer_counts(depth, opts.layers), opts.warmup,
                             opts.iters, d["pp"], m)


def estimates(cluster: Cluster, pool: list[Plan], params: Params, opts: TuneOptions,
              measured: dict[str, MeasuredCandidate]) -> dict[str, float]:
    """Each pool plan's estimated seconds, corrected by what the measured candidates took against theirs."""
    first = {p.summary(): first_estimate(cluster, p, params, opts) for p in pool}
    done = [m for m in measured.values() if m.status == "ok" and m.detail.get("wall_s") and m.summary in first]
    ratio = learned_ratio([m.detail["wall_s"] for m in done], [first[m.summary] for m in done])
    return {n: scaled(e, ratio) for n, e in first.items()}


def _minutes(seconds: float) -> str:
    """Seconds as whole-tenth minutes, rounded up (a flag's value)."""
    return f"{-(-seconds // 6) / 10:g}"


def budget_check(first: list[float], left: float, opts: TuneOptions) -> tuple[str | None, str | None]:
    """(a one-line error when not even the quickest candidate fits beside the least kernel sweep, the estimate and
    the flags that would fit where the whole budget of candidates does not) from ``first``: the pool's estimates,
    the model's best first."""
    from .budget import KERNEL_MIN_S, KERNEL_SHARE

    least = min(first) + KERNEL_MIN_S
    if least > left:
        return (f"{opts.max_minutes:g} minute(s) cannot measure one candidate: the quickest is estimated at "
                f"{fmt(least)} with the least kernel sweep", f"pass --max-minutes {_minutes(least)} or more"), None
    need = [sum(first[:k]) / (1 - KERNEL_SHARE) for k in range(1, len(first) + 1)]
    if need[min(opts.budget, len(need)) - 1] <= left:
        return None, None
    fits = max((k + 1 for k, n in enumerate(need) if n <= left), default=1)
    return None, (f"estimated {fmt(need[min(opts.budget, len(need)) - 1])} for --budget {opts.budget}, over "
                  f"--max-minutes {opts.max_minutes:g}: fits --budget {fits}, or --max-minutes "
                  f"{_minutes(need[min(opts.budget, len(need)) - 1])}; running a trimmed sweep")


def _start(r: _Run, work: Workload) -> tuple[bool, dict | None]:
    """Open (or resume) this run in the store; (resumed, the stored link fit) on every rank."""
    fp = r.cluster.topology_fingerprint()
    stack = software_stack(_device().type)
    key = run_key(fp, stack, r.model, work, {"layers": r.opts.layers, "iters": r.opts.iters})
    state = None
    if r.rank == 0:
        run_id, resumed = r.store.start_run(key, {"cluster": r.cluster.name, "fingerprint": fp, "stack": stack,
                                                  "model": r.model.name, "workload": work.model_dump(mode="json")})
        state = (run_id, resumed, r.store.steps(run_id), r.store.link_fit(fp))
    r.run_id, resumed, r.steps, links = _bcast(state, r.rank)
    return resumed, links


def _first_pool(r: _Run) -> list[Plan]:
    """The uncalibrated pool (the kernel sweep's shapes); PlanError on every rank where nothing fits the world or the
    time; the budget's estimate noted."""
    out = None
    if r.rank == 0:
        pool = candidate_pool(r.cluster, r.model, r.work, Params(), r.opts.pool)
        first = list(estimates(r.cluster, pool, Params(), r.opts, {}).values())
        err, note = budget_check(first, r.budget.left(), r.opts) if pool else (None, None)
        out = (pool, err, note, sum(first[:r.opts.budget]))
    pool, err, note, need = _bcast(out, r.rank)
    if not pool:
        raise PlanError("workload", f"no layout of {r.cluster.world_size} ranks fits {r.model.name} at "
                        f"{r.work.seq_len} tokens", "tune a shorter --seq-len or a smaller model")
    if err and not r.steps:
        raise PlanError("--max-minutes", *err)
    r.notes += [note] if note else []
    r.candidates_s = need
    return pool


def _links(r: _Run, links: dict | None, reused: list[str]) -> dict | None:
    """The stored link fit for this cluster, else measured as `profile links` does (collective)."""
    if links is None and r.steps.get("links", ("", None))[0] == "ok":
        links = r.steps["links"][1]
    if links is not None:
        reused.append("links")
        r.tick("links", 1, 1, "links: stored fit reused")
    elif dist.get_world_size() > 1:
        r.tick("links", 0, 1, "measuring links")
        links = measure_links_step(r.cluster, r.opts)
        if r.rank == 0:
            r.store.save_link_fit(r.cluster.topology_fingerprint(), links)
        r.record("links", "ok", links)
        r.tick("links", 1, 1, "links measured")
    return links


def _kernels(r: _Run, pool: list[Plan], reused: list[str]) -> tuple[list[dict], str, float | None]:
    """(samples, timing, round-probe seconds): stored, else a sweep planned from the time left, and the probe."""
    if r.steps.get("kernels", ("", None))[0] == "ok":
        got = r.steps["kernels"][1]
        reused.append("kernels")
        r.tick("kernels", 1, 1, "kernels: stored timings reused")
        return got["samples"], got.get("timing", "each"), got.get("rounds_s")
    dev, t0 = _device(), r.budget.elapsed()
    share = kernel_budget(r.budget.left(), r.candidates_s)
    r.tick("kernels", 0, 1, f"timing attention blocks and GEMMs (planned for {fmt(share)})")
    skipped: list = []
    kernels = measure_kernels_step(pool, r.model, r.work, r.opts, share, r.budget.clock, skipped)
    if skipped:
        r.notes.append(f"kernel sweep trimmed to its {fmt(share)}: left out {shown_groups(skipped)} (the "
                       "planner's curves extrapolate to them)")
    r.tick("kernels", 1, 1, f"{len(kernels)} kernel timings")
    rounds_s = None
    if dist.get_world_size() > 1 and not r.budget.spent():
        r.tick("rounds", 0, 1, "timing ring rounds")
        rounds_s = time_rounds(r.model, dev, _dtype(r.model, dev))
        r.tick("rounds", 1, 1, f"ring rounds: {rounds_s * 1e3:.1f} ms")
    r.record("kernels", "ok", {"samples": kernels, "timing": kernel_timing(r.opts, dev), "rounds_s": rounds_s,
                               "skipped": [list(g) for g in skipped], "seconds": r.budget.elapsed() - t0})
    return kernels, kernel_timing(r.opts, dev), rounds_s


def shown_groups(groups: list) -> str:
    """Kernel groups as said: "4096-token blocks on 8 heads", "GEMMs of 1024 rows", "the solo-speedup timing"."""
    said = {"attention": lambda g: f"{g[1]}-token blocks on {g[2]} heads", "matmul": lambda g: f"GEMMs of {g[1]} rows"}
    return ", ".join(said[g[0]](g) if g[0] in said else f"the {g[0]} timing" for g in groups)


def _resumed(r: _Run, pool: list[Plan], by_name: dict[str, Plan], reused: list[str]) -> None:
    """The candidates an interrupted run of this tune measured, into ``r.measured`` (and the pool)."""
    for name, (status, payload) in r.steps.items():
        if name.startswith("candidate:") and status in ("ok", "failed"):
            mc = MeasuredCandidate.model_validate(payload)
            r.measured[mc.summary] = mc
            if mc.summary not in by_name:  # measured under an earlier ranking: keep it in the pool
                by_name[mc.summary] = Plan.model_validate(mc.plan)
                pool.append(by_name[mc.summary])
    if r.measured:
        reused.append(f"{len(r.measured)} candidate(s)")
        spent = sum(m.detail.get("wall_s", 0.0) for m in r.measured.values())
        spent += (r.steps.get("kernels", ("", {}))[1] or {}).get("seconds", 0.0)
        r.notes.append(f"the earlier run spent {fmt(spent)} on what is reused; --max-minutes counts from the resume")


def _choose(r: _Run, pool: list[Plan], params: Params, result: FitResult | None) -> tuple[Choice, float]:
    """Rank 0: the next candidate that fits the time left (those that do not are skipped), and its estimate."""
    opts, measured = r.opts, r.measured
    ok = [m for m in measured.values() if m.status == "ok"]
    est = estimates(r.cluster, pool, params, opts, measured)
    preds = [predict(r.cluster, p, params)[0] for p in pool]
    left_out = {w.split(" skipped")[0] for w in r.skipped}
    while True:
        if len(measured) >= opts.budget:
            return Choice(None, 0.0, f"budget of {opts.budget} candidate(s) reached"), 0.0
        if r.budget.spent():
            return Choice(None, 0.0, f"--max-minutes {opts.max_minutes:g} reached"), 0.0
        done = [p.summary() in measured or p.summary() in left_out for p in pool]
        best = min((m.measured_s for m in ok), default=None)
        sigma = sigma_from(result.loo_error_after if result else None, len(ok))
        skipped = sum(1 for p in pool if p.summary() in left_out and p.summary() not in measured)
        choice = next_candidate(preds, done, best, sigma, families=[family(p) for p in pool],
                                explore=opts.budget - 1 - len(measured), min_measured=MIN_MEASURED + skipped)
        if choice.index is None:
            return choice, 0.0
        name = pool[choice.index].summary()
        if est[name] <= r.budget.left():
            return choice, est[name]
        r.skip(f"candidate:{name}", name, est[name])
        left_out.add(name)
        if all(p.summary() in measured or p.summary() in left_out for p in pool):
            return Choice(None, 0.0, "no candidate left fits the time left of --max-minutes"), 0.0


def _candidates(r: _Run, pool: list[Plan], base: Params, hold) -> tuple[Params, FitResult | None, str]:
    """Measure candidates one at a time, refitting after each, until the budget, the time or the choice stops."""
    params, result = base, None
    while True:  # rank 0 refits, checks the limits and chooses; every rank runs the chosen candidate
        out = None
        if r.rank == 0:
            ok = [m for m in r.measured.values() if m.status == "ok"]
            if ok:
                result = fit(r.cluster, base, ok, hold)
                params = result.params
            out = (*_choose(r, pool, params, result), r.skipped)
        choice, need, r.skipped = _bcast(out, r.rank)
        if choice.index is None:
            return params, result, choice.why
        plan = pool[choice.index]
        name, n = plan.summary(), len(r.measured)
        r.tick("candidates", n, r.opts.budget, f"{name} ({choice.why}; estimated {fmt(need)})")
        r.record(f"candidate:{name}", "running", {"summary": name})
        mc = _timed(r, plan, r.opts.faults.get(name) or r.opts.faults.get(f"#{n}"), need)
        r.record(f"candidate:{name}", "ok" if mc.status == "ok" else "failed", mc.model_dump(mode="json"))
        r.measured[name] = mc
        r.tick("candidates", len(r.measured), r.opts.budget, f"{name}: {mc.status}")


def _timed(r: _Run, plan: Plan, fault: str | None, need: float) -> MeasuredCandidate:
    """``plan`` measured, stopped where it would run past the time left; its wall seconds and estimate kept."""
    t0 = r.budget.elapsed()
    left = _bcast(r.budget.left(), r.rank)  # one deadline for every rank
    opts = replace(r.opts, candidate_timeout=max(min(r.opts.candidate_timeout, left), 1.0))
    mc = run_candidate(plan, r.model, r.work, r.cluster, opts, fault)
    wall = _bcast(r.budget.elapsed() - t0, r.rank)
    if mc.status == "timeout" and left < r.opts.candidate_timeout:
        mc = mc.model_copy(update={"reason": f"{mc.reason}; stopped at the end of --max-minutes "
                                              f"{r.opts.max_minutes:g}"})
    return mc.model_copy(update={"detail": {**mc.detail, "wall_s": wall, "estimate_s": need}})


def _again(r: _Run, key: str, plan: Plan, need: float) -> MeasuredCandidate | None:
    """One more reading (``_reading``) where it fits the time left, else None (skipped, said)."""
    fits = _bcast(r.steps.get(key, ("", None))[0] in ("ok", "failed") or need <= r.budget.left(), r.rank)
    if not fits:
        r.skip(key, f"{key.split(':')[0]} of {plan.summary()}", need)
        return None
    return _reading(r.steps, key, plan, r.model, r.work, r.cluster, r.opts, r.store, r.run_id, r.rank)


def _reread(r: _Run, by_name: dict, result: FitResult | None, base: Params, hold) -> FitResult | None:
    """A candidate read once and far slower than the others predict it is read once more (noise only adds time),
    kept at its faster reading, and the model refitted."""
    late = r.budget.spent()
    again = _bcast(surprises(result, list(r.measured.values()), r.opts.reread) if r.rank == 0 and not late else None,
                   r.rank) or []
    for j, name in enumerate(again):
        r.tick("reread", j, len(again), f"{name}: read again (slower than predicted)")
        mc = _again(r, f"reread:{name}", by_name[name], _need(r, name))
        more = [mc.measured_s] if mc is not None and mc.status == "ok" else []
        r.measured[name] = confirmed(r.measured[name], readings_of(r.measured[name]) + more)
        r.tick("reread", j + 1, len(again), f"{name}: {len(readings_of(r.measured[name]))} readings")
    if again and r.rank == 0:
        result = fit(r.cluster, base, [m for m in r.measured.values() if m.status == "ok"], hold)
    return result


def _need(r: _Run, name: str) -> float:
    """Seconds one more reading of a measured candidate should take: its own first reading's."""
    return float(r.measured[name].detail.get("wall_s") or 0.0)


def _confirm(r: _Run, by_name: dict, result: FitResult | None, base: Params, hold) -> FitResult | None:
    """The best and the runners-up within opts.confirm_within (or the model's leave-one-out error, if wider) read
    again, in rounds (one reading of each contender a round), each kept at its fastest reading; then those within
    the spread their readings showed."""
    done: list[str] = []
    for _ in range(2):
        late = r.budget.spent()
        predicted = {c.summary: c.predicted_after_s for c in result.candidates if c.predicted_after_s} if result else {}
        noise = reading_spread(r.measured, done) if done else (result.loo_error_after if result else None)
        reach = max(r.opts.confirm_within, noise or 0.0)
        todo = _bcast(contenders(r.measured, r.opts, predicted, reach, done) if r.rank == 0 and not late else None,
                      r.rank) or []
        if not todo:
            break
        readings = {name: readings_of(r.measured[name]) for name in todo}
        order = confirm_order(todo, r.opts.confirm)
        for j, (name, k) in enumerate(order):
            r.tick("confirm", j, len(order), f"{name}: reading {len(readings[name]) + 1}")
            mc = _again(r, f"confirm:{name}:{k}", by_name[name], _need(r, name))
            if mc is not None and mc.status == "ok":
                readings[name].append(mc.measured_s)
            r.tick("confirm", j + 1, len(order), f"{name}: {len(readings[name])} readings")
        for name in todo:
            r.measured[name] = confirmed(r.measured[name], readings[name])
        done += todo
        if r.rank == 0:
            result = fit(r.cluster, base, [m for m in r.measured.values() if m.status == "ok"], hold)
    return result


def tune(cluster: Cluster, model: ModelSpec, work: Workload, store=None, opts: TuneOptions | None = None,
         progress: Progress | None = None) -> TuneReport:
    """Profile this cluster on the running world within ``opts.max_minutes`` (collective; ``store`` is used on rank
    0 only)."""
    opts = opts or TuneOptions()
    rank = dist.get_rank()
    check_world(cluster, dist.get_world_size())
    r = _Run(cluster, model, work, store, opts, progress or (lambda *a: None), Budget(opts.max_minutes * 60.0,
                                                                                      opts.clock), rank)
    resumed, links = _start(r, work)
    reused: list[str] = []
    pool = _first_pool(r)
    links = _links(r, links, reused)
    kernels, timing, rounds_s = _kernels(r, pool, reused)
    base, said = base_params(cluster, model, kernels, links)
    base, hold = with_round_probe(cluster, model, base, rounds_s, said)
    if timing == "shared":
        said.append("kernels timed by every rank at once, one shared window each (kernel timing shared)")
    pool = _bcast(candidate_pool(cluster, model, work, base, opts.pool) if rank == 0 else None, rank)
    by_name = {p.summary(): p for p in pool}
    _resumed(r, pool, by_name, reused)
    _, result, stop = _candidates(r, pool, base, hold)
    result = _reread(r, by_name, result, base, hold)
    result = _confirm(r, by_name, result, base, hold)
    return _finish(r, base, said, result, links, kernels, rounds_s, resumed, reused, stop)


def _finish(r: _Run, base, said, result, links, kernels, rounds_s, resumed, reused, stop) -> TuneReport:
    """Store the profile (rank 0) and return the report on every rank."""
    profile = best_plan = None
    r.notes.append(f"spent {fmt(r.budget.elapsed())} of --max-minutes {r.opts.max_minutes:g}")
    if r.rank == 0:
        profile = _profile(r.cluster, r.model, r.work, software_stack(_device().type), base, said, result,
                           list(r.measured.values()), links, kernels, rounds_s)
        if r.skipped:
            profile.measurements["skipped"] = list(r.skipped)
        profile.id = r.store.save_profile(profile)
        r.store.finish_run(r.run_id, "done")
        best_plan = best_measured(r.cluster, profile, result.params if result else base)
    profile, best_plan = _bcast((profile, best_plan), r.rank)
    return TuneReport(profile, best_plan, resumed, reused, stop, r.run_id, list(result.notes) if result else [],
                      list(r.skipped), list(r.notes))


def _reading(steps: dict, key: str, plan: Plan, model: ModelSpec, work: Workload, cluster: Cluster,
             opts: TuneOptions, store, run_id, rank: int) -> MeasuredCandidate:
    """One more reading of a measured candidate: the store's, kept under ``key`` by an interrupted tune, else a fresh
    run (fault-free), checkpointed under ``key`` on rank 0."""
    if steps.get(key, ("", None))[0] in ("ok", "failed"):
        return MeasuredCandidate.model_validate(steps[key][1])
    mc = run_candidate(plan, model, work, cluster, opts)
    if rank == 0:
        store.record_step(run_id, key, "ok" if mc.status == "ok" else "failed", mc.model_dump(mode="json"))
    return mc


#: a reading over its leave-one-out prediction by more than max(SURPRISE_FLOOR, SURPRISE_SPREAD x the fit's median
#: leave-one-out error) is a surprise (``surprises``)
SURPRISE_FLOOR = 0.10
SURPRISE_SPREAD = 2.0


def surprises(result: FitResult | None, measured: list[MeasuredCandidate], most: int) -> list[str]:
    """The candidates read once whose step reads slower than the fit without them predicts by more than
    max(SURPRISE_FLOOR, SURPRISE_SPREAD x the median leave-one-out error), the largest excess first, ``most`` at most.
    Whatever else runs on the hosts only adds time, so a reading far above what the other candidates predict is the
    likeliest to hold a slow spell, and being one of a few it moves the whole fit: on two hosts of 2 CPU ranks a
    tune read `ring ring2 pp2 contiguous` at 2.08 s, 50 % over its leave-one-out prediction (ground truth 1.26 s);
    the fit priced the pipelines' compute by it, and ranked the ground truth's layouts at Spearman 0.67 (0.84 fitted
    without that reading). A reading faster than predicted is not a surprise of this kind: it is left as read. With
    fewer than MIN_MEASURED timed candidates the leave-one-out error means nothing, and nothing is a surprise."""
    timed = [mc for mc in measured if mc.status == "ok" and mc.measured_s]
    if result is None or most < 1 or result.loo_error_after is None or len(timed) < MIN_MEASURED:
        return []
    reach = max(SURPRISE_FLOOR, SURPRISE_SPREAD * result.loo_error_after)
    excess = {}
    for mc, loo in zip(measured, result.loo_times):
        once = len(readings_of(mc)) == 1
        if mc.status == "ok" and mc.measured_s and loo and once and mc.measured_s / loo - 1 > reach:
            excess[mc.summary] = mc.measured_s / loo - 1
    return sorted(excess, key=lambda n: -excess[n])[:most]


#: contenders read again at most: the best measured and two runners-up
MAX_CONTENDERS = 3


def contenders(measured: dict[str, MeasuredCandidate], opts: TuneOptions,
               predicted: dict[str, float] | None = None, reach: float | None = None,
               done: list[str] | tuple = ()) -> list[str]:
    """The best measured candidate and the runners-up within ``reach`` (default ``opts.confirm_within``) of it,
    measured or as the calibrated model predicts them (``predicted``: summary -> seconds), the likeliest first (by the
    faster of the two: whatever else runs on the hosts only adds time to a reading), those in ``done`` (read again
    already) left out, MAX_CONTENDERS in all at most; none when no runner-up is that close: one reading each decides
    between them. On 4 CPU ranks sharing two cores a tune read two layouts 568 and 596 ms whose medians of three
    passes are 598 and 554 ms; on 8, one at 944 ms (the third within 5 % of the best) whose median of two passes is
    the best of the five, 868 ms, and one at 993 ms, predicted at 910 ms, within 10 % of the best's 833 ms, whose two
    passes read 845 and 809 ms. tune passes as ``reach`` the model's leave-one-out error where it is wider than 10 %
    (a reading or a prediction is off by as much), then the spread of the contenders' readings."""
    ok = sorted((m for m in measured.values() if m.status == "ok" and m.measured_s), key=lambda m: m.measured_s)
    if not ok or opts.confirm < 1:
        return []
    top = ok[0].measured_s * (1 + (opts.confirm_within if reach is None else reach))
    pred = predicted or {}
    likely = {m.summary: min(m.measured_s, pred.get(m.summary, float("inf"))) for m in ok}
    near = sorted((n for n in likely if likely[n] <= top), key=lambda n: likely[n])
    if len(near) < 2:
        return []
    return [n for n in near if n not in done][:max(MAX_CONTENDERS - len(done), 0)]


def reading_spread(measured: dict[str, MeasuredCandidate], names: list[str]) -> float | None:
    """The median over ``names`` (read more than once) of a candidate's slowest reading over its fastest, less 1:
    the noise of one reading on these hosts, as the tune itself read it (None without such candidates). The
    confirm step reads the runners-up within it too: on two hosts of 2 CPU ranks a tune read its contenders
    `ring ring4 contiguous` at 1.352, 1.381 and 1.707 s and `usp ulysses2 ring2` at 1.434, 1.631 and 1.433 s (a
    spread of 20 %), and the head-to-head fastest layout, `tokenring ring2 pp2`, once at 1.552 s, 15 % behind."""
    spreads = [max(r) / min(r) - 1 for r in (readings_of(measured[n]) for n in names if n in measured)
               if len(r) > 1 and min(r) > 0]
    return float(statistics.median(spreads)) if spreads else None


def confirm_order(todo: list[str], confirm: int) -> list[tuple[str, int]]:
    """The confirm step's readings, (contender, k), in rounds: every contender's k-th reading before any one's
    (k+1)-th, so that a slow spell of the hosts lands on several contenders' readings, not on one contender's
    (a randomized-block design's blocks: the reread passes of bench_tune's kept 8-rank truth ran at 0.95-1.42 of its
    first pass's speed)."""
    return [(name, k) for k in range(confirm) for name in todo]


def readings_of(mc: MeasuredCandidate) -> list[float]:
    """A measured candidate's step readings: those kept in ``detail['readings_s']`` (``confirmed``), else its one."""
    return list(mc.detail.get("readings_s") or [mc.measured_s])


def confirmed(mc: MeasuredCandidate, readings: list[float]) -> MeasuredCandidate:
    """``mc`` at the fastest of its step-time readings (all kept in ``detail['readings_s']``). Whatever else runs on
    the hosts only adds time (timeit's rule: the minimum, not the mean, measures the code); on two hosts of 2 CPU
    ranks each a layout read 1.21, 1.80 and 1.78 s in three passes of a ground truth, and 1.28-1.30 s in three
    readings taken later beside nine other layouts, whose medians matched each layout's fastest pass within 7 % and
    its median pass only within 45 %."""
    return mc.model_copy(update={"measured_s": min(readings),
                                 "detail": {**mc.detail, "readings_s": list(readings)}})


def run_candidate(plan: Plan, model: ModelSpec, work: Workload, cluster: Cluster, opts: TuneOptions,
                  fault: str | None = None) -> MeasuredCandidate:
    """One candidate on the running world, in a child world of its own (a hang or crash stays there)."""
    from .isolate import run_candidate_isolated

    dev = _device()
    return run_candidate_isolated(plan, model, work, timeout_s=opts.candidate_timeout, layers=opts.layers,
                                  warmup=opts.warmup, iters=opts.iters, device=dev.type, dtype=_dtype(model, dev),
                                  memory_limit_bytes=cluster.device(0).memory_bytes, fault=fault)


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
