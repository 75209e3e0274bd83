"""What a tune measures on the running world: links, kernels (with the solo-speedup timing), one candidate.

Collective where it says so: every rank calls it, with the same arguments. The parameters the kernels and links
give before any candidate runs (``base_params``, ``with_round_probe``) are here too.
"""
from __future__ import annotations

import functools
import time
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Callable

import torch
import torch.distributed as dist

from sp_plan.planner.calibration import curve_of, masked_split, measured_params
from sp_plan.planner.cluster import Cluster
from sp_plan.planner.model import ModelSpec, Workload
from sp_plan.planner.params import CURVES, Params
from sp_plan.planner.plan import Plan
from sp_plan.planner.profile import KernelSample, MeasuredCandidate
from sp_plan.profiles.discover.sizes import DEFAULT_SIZES, parse_sizes  # the link step sizes as `discover --sizes`
from sp_plan.profiles.discover.probe import gather_objects
from sp_plan.runtime.choice import BackendChoice

from .kernels import chosen_backends
from .rounds import LAYERS as PROBE_LAYERS, TOKENS_PER_RANK as PROBE_TOKENS, round_overhead
from .settings import SETTINGS, TuneSettings

if TYPE_CHECKING:
    from .run import TuneOptions


def device() -> torch.device:
    """This rank's device: its CUDA device, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def dtype_of(model: ModelSpec, dev: torch.device) -> torch.dtype:
    """CPU ranks run float32 (the CPU flash kernel's best); GPUs the model's dtype."""
    if dev.type == "cpu":
        return torch.float32
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[model.dtype]


def measure_links(cluster: Cluster, opts: TuneOptions) -> dict:
    """`profile links` on this world: the fitted ``calibration['links']`` dict (collective)."""
    from sp_plan.profiles.discover import probe  # noqa: PLC0415 - the probe loads the network's sources

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
                         skipped: list | None = None, replan: Callable[[list[KernelSample]], float] | None = None,
                         tick: Callable[[bool, str], None] | None = None, spared: list | None = None,
                         spanned: list | None = None, backends: dict | None = None) -> list[dict]:
    """Every rank times its own device's kernels for the pool's block shapes; all ranks' samples (collective).
    With ``budget_s`` the sweep runs in two parts: the least sweep (the model's best candidate's largest block and
    its GEMMs), then, in what ``replan`` (given the least sweep's samples, collective) leaves it, the other shapes
    the best candidates run, most needed first (``kernels.measure_kernels``; what it left out goes to
    ``skipped``); the solo-speedup timing is run on the largest block timed whose cost fits what ``replan`` left.
    Kernels whose repeats agreed early go to ``spared`` (``kernels.measure_kernels``), window calls left out where a
    kernel's calls are long to ``spanned`` (``kernels.shared_windows``). The block-kernel decisions the sweep makes
    go into ``backends`` (the candidates' children use them, ``candidate.measure``)."""
    from .kernels import Forecast, kernel_priority, kernel_shapes, measure_kernels, shared_windows, sweep_groups, \
        token_rows

    dev, t0, s = device(), clock(), opts.settings
    shared = None
    if kernel_timing(opts, dev) == "shared" and dist.get_world_size() > 1:
        shared = functools.partial(shared_windows, calls=s.window_calls, least=s.window_min_s,
                                   fewest=s.window_min_calls, span=s.window_span_s, spared=spanned)
    choice = BackendChoice.from_env()
    if backends is not None:
        choice.decisions = backends
    sweep = functools.partial(measure_kernels, model, device=dev, dtype=dtype_of(model, dev), causal=work.causal,
                              repeats=opts.kernel_repeats, windows=shared, clock=clock, skipped=skipped, tick=tick,
                              forecast=Forecast(), settings=s, spared=spared, choice=choice)
    rows = token_rows(pool, work)
    if budget_s is None:
        blocks, heads = kernel_shapes(pool, model, work)
        mine = sweep(blocks, heads, gemm_rows=rows)
    else:
        shapes, best_rows = kernel_priority(pool, model, work), token_rows(pool[:1], work)
        mine = sweep([], [], gemm_rows=best_rows, budget_s=budget_s, shapes=shapes[:1])
        rest = budget_s - (clock() - t0)
        if replan is not None:
            rest = min(rest, replan(mine))
        end = clock() + rest  # the rest of the sweep and the solo-speedup timing end here
        more = [r for r in rows if r not in best_rows]
        if (shapes[1:] or more) and rest > 0:
            mine += sweep([], [], gemm_rows=more, budget_s=rest, shapes=shapes[1:])
        elif skipped is not None:
            skipped.extend(sweep_groups([], [], more, shapes[1:]))
    left = None if budget_s is None else end - clock()
    alone = alone_shape(mine, dist.get_world_size(), opts.kernel_repeats, left, s)
    if alone is not None:
        mine += measure_alone(model, *alone, dev, dtype_of(model, dev), work.causal, opts.kernel_repeats, s)
    elif skipped is not None:
        skipped.append(("solo speedup",))
    return [dict(x, rank=r) for r, samples in enumerate(gather_objects([asdict(x) for x in mine])) for x in samples]


def alone_shape(samples: list[KernelSample], world: int, repeats: int, left_s: float | None,
                settings: TuneSettings = SETTINGS) -> tuple[int, int] | None:
    """(block, heads) for measure_alone: the largest timed attention block, or with ``left_s`` the largest whose
    timings (each rank alone in turn, then together) fit it, agreed by every rank; None where none does."""
    from .kernels import _agreed

    cost: dict[tuple[int, int], float] = {}
    for x in samples:  # measure_alone times the forwards
        if x.kind == "attention_fwd":
            cost[(x.size, x.heads)] = cost.get((x.size, x.heads), 0.0) + x.seconds
    fits = [k for k, c in cost.items() if left_s is None or
            _agreed(c * (world * (repeats + 1) + settings.together_calls), True) <= left_s]
    return max(fits) if fits else None


def measure_alone(model: ModelSpec, block: int, heads: int, dev: torch.device, dtype: torch.dtype, causal: bool,
                  repeats: int, settings: TuneSettings = SETTINGS) -> list[KernelSample]:
    """The largest attention block forward, timed by each rank in turn while the others wait at a barrier
    (``alone`` True), then by every rank at once (``alone`` False): each kernel back to back through one wall-clock
    window that every rank shares, ``settings.together_calls`` times the slowest rank's time alone (at least
    ``settings.together_min_s``), so that the ranks compute together for all of it: calibration.solo_speedup."""
    from .kernels import measure_kernels, shared_windows

    def fwd(alone: bool, windows=None) -> list[KernelSample]:
        # forwards only (their backwards, twice as long, would be timed and dropped): the speedup is one ratio
        return [replace(x, alone=alone) for x in measure_kernels(model, [block], [heads], dev, dtype, causal,
                                                                 repeats=repeats, gemm_rows=[], windows=windows,
                                                                 kinds=("attention_fwd",))]

    out: list[KernelSample] = []
    rank, world = dist.get_rank(), dist.get_world_size()
    for r in range(world):
        dist.barrier()
        if r == rank:
            out = fwd(True)

    def agree(firsts: list[float]) -> tuple[float, list[float]]:
        """Once every rank has prepared its kernels: one start and window length for all, from the slowest rank's
        time alone."""
        longest = max((x.seconds for x in out), default=0.0)
        start, (each,) = shared_windows([longest], calls=settings.together_calls, least=settings.together_min_s)
        return start, [each] * len(firsts)
    return out + fwd(False, agree)


def base_params(cluster: Cluster, model: ModelSpec, kernels: list[dict], links: dict | None) -> tuple[Params, list[str]]:
    """Kernel curves and collective fits: the parameters measured directly, before any candidate runs."""
    samples = [KernelSample(**{k: v for k, v in x.items() if k != "rank"}) for x in kernels]
    params = measured_params(cluster, model.dtype, samples, links)
    split = masked_split(samples)
    said = [f"{k} curve from {sum(1 for x in samples if not x.alone and curve_of(x, split) == k)} kernel timings"
            for k in CURVES if getattr(params, k) is not None]
    if kernels and chosen_backends(kernels):
        said.append(f"attention blocks on {chosen_backends(kernels)} (runtime.choice)")
    if params.comm:
        said.append("collective efficiency and latency for " + ", ".join(sorted(params.comm)))
    if any(x.alone for x in samples):
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
                f"{PROBE_LAYERS} layers of {PROBE_TOKENS} tokens a rank: {rounds_s * 1e3:.1f} ms)"
                + ("; the links and kernels alone price the probe at or above that" if ro == 0 else ""))
    return base.model_copy(update={"round_overhead_s": ro}), frozenset({"round_overhead_s"})


def run_candidate(plan: Plan, model: ModelSpec, work: Workload, cluster: Cluster, opts: TuneOptions,
                  fault: str | None = None, beat: Callable[[float], None] | None = None,
                  backends: dict | None = None) -> MeasuredCandidate:
    """One candidate on the running world, in a child world of its own (a hang or crash stays there); ``beat``
    (seconds since it started) is called about every second while it runs; ``backends``: this rank's block-kernel
    decisions so far, used by the child and updated with those it makes (``candidate.measure``)."""
    from .isolate import run_candidate_isolated

    dev = device()
    return run_candidate_isolated(plan, model, work, timeout_s=opts.candidate_timeout, layers=opts.layers,
                                  warmup=opts.warmup, iters=opts.iters, device=dev.type, dtype=dtype_of(model, dev),
                                  memory_limit_bytes=cluster.device(0).memory_bytes, fault=fault, beat=beat,
                                  agree_within=opts.settings.step_agree, backends=backends)
