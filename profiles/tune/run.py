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

from .choose import MIN_MEASURED, Choice, diversify, family, next_candidate, sigma_from, with_families
from .kernels import chosen_backends
from .rounds import LAYERS as PROBE_LAYERS, TOKENS_PER_RANK as PROBE_TOKENS, round_overhead, time_rounds
from .software import software_stack

#: progress(step, done, total, label): step is "links", "kernels", "candidates", "reread" or "confirm"
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
    ranked = ranked_plans(cluster, model, work, params)
    return with_families(diversify(ranked, size), diversify(ranked, len(ranked)))


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


def measure_kernels_step(pool: list[Plan], model: ModelSpec, work: Workload, opts: TuneOptions) -> list[dict]:
    """Every rank times its own device's kernels for the pool's block shapes; all ranks' samples (collective)."""
    from .kernels import kernel_shapes, measure_kernels, shared_windows, token_rows

    dev = _device()
    blocks, heads = kernel_shapes(pool, model, work)
    shared = shared_windows if kernel_timing(opts, dev) == "shared" and dist.get_world_size() > 1 else None
    mine = measure_kernels(model, blocks, heads, dev, _dtype(model, dev), work.causal, repeats=opts.kernel_repeats,
                           gemm_rows=token_rows(pool, work), windows=shared)
    mine += measure_alone(model, max(blocks), max(heads), dev, _dtype(model, dev), work.causal, opts.kernel_repeats)
    return [dict(s, rank=r) for r, samples in enumerate(gather_objects([asdict(s) for s in mine])) for s in samples]


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


def tune(cluster: Cluster, model: ModelSpec, work: Workload, store=None, opts: TuneOptions | None = None,
         progress: Progress | None = None) -> TuneReport:
    """Profile this cluster on the running world (collective; ``store`` is used on rank 0 only)."""
    opts = opts or TuneOptions()
    rank, world = dist.get_rank(), dist.get_world_size()
    check_world(cluster, world)
    tick = progress or (lambda *a: None)
    started = time.monotonic()
    dev = _device()
    stack = software_stack(dev.type)
    fp = cluster.topology_fingerprint()
    key = run_key(fp, stack, model, work, {"layers": opts.layers, "iters": opts.iters})

    # ---- resume: what the store already holds for this run (rank 0 reads, all learn)
    state = None
    if rank == 0:
        run_id, resumed = store.start_run(key, {"cluster": cluster.name, "fingerprint": fp, "stack": stack,
                                                "model": model.name, "workload": work.model_dump(mode="json")})
        state = (run_id, resumed, store.steps(run_id), store.link_fit(fp))
    run_id, resumed, steps, links = _bcast(state, rank)
    reused: list[str] = []

    # ---- links: the stored fit for this cluster, else measure as `profile links` does
    if links is None and steps.get("links", ("", None))[0] == "ok":
        links = steps["links"][1]
    if links is not None:
        reused.append("links")
        tick("links", 1, 1, "links: stored fit reused")
    elif world > 1:
        tick("links", 0, 1, "measuring links")
        links = measure_links_step(cluster, opts)
        if rank == 0:
            store.save_link_fit(fp, links)
            store.record_step(run_id, "links", "ok", links)
        tick("links", 1, 1, "links measured")

    # ---- kernels: the block shapes the model's best candidates run
    pool = _bcast(candidate_pool(cluster, model, work, Params(), opts.pool) if rank == 0 else None, rank)
    if not pool:
        raise PlanError("workload", f"no layout of {world} ranks fits {model.name} at {work.seq_len} tokens",
                        "tune a shorter --seq-len or a smaller model")
    if steps.get("kernels", ("", None))[0] == "ok":
        kernels = steps["kernels"][1]["samples"]
        timing = steps["kernels"][1].get("timing", "each")
        rounds_s = steps["kernels"][1].get("rounds_s")
        reused.append("kernels")
        tick("kernels", 1, 1, "kernels: stored timings reused")
    else:
        tick("kernels", 0, 1, "timing attention blocks and GEMMs")
        dev = _device()
        kernels, timing = measure_kernels_step(pool, model, work, opts), kernel_timing(opts, dev)
        rounds_s = time_rounds(model, dev, _dtype(model, dev)) if world > 1 else None
        if rank == 0:
            store.record_step(run_id, "kernels", "ok", {"samples": kernels, "timing": timing, "rounds_s": rounds_s})
        tick("kernels", 1, 1, f"{len(kernels)} kernel timings")
    base, said = base_params(cluster, model, kernels, links)
    base, hold = with_round_probe(cluster, model, base, rounds_s, said)
    if timing == "shared":
        said.append("kernels timed by every rank at once, one shared window each (kernel timing shared)")

    # ---- candidates: the pool under the measured kernels and links, chosen one at a time
    pool = _bcast(candidate_pool(cluster, model, work, base, opts.pool) if rank == 0 else None, rank)
    by_name = {p.summary(): p for p in pool}
    measured: dict[str, MeasuredCandidate] = {}
    for name, (status, payload) in steps.items():
        if name.startswith("candidate:") and status in ("ok", "failed"):
            mc = MeasuredCandidate.model_validate(payload)
            measured[mc.summary] = mc
            if mc.summary not in by_name:  # measured under an earlier ranking: keep it in the pool
                by_name[mc.summary] = Plan.model_validate(mc.plan)
                pool.append(by_name[mc.summary])
    if measured:
        reused.append(f"{len(measured)} candidate(s)")
    params, result = base, None
    limit = opts.max_minutes * 60.0
    while True:  # rank 0 refits, checks the limits and chooses; every rank runs the chosen candidate
        choice = None
        if rank == 0:
            ok = [m for m in measured.values() if m.status == "ok"]
            if ok:
                result = fit(cluster, base, ok, hold)
                params = result.params
            if len(measured) >= opts.budget:
                choice = Choice(None, 0.0, f"budget of {opts.budget} candidate(s) reached")
            elif time.monotonic() - started > limit:
                choice = Choice(None, 0.0, f"--max-minutes {opts.max_minutes:g} reached")
            else:
                preds = [predict(cluster, p, params)[0] for p in pool]
                best = min((m.measured_s for m in ok), default=None)
                sigma = sigma_from(result.loo_error_after if result else None, len(ok))
                choice = next_candidate(preds, [p.summary() in measured for p in pool], best, sigma,
                                        families=[family(p) for p in pool], explore=opts.budget - 1 - len(measured))
        choice = _bcast(choice, rank)
        if choice.index is None:
            stop = choice.why
            break
        plan = pool[choice.index]
        name = plan.summary()
        tick("candidates", len(measured), opts.budget, f"{name} ({choice.why})")
        if rank == 0:
            store.record_step(run_id, f"candidate:{name}", "running", {"summary": name})
        mc = run_candidate(plan, model, work, cluster, opts, opts.faults.get(name) or opts.faults.get(f"#{len(measured)}"))
        if rank == 0:
            store.record_step(run_id, f"candidate:{name}", "ok" if mc.status == "ok" else "failed",
                              mc.model_dump(mode="json"))
        measured[name] = mc
        tick("candidates", len(measured), opts.budget, f"{name}: {mc.status}")

    # ---- reread: a candidate read once and far slower than the others predict it is read once more (noise only
    # adds time), kept at its faster reading, and the model refitted
    late = time.monotonic() - started > limit
    again = _bcast(surprises(result, list(measured.values()), opts.reread) if rank == 0 and not late else None,
                   rank) or []
    for j, name in enumerate(again):
        tick("reread", j, len(again), f"{name}: read again (slower than predicted)")
        mc = _reading(steps, f"reread:{name}", by_name[name], model, work, cluster, opts, store, run_id, rank)
        more = [mc.measured_s] if mc.status == "ok" else []
        measured[name] = confirmed(measured[name], readings_of(measured[name]) + more)
        tick("reread", j + 1, len(again), f"{name}: {len(readings_of(measured[name]))} readings")
    if again and rank == 0:
        result = fit(cluster, base, [m for m in measured.values() if m.status == "ok"], hold)
        params = result.params

    # ---- confirm: the best and the runners-up within opts.confirm_within (or the model's leave-one-out error, if
    # wider) read again, in rounds (one reading of each contender a round), each kept at its fastest reading; then
    # those within the spread their readings showed
    done: list[str] = []
    for _ in range(2):
        late = time.monotonic() - started > limit
        predicted = {c.summary: c.predicted_after_s for c in result.candidates if c.predicted_after_s} if result else {}
        noise = reading_spread(measured, done) if done else (result.loo_error_after if result else None)
        reach = max(opts.confirm_within, noise or 0.0)
        todo = _bcast(contenders(measured, opts, predicted, reach, done) if rank == 0 and not late else None,
                      rank) or []
        if not todo:
            break
        readings = {name: readings_of(measured[name]) for name in todo}
        order = confirm_order(todo, opts.confirm)
        for j, (name, k) in enumerate(order):
            key = f"confirm:{name}:{k}"
            tick("confirm", j, len(order), f"{name}: reading {len(readings[name]) + 1}")
            mc = _reading(steps, key, by_name[name], model, work, cluster, opts, store, run_id, rank)
            if mc.status == "ok":
                readings[name].append(mc.measured_s)
            tick("confirm", j + 1, len(order), f"{name}: {len(readings[name])} readings")
        for name in todo:
            measured[name] = confirmed(measured[name], readings[name])
        done += todo
        if rank == 0:
            result = fit(cluster, base, [m for m in measured.values() if m.status == "ok"], hold)
            params = result.params

    profile = best_plan = None
    if rank == 0:
        profile = _profile(cluster, model, work, stack, base, said, result, list(measured.values()), links, kernels,
                           rounds_s)
        profile.id = store.save_profile(profile)
        store.finish_run(run_id, "done")
        best_plan = best_measured(cluster, profile, params)
    profile, best_plan = _bcast((profile, best_plan), rank)
    return TuneReport(profile, best_plan, resumed, reused, stop, run_id, list(result.notes) if result else [])


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
        cands.append(mc.model_copy(update={"predicted_before_s": b_s, "predicted_memory_before": b_m,
                                           "predicted_after_s": a_s, "predicted_memory_after": a_m}))
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
