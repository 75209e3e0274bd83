"""Run one candidate plan end to end on every rank: a real layer stack, forward + backward + AdamW.

Few layers, the rest scaled. The stack is built with L1 = 1 and L2 = min(max(layers, 2), L)
blocks, L = model.layers / pp (one pipeline stage). Each measured quantity q (forward+backward
seconds, gradient sync seconds, optimizer seconds, peak bytes, bytes live before the step) is linear in the number of
blocks: q(l) = fixed + l * per_layer, with per_layer = (q(L2) - q(L1)) / (L2 - L1) (clamped at 0
against noise) and fixed = q(L1) - L1 * per_layer (embedding, head, loss, their optimizer state).
The result is q(L). fwd_bwd is per micro-batch (m = batch / (dp x micro_batch_size) of them per
step). Step time: pp = 1: m x fwd_bwd(L) + optimizer(L) (all m micro-batches run, gradients
accumulated and synchronized in the last); pp > 1 (1F1B composed from one stage's micro-batch, run twice to read
the gradients' sync apart, ``bench_step``, the stage-boundary sends measured beside it, ``stage_sends``):
(m + p - 1) x (fwd_bwd(L) + sends) + sync(L) + optimizer(L). Peak memory: peak(L),
plus (min(p, m) - 1) x activations(L) for pp > 1 (1F1B keeps up to p micro-batches in flight on
stage 0), activations = peak - live before the step. Every value is the max over ranks. A tune times up to
``iters`` steps at each block count, fewer where the last two readings agree on every rank (``_measure_stack``).
"""
from __future__ import annotations

import statistics
import time
import functools
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist

from sp_plan.planner.model import ModelSpec, Workload, micro_batches
from sp_plan.planner.plan import Plan
from sp_plan.planner.profile import MeasuredCandidate
from sp_plan.runtime import init
from sp_plan.profiles.discover.probe import gather_objects

from .metp_stack import build_metp, metp_tokens
from .memory import CPU_METHOD, CUDA_METHOD, PeakMemory
from .parallel import IGNORE, accumulate, parallelize, replica_mesh, sequence_attend
from .stack import build_stack, random_batch, token_loss
from .timing import sync

FAULTS = ("raise", "oom", "hang", "stall", "slow")
#: a fault's rank for "@all": every rank fails at once, so no peer waits for it in a collective
ALL_RANKS = -2
#: seconds the "slow" fault adds to every step it is injected in (a slow spell of the host, as a test sees it)
SLOW_S = 1.0
QUANTITIES = ("fwd_bwd_s", "sync_s", "optimizer_s", "peak_bytes", "static_bytes")


def parse_fault(fault: str | None) -> tuple[str | None, int]:
    """Test hook: "raise", "oom", "hang", "stall" or "slow", optionally "@rank" (default rank 0) or "@all" (every
    rank at once: ALL_RANKS)."""
    if not fault:
        return None, -1
    kind, _, rank = fault.partition("@")
    if kind not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; use one of {FAULTS}, optionally with @rank or @all")
    return kind, ALL_RANKS if rank == "all" else int(rank or 0)


def _hit(at: int, rank: int) -> bool:
    """Whether a fault parsed as ``at`` falls on ``rank``."""
    return at in (rank, ALL_RANKS)


def inject(fault: str | None, rank: int) -> None:
    """Test hook: raise, run out of memory, hang or take SLOW_S seconds longer on the fault's rank."""
    kind, at = parse_fault(fault)
    if kind in (None, "stall") or not _hit(at, rank):
        return
    if kind == "slow":
        time.sleep(SLOW_S)
        return
    if kind == "raise":
        raise RuntimeError(f"injected fault on rank {rank}")
    if kind == "oom":
        raise torch.OutOfMemoryError(f"injected out-of-memory on rank {rank}")
    while True:  # "hang"
        time.sleep(3600)


def stall(fault: str | None, rank: int) -> None:
    """Test hook: "stall" hangs the fault's rank after the candidate ran (its peers have their results)."""
    kind, at = parse_fault(fault)
    while kind == "stall" and _hit(at, rank):
        time.sleep(3600)


def layer_counts(target: int, layers: int) -> list[int]:
    """The block counts measured: [1, L2] with L2 = min(max(layers, 2), target), or [1] when target is 1."""
    l2 = min(max(layers, 2), target)
    return [1] if l2 <= 1 else [1, l2]


def stage_depth(model: ModelSpec, plan: Plan) -> int:
    """Blocks one pipeline stage holds: L = model.layers / pp (at least 1)."""
    return max(model.layers // plan.degrees["pp"], 1)


def _device(device: str | torch.device) -> torch.device:
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d



@dataclass
class Bench:
    """One stack of ``layers`` blocks built for a plan on this rank, with its micro-batches, ready to step."""

    par: object  # parallel.Parallel, or metp_stack's
    data: list  # (inputs, targets) of each micro-batch run, this rank's shard
    attend: object
    micro_batches: int  # m = batch / (dp x micro_batch_size) in a step
    micro_batches_run: int  # m, or 1 for pp > 1 (one stage's micro-batch; the step is composed)
    notes: dict
    attends: list = field(default_factory=list)  # each micro-batch's attention (its mask), else ``attend``
    staged: bool = False  # one pipeline stage's (pp > 1): ``bench_step`` reads its gradients' sync apart


def packed_masks(work: Workload, sequences: int) -> list[tuple[tuple[int, ...] | None, int | None]]:
    """(cu_seqlens, window) of each of ``sequences`` micro-batches run: packs drawn from the workload's documents with
    its seed (planner.documents.workload_packs), the window of the stack's first layers (every measured layer is
    windowed where a pattern's first layers are); (None, None) each without masks."""
    from sp_plan.planner.documents import workload_packs

    win = None if work.mask_window is None else work.mask_window.layer_window(0)
    if work.documents is None:
        return [(None, win)] * sequences
    return [(tuple(int(x) for x in cu), win) for cu in workload_packs(work, sequences)]


def build_bench(plan: Plan, model: ModelSpec, work: Workload, ctx, mesh, n_layers: int, *, device: torch.device,
                dtype: torch.dtype) -> Bench:
    """The plan's stack of ``n_layers`` blocks on this rank (TP, ZeRO, checkpointing as the plan says) and its data;
    with packed documents or a window each micro-batch is a packed batch (every row of it the same pack), sharded
    and attended under its mask."""
    d, rank = plan.degrees, dist.get_rank()
    m = micro_batches(work.batch, d["dp"], plan.micro_batch_size)
    m_run = m if d["pp"] == 1 else 1
    masks = packed_masks(work, m_run)
    if plan.algorithm == "metp":
        par = build_metp(model, n_layers, plan, ctx, work.causal, seed=n_layers, device=device, dtype=dtype)
        idx = metp_tokens(plan, ctx.ranks("tp"), rank, work.seq_len).to(device)
        local = lambda t, cu, win: t.index_select(1, idx)  # noqa: E731
        tp_shard, trim = (lambda t, fill=0: t), (lambda attend, tokens: attend)  # METP shards its own TP
    else:
        par = parallelize(build_stack(model, n_layers, plan.checkpointing, seed=n_layers, device=device,
                                      dtype=dtype), plan, mesh)
        local = lambda t, cu, win: ctx.shard(t, dim=1, cu_seqlens=cu, window=win)  # noqa: E731
        # TP-sp: this TP rank's 1/tp, padded where tp does not divide the rank's tokens, the padding trimmed to attend
        tp_shard, trim = par.shard_tokens, sequence_attend
    dp_coord = plan.layout().coords(rank).get("dp", 0)
    data, attends = [], []
    for j, (cu, win) in enumerate(masks):
        x, y = random_batch(model, plan.micro_batch_size, work.seq_len, 1000 + 100 * dp_coord + j, device=device,
                            dtype=dtype)
        xs, ys = local(x, cu, win), local(y, cu, win)
        data.append((tp_shard(xs), tp_shard(ys, fill=IGNORE)))
        attends.append(trim(functools.partial(_attend, ctx, work.causal, cu, win), xs.shape[1]))
    return Bench(par, data, attends[0], m, m_run, dict(par.notes), attends, staged=d["pp"] > 1)


def _attend(ctx, causal: bool, cu_seqlens, window, q, k, v):
    """The plan's attention under a micro-batch's mask (none: as a single document)."""
    if cu_seqlens is None and window is None:
        return ctx.attention(q, k, v, causal=causal)
    return ctx.attention(q, k, v, causal=causal, cu_seqlens=cu_seqlens, window=window)


def train_step(bench: Bench, model: ModelSpec, device: torch.device, fault: str | None = None) -> tuple[float, float]:
    """One training step of ``bench`` on this rank: (forward + backward of its micro-batches with the gradients'
    synchronization, optimizer step) seconds; ``fault`` (test hook) is injected before the first micro-batch."""
    par, rank = bench.par, dist.get_rank()
    t0 = time.perf_counter()
    for j, (x, y) in enumerate(bench.data):
        if j == 0:
            inject(fault, rank)
        with accumulate(par.module, j == len(bench.data) - 1):
            attend = bench.attends[j] if bench.attends else bench.attend
            token_loss(par.module(x, attend), y, model).backward()
    par.sync_grads()
    sync(device)
    t1 = time.perf_counter()
    par.optimizer.step()
    par.optimizer.zero_grad(set_to_none=True)
    sync(device)
    return t1 - t0, time.perf_counter() - t1


def bench_step(bench: Bench, model: ModelSpec, device: torch.device, fault: str | None = None
               ) -> tuple[float, float, float]:
    """One step of ``bench``: (forward + backward of one micro-batch, the gradients' synchronization a step adds
    once, optimizer) seconds. Without a pipeline the step runs its m micro-batches, the last synchronizing (inside
    its backward, or after it): its forward + backward is the step's over m, the synchronization in it. A pipeline
    stage's step (``Bench.staged``) synchronizes once after its m micro-batches, so its one micro-batch runs twice:
    first as a micro-batch before the last (nothing synchronized), then as the last; what the second takes over the
    first is the synchronization, which 1F1B's composed step counts once (``composed_step``)."""
    if not bench.staged:
        fb, opt = train_step(bench, model, device, fault)
        return fb / bench.micro_batches_run, 0.0, opt
    par, (x, y) = bench.par, bench.data[0]
    t0 = time.perf_counter()
    inject(fault, dist.get_rank())
    with accumulate(par.module, False):
        token_loss(par.module(x, bench.attends[0] if bench.attends else bench.attend), y, model).backward()
    sync(device)
    first = time.perf_counter() - t0
    last, opt = train_step(bench, model, device)
    return first, max(last - first, 0.0), opt


def steady(readings: list[float], within: float | None) -> bool:
    """Whether the last two step readings agree within ``within`` (a share of the faster): a third reading's median
    with them lies between them, so it could move the result by no more than that."""
    if within is None or len(readings) < 2:
        return False
    a, b = readings[-2:]
    return abs(a - b) <= within * min(a, b)


def all_agree(flag: bool) -> bool:
    """``flag`` on every rank of the world (collective: a rank that reads on stops with the others)."""
    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t[0])


def with_optimizer_state(par) -> None:
    """The optimizer's state made as its first step makes it (a step on zero gradients, which moves no AdamW weight
    but by its decay), so that a step read for memory holds that state from its start, as every later step does."""
    for p in par.module.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    par.optimizer.step()
    par.optimizer.zero_grad(set_to_none=True)


def tracked_step(bench: Bench, step: Callable[[], tuple[float, float]]) -> tuple[float, float]:
    """(bytes live before, peak bytes) of one untimed ``step()`` of ``bench`` under the storage tracker (``PeakMemory``:
    it slows ops down, so the step is not a timed one). Storages the step makes that outlive it (the runtime's caches
    made on a first call, FSDP's unsharded parameters freed by resizing) are not counted: a later step finds them
    made, and its peak is what it allocates over what it was given."""
    par = bench.par
    tracker = PeakMemory()
    tracker.track(par.module, par.optimizer, getattr(par.optimizer, "optim", None),
                  *[t for pair in bench.data for t in pair])
    static, before = tracker.live, set(tracker.seen())
    tracker.reset_peak()
    with tracker:
        step()
    kept = sum(n for key, n in tracker.seen().items() if key not in before)
    return float(static), float(max(tracker.peak - kept, static))


def _measure_stack(plan, model, work, ctx, mesh, n_layers, *, warmup, iters, device, dtype, fault, notes,
                   agree_within=None, first=True):
    """This rank's median seconds (fwd_bwd per micro-batch, optimizer per step) and memory for ``n_layers`` blocks.
    On CPU one untimed step reads the peak memory under the storage tracker: in the ``first`` stack a measurement
    builds, a step after the timed ones (the stack's first step makes what the runtime caches on a first call, and
    its transients); in a later stack, whose first step finds those made, the last warm-up step (one at least), with
    the optimizer's state made first where no step has made it (``with_optimizer_state``), so that warming the stack
    up and reading its memory are one step, not two. With ``agree_within`` the timed steps stop before ``iters`` once
    the last two forward-backward readings (an untracked warm-up's counted) agree within it on every rank
    (``steady``)."""
    bench = build_bench(plan, model, work, ctx, mesh, n_layers, device=device, dtype=dtype)
    notes.update(bench.notes)
    m, m_run = bench.micro_batches, bench.micro_batches_run

    def step():  # the timed step; a fault is injected in every step: "slow" slows each, the others end the first
        return bench_step(bench, model, device, fault)

    def one():  # the step whose memory is read: a pipeline stage's micro-batch once (``_pipeline_memory``)
        return train_step(bench, model, device, fault)

    cuda = device.type == "cuda"
    tracked_warm = not cuda and not first
    warm = [step()[0] for _ in range(warmup - 1 if tracked_warm else warmup)][-1:]
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        static = torch.cuda.memory_allocated(device)
    elif tracked_warm:
        if warmup <= 1:
            with_optimizer_state(bench.par)
        static, peak = tracked_step(bench, one)
    fb, sy, opt = [], [], []
    for i in range(iters):
        dist.barrier()
        a, c, b = step()
        fb.append(a)
        sy.append(c)
        opt.append(b)
        if agree_within is not None and i + 1 < iters and all_agree(steady(warm + fb, agree_within)):
            break
    if cuda:
        peak = _cuda_peak(bench, one, device)
    elif not tracked_warm:
        static, peak = tracked_step(bench, one)
    return {"fwd_bwd_s": statistics.median(fb), "sync_s": statistics.median(sy), "optimizer_s": statistics.median(opt),
            "peak_bytes": float(peak), "static_bytes": float(static), "micro_batches_run": m_run, "micro_batches": m,
            "steps_timed": len(fb)}


def _cuda_peak(bench: Bench, one: Callable[[], tuple[float, float]], device: torch.device) -> int:
    """The CUDA allocator's peak since the timed steps began; a pipeline stage's (whose timed steps run its
    micro-batch twice) read over one more step that runs it once."""
    if bench.staged:
        torch.cuda.reset_peak_memory_stats(device)
        one()
    return torch.cuda.max_memory_allocated(device)


def masked_attention(plan: Plan, model: ModelSpec, work: Workload, ctx, *, iters: int, device: torch.device,
                     dtype: torch.dtype) -> float | None:
    """This rank's median seconds of one layer's attention forward + backward under the first micro-batch's mask
    (``packed_masks``), over ``iters`` runs after one warm-up; None without masks."""
    ((cu, win),) = packed_masks(work, 1)
    if cu is None and win is None:
        return None
    tp = plan.degrees["tp"]
    gen = torch.Generator().manual_seed(7)
    full = lambda h: torch.randn(plan.micro_batch_size, work.seq_len, h, model.head_dim, generator=gen)  # noqa: E731
    q, k, v = (ctx.shard(full(h), dim=1, cu_seqlens=cu, window=win).to(device=device, dtype=dtype).requires_grad_()
               for h in (model.heads // tp, max(model.kv_heads // tp, 1), max(model.kv_heads // tp, 1)))
    times = []
    for i in range(iters + 1):  # the first is a warm-up
        dist.barrier()
        t0 = time.perf_counter()
        out = _attend(ctx, work.causal, cu, win, q, k, v)
        out.backward(torch.ones_like(out))
        sync(device)
        if i:
            times.append(time.perf_counter() - t0)
        q.grad = k.grad = v.grad = None
    return statistics.median(times)


def attention_detail(per_rank: list[float | None]) -> dict | None:
    """The slowest rank's masked attention seconds, every rank's, and their max over mean (the mask's imbalance)."""
    if not per_rank or any(t is None for t in per_rank):
        return None
    mean = sum(per_rank) / len(per_rank)
    return {"measured_s": max(per_rank), "per_rank_s": list(per_rank),
            "imbalance": max(per_rank) / mean if mean > 0 else None}


def stage_message(plan: Plan, model: ModelSpec, work: Workload) -> tuple[int, int, int]:
    """The (micro-batch, tokens, hidden) tensor a stage sends the next each way in 1F1B: a sequence rank's tokens
    over tp (schedules.pipeline_p2p prices its bytes)."""
    d = plan.degrees
    return plan.micro_batch_size, work.seq_len // (d["ulysses"] * d["ring"] * d["tp"]), model.hidden


def stage_round_trip(plan: Plan, model: ModelSpec, work: Workload, *, device: torch.device,
                     dtype: torch.dtype) -> Callable[[], float]:
    """A callable timing (seconds, this rank) one micro-batch's stage-boundary traffic in 1F1B: its activations to
    the next stage and their gradients back (schedules.pipeline_p2p: b x N/(sp tp) x H elements each way, shifted
    over the pp group), every stage at once as in the pipeline's steady state."""
    rank = dist.get_rank()
    group = plan.layout().group_of(("pp",), rank)
    i, p = group.index(rank), len(group)
    nxt, prv = group[(i + 1) % p], group[(i - 1) % p]
    out = torch.randn(*stage_message(plan, model, work), dtype=dtype, device=device)
    into = torch.empty_like(out)

    def exchange(to: int, frm: int) -> None:
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, out, to), dist.P2POp(dist.irecv, into, frm)]):
            w.wait()

    def round_trip() -> float:
        t0 = time.perf_counter()
        exchange(nxt, prv)  # activations forward
        exchange(prv, nxt)  # their gradients back
        sync(device)
        return time.perf_counter() - t0

    return round_trip


def stage_sends(plan: Plan, model: ModelSpec, work: Workload, *, iters: int, device: torch.device,
                dtype: torch.dtype) -> float:
    """This rank's median seconds of one micro-batch's stage-boundary traffic (``stage_round_trip``) over
    ``iters`` round trips after one warm-up."""
    round_trip = stage_round_trip(plan, model, work, device=device, dtype=dtype)
    times = []
    for k in range(iters + 1):  # the first is a warm-up
        dist.barrier()
        t = round_trip()
        if k:
            times.append(t)
    return statistics.median(times)


def composed_step(m: int, p: int, fwd_bwd: float, sends: float, optimizer: float, sync_s: float = 0.0) -> float:
    """Step seconds: pp = 1, m x fwd_bwd + sync + optimizer (m micro-batches run); pp > 1, 1F1B composed from one
    stage's micro-batch (Narayanan et al. 2021): (m + p - 1) x (fwd_bwd + sends) + sync + optimizer, the gradients'
    synchronization once a step (``bench_step``)."""
    rounds = m if p == 1 else m + p - 1
    return rounds * (fwd_bwd + (sends if p > 1 else 0.0)) + sync_s + optimizer


def extrapolate(values: dict[int, float], target: int) -> tuple[float, float, float, bool]:
    """(value at target, fixed, per_layer, clamped) of a quantity measured at one or two block counts."""
    ls = sorted(values)
    if len(ls) == 1:
        return values[ls[0]], values[ls[0]], 0.0, False
    l1, l2 = ls[0], ls[-1]
    per = (values[l2] - values[l1]) / (l2 - l1)
    clamped = per < 0
    per = max(per, 0.0)
    fixed = values[l1] - l1 * per
    return fixed + target * per, fixed, per, clamped


def slowest(everyone: list[tuple], counts: list[int]) -> tuple[dict, float]:
    """Every rank's (readings per block count, stage sends, attention) reduced to what a step waits for: per block
    count and quantity the slowest rank's reading, and the slowest rank's sends (1F1B's stages move in lock-step)."""
    worst = {n: {q: max(r[n][q] for r, _, _ in everyone) for q in QUANTITIES} for n in counts}
    return worst, max(s for _, s, _ in everyone)


def measure(plan: Plan, model: ModelSpec, work: Workload, *, layers: int = 2, warmup: int = 1, iters: int = 3,
            device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, fault: str | None = None,
            agree_within: float | None = None, backends: dict | None = None) -> dict:
    """The collective part of ``run_candidate``: measure every block count, max over ranks, extrapolate; with
    ``agree_within``, fewer than ``iters`` timed steps where the readings agree (``_measure_stack``). ``backends``:
    this rank's block-kernel decisions already made (``runtime.choice``: Key -> Decision), used as made and updated
    with the ones this measurement makes, so that a tune measures each once, not once a candidate (a choice among
    the CPU kernels of 1,024-token blocks takes seconds, inside a candidate's first step).

    Raises on any failure (then peers may be blocked in a collective: see run_candidate_isolated).
    """
    device = _device(device)
    plan.check_world(dist.get_world_size())
    ctx = init(plan, device_type=device.type)
    if backends is not None:
        ctx.backends.decisions = backends
    mesh = replica_mesh(plan, device.type)
    d = plan.degrees
    target = stage_depth(model, plan)
    counts = layer_counts(target, layers)
    notes: dict = {}
    per_rank: dict[int, dict] = {}
    for n in counts:
        per_rank[n] = _measure_stack(plan, model, work, ctx, mesh, n, warmup=warmup, iters=iters, device=device,
                                     dtype=dtype, fault=fault, notes=notes, agree_within=agree_within,
                                     first=n == counts[0])
    sends = stage_sends(plan, model, work, iters=iters, device=device, dtype=dtype) if d["pp"] > 1 else 0.0
    att = masked_attention(plan, model, work, ctx, iters=iters, device=device, dtype=dtype)
    everyone = gather_objects(({n: {q: per_rank[n][q] for q in QUANTITIES} for n in counts}, sends, att))
    attention = attention_detail([a for _, _, a in everyone])
    worst, sends = slowest(everyone, counts)
    fit = {q: extrapolate({n: worst[n][q] for n in counts}, target) for q in QUANTITIES}
    fb, sync_s, opt, peak, static = (fit[q][0] for q in QUANTITIES)
    m, p = per_rank[counts[0]]["micro_batches"], d["pp"]
    fallbacks = [v for v in notes.values() if "FALLBACK" in v]
    if p > 1:
        fallbacks.append(f"pp{p}: step composed from one stage (1F1B), not run as a pipeline")
    detail = {
        "device": str(device), "dtype": str(dtype).removeprefix("torch."), "world": dist.get_world_size(),
        "layers_measured": counts, "layers_target": target, "micro_batches": m,
        "micro_batches_run": per_rank[counts[0]]["micro_batches_run"], "warmup": warmup, "iters": iters,
        "steps_timed": {str(n): per_rank[n]["steps_timed"] for n in counts}, "agree_within": agree_within,
        "measured": {str(n): worst[n] for n in counts},
        "fit": {q: {"value": v, "fixed": f, "per_layer": s, "clamped": c} for q, (v, f, s, c) in fit.items()},
        "per_rank_fwd_bwd_s": [r[counts[-1]]["fwd_bwd_s"] for r, _, _ in everyone],
        "memory_method": CUDA_METHOD if device.type == "cuda" else CPU_METHOD,
        "checkpointing": plan.checkpointing, **notes, "fallbacks": fallbacks,
        **({"attention": attention} if attention else {}),
    }
    memory = _pipeline_memory(detail, m, p, target, (fb, sends, sync_s, opt), peak, static)
    return {"measured_s": composed_step(m, p, fb, sends, opt, sync_s), "measured_memory": memory, "detail": detail}


def _pipeline_memory(detail: dict, m: int, p: int, target: int, times: tuple[float, float, float, float],
                     peak: float, static: float) -> float:
    """A candidate's peak memory: one stage's, plus under a pipeline (p > 1) the activations of the min(p, m) - 1
    micro-batches 1F1B keeps in flight; says how the pipeline's step was composed (``times``: forward + backward,
    sends, sync, optimizer) in ``detail``."""
    if p == 1:
        return peak
    fb, sends, sync_s, opt = times
    detail["stage_sends_s"] = sends
    detail["pipeline"] = (f"COMPOSED 1F1B: every rank ran one stage of {target} layers on one micro-batch and "
                          f"timed its stage-boundary sends (activations forward, gradients back, all stages at "
                          f"once) and its gradients' sync; step = (m + p - 1) x (fwd_bwd + sends) + sync + optimizer "
                          f"= ({m} + {p} - 1) x ({fb:.4g} + {sends:.4g}) + {sync_s:.4g} + {opt:.4g} s; memory = peak + "
                          f"(min(p, m) - 1) x activations")
    return peak + (min(p, m) - 1) * max(peak - static, 0.0)


def _candidate(plan: Plan, model: ModelSpec, work: Workload, **fields) -> MeasuredCandidate:
    full = plan.model_copy(update={"model": model, "workload": work})
    return MeasuredCandidate(summary=plan.summary(), plan=full.model_dump(mode="json"), model=model.name,
                             seq_len=work.seq_len, batch=work.batch, **fields)


def classify(exc: BaseException) -> str:
    """'oom' for out-of-memory errors, 'error' for the rest."""
    return "oom" if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower() else "error"


def over_limit(result: dict, memory_limit_bytes: float | None) -> str | None:
    """The OOM reason when the (extrapolated) peak exceeds the device memory, else None."""
    if memory_limit_bytes is None or result["measured_memory"] <= memory_limit_bytes:
        return None
    return (f"peak memory {result['measured_memory']:.4g} B (extrapolated to the full stage) exceeds the device "
            f"memory {memory_limit_bytes:.4g} B")


def run_candidate(plan: Plan, model: ModelSpec, work: Workload, *, layers: int = 2, warmup: int = 1, iters: int = 3,
                  device: str = "cpu", dtype=torch.float32, memory_limit_bytes: float | None = None,
                  fault: str | None = None, agree_within: float | None = None) -> MeasuredCandidate:
    """Measure ``plan`` on every rank of the initialized world (module docstring); the same result on every rank.

    ``fault`` is a test hook ("raise", "oom", "hang" or "stall", optionally "@rank"). A failure on one rank
    that leaves its peers blocked in a collective only resolves at the process group's timeout;
    ``run_candidate_isolated`` runs this in a fresh child world instead.
    """
    rank = dist.get_rank()
    try:
        res = measure(plan, model, work, layers=layers, warmup=warmup, iters=iters, device=device, dtype=dtype,
                      fault=fault, agree_within=agree_within)
        local = ("ok", res)
    except Exception as e:  # noqa: BLE001 - a fault is a result
        local = (classify(e), f"{type(e).__name__}: {e}")
    outcomes = gather_objects((rank, *local))
    return agree(plan, model, work, outcomes, memory_limit_bytes)


def agree(plan, model, work, outcomes: list[tuple], memory_limit_bytes: float | None = None) -> MeasuredCandidate:
    """One MeasuredCandidate from every rank's (rank, status, payload): first failure wins, else the result."""
    failed = [o for o in outcomes if o[1] != "ok"]
    if failed:
        order = {"timeout": 0, "oom": 1, "error": 2}
        r, status, reason = min(failed, key=lambda o: (order.get(o[1], 3), o[0]))[:3]
        return _candidate(plan, model, work, status=status, reason=reason, rank=r)
    res = outcomes[0][2]
    why = over_limit(res, memory_limit_bytes)
    return _candidate(plan, model, work, status="oom" if why else "ok", reason=why or "",
                      measured_s=res["measured_s"], measured_memory=res["measured_memory"], detail=res["detail"])
