"""Tune's kernel step: time the runtime's block attention (forward, backward) and the model's GEMMs.

The attention kernels are ``runtime.kernels.block_attention`` / ``block_attention_backward``, the
ones every distributed variant calls, on one (query block = key block) of each length with the
model's head dim and its KV heads per head count, on the backend the runtime chooses for that block
(``runtime.choice``: ``SP_PLAN_ATTN_BACKEND`` or measured), recorded in each sample. GEMMs are the block's linear layers, rows =
tokens. FLOPs follow ``KernelSample``: attention forward 4 b s^2 h d (half when causal), backward
2.5x, GEMM 2 m n k.
"""
from __future__ import annotations

import functools
import math
import statistics
import time
from typing import Callable

import torch

from sp_plan.planner.errors import PlanError, of_type, whole_number
from sp_plan.planner.model import ModelSpec, Workload
from sp_plan.planner.plan import Plan
from sp_plan.planner.profile import KernelSample
from sp_plan.runtime.choice import BackendChoice
from sp_plan.runtime.kernels import block_attention, block_attention_backward

from .settings import SETTINGS, TuneSettings
from .timing import sync, time_readings, time_window

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
                torch.float64: "float64"}


def attention_flops(size: int, heads: int, head_dim: int, causal: bool, batch: int = 1,
                    backward: bool = False) -> float:
    """KernelSample's attention FLOPs: 4 b s^2 h d, halved when causal, x2.5 for the backward."""
    f = 4.0 * batch * size * size * heads * head_dim * (0.5 if causal else 1.0)
    return 2.5 * f if backward else f


def kv_heads_for(model: ModelSpec, heads: int) -> int:
    """KV heads that go with ``heads`` query heads under the model's GQA ratio (at least 1)."""
    kv = max(1, heads * model.kv_heads // model.heads)
    return kv if heads % kv == 0 else heads


def gemm_shapes(model: ModelSpec, rows: int) -> dict[str, tuple[int, int, int]]:
    """(m, n, k) of the block's linear layers for ``rows`` tokens: QKV, O, MLP up (gate+up), MLP down."""
    up = model.ffn_hidden * (2 if model.gated_mlp else 1)
    return {"qkv": (rows, model.q_dim + 2 * model.kv_dim, model.hidden), "o": (rows, model.hidden, model.q_dim),
            "mlp_up": (rows, up, model.hidden), "mlp_down": (rows, model.hidden, model.ffn_hidden)}


#: windows: a (start wall time, seconds each) pair, or a function of the kernels' first-call seconds (every kernel
#: prepared) that agrees one start and a length per kernel across the ranks (``shared_windows``)
Windows = tuple[float, float] | Callable[[list[float]], tuple[float, list[float]]]


def _attention_jobs(model: ModelSpec, n: int, h: int, rnd, choice, causal: bool, name_backend=None) -> list:
    """The block attention forward and backward of ``n`` tokens on ``h`` heads (causal: masked and dense), ready."""
    d, kv = model.head_dim, kv_heads_for(model, h)
    q, k, v = rnd(1, n, h, d), rnd(1, n, kv, d), rnd(1, n, kv, d)
    dout = rnd(1, n, h, d)
    jobs = []
    # causal work: blocks under the causal mask (a ring's diagonal, striped's) and dense ones (the rest)
    for masked in ((True, False) if causal else (False,)):
        offset = 0 if masked else None
        backend = choice.choose(q, k, masked)
        o, lse = block_attention(q, k, v, causal_offset=offset, backend=backend)
        fwd = functools.partial(block_attention, q, k, v, causal_offset=offset, backend=backend)
        bwd = functools.partial(block_attention_backward, dout, q, k, v, o, lse, causal_offset=offset,
                                backend=backend)
        for kind, fn, back in (("attention_fwd", fwd, False), ("attention_bwd", bwd, True)):
            jobs.append((fn, dict(kind=kind, size=n, heads=h, head_dim=d, causal=masked, backend=backend,
                                  flops=attention_flops(n, h, d, masked, backward=back))))
    return jobs


def _gemm_jobs(model: ModelSpec, rows: int, rnd) -> list:
    """The block's linear layers for ``rows`` tokens, ready."""
    return [(functools.partial(torch.matmul, rnd(m, k), rnd(k, n)),
             dict(kind="matmul", size=m, heads=0, head_dim=0, causal=False, flops=2.0 * m * n * k,
                  backend="torch.matmul", gemm=(m, n, k))) for m, n, k in gemm_shapes(model, rows).values()]


def _unique(xs) -> list:
    """``xs`` without repeats, first seen first."""
    return list(dict.fromkeys(xs))


def sweep_groups(blocks: list[int], heads: list[int], gemm_rows: list[int], shapes=None) -> list[tuple]:
    """The sweep's kernel groups in the order they are timed: ("attention", n, h) of ``shapes`` (the candidates'
    most needed first) else every block x head count ascending, with ("matmul", rows) after the first."""
    att = [("attention", n, h) for n, h in _unique(shapes)] if shapes else \
        [("attention", n, h) for h in sorted(set(heads)) for n in sorted(set(blocks))]
    mm = [("matmul", r) for r in (_unique(gemm_rows) if shapes else sorted(set(gemm_rows)))]
    return (att[:1] + mm + att[1:]) if shapes else att + mm


def _agreed(value: float, collective: bool) -> float:
    """The largest ``value`` over the ranks of the default group (collective), or this rank's."""
    import torch.distributed as dist

    if not collective or not dist.is_initialized():
        return value

    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t[0])


def group_flops(model: ModelSpec, group: tuple, causal: bool) -> float:
    """FLOPs one call of each kernel of a sweep group runs: an attention group's forward and backward (causal: under
    the mask and dense), a GEMM group's four linear layers."""
    if group[0] == "attention":
        n, h, d = group[1], group[2], model.head_dim
        return sum(attention_flops(n, h, d, m) + attention_flops(n, h, d, m, backward=True)
                   for m in ((True, False) if causal else (False,)))
    return sum(2.0 * m * n * k for m, n, k in gemm_shapes(model, group[1]).values())


class Forecast:
    """Seconds a sweep group's preparation should take, from the groups prepared so far: each kind's seconds per
    FLOP (an attention group's from the attention groups, a GEMM group's from the GEMMs, else from the attention:
    the slower of the two on every device measured)."""

    def __init__(self) -> None:
        self.rate: dict[str, float] = {}

    def learn(self, group: tuple, flops: float, seconds: float) -> None:
        """One prepared group's FLOPs and seconds (the slowest rate a kind showed is kept)."""
        if flops > 0:
            self.rate[group[0]] = max(self.rate.get(group[0], 0.0), seconds / flops)

    def seconds(self, group: tuple, flops: float) -> float:
        """The group's forecast (0 before any group is prepared)."""
        rate = self.rate.get(group[0]) or self.rate.get("attention") or max(self.rate.values(), default=0.0)
        return rate * flops


def measure_kernels(model: ModelSpec, blocks: list[int], heads: list[int], device: torch.device,
                    dtype: torch.dtype, causal: bool, repeats: int = 5,
                    gemm_rows: list[int] | None = None, windows: Windows | None = None,
                    budget_s: float | None = None, shapes: list[tuple[int, int]] | None = None,
                    clock: Callable[[], float] = time.monotonic, skipped: list | None = None,
                    tick: Callable[[bool, str], None] | None = None, forecast: Forecast | None = None,
                    settings: TuneSettings = SETTINGS, spared: list | None = None,
                    kinds: tuple[str, ...] | None = None, choice: BackendChoice | None = None) -> list[KernelSample]:
    """Attention block fwd/bwd over ``blocks`` x ``heads`` (or the (block, heads) ``shapes``, most needed first) and
    the model's GEMMs over ``gemm_rows`` (default: blocks). Every kernel is prepared first (inputs, the runtime's
    backend choice, one untimed call), then timed. ``windows`` (start wall time, seconds each), or a function that
    agrees the start and each kernel's length once every kernel is prepared (so that no rank is still choosing a
    backend when the others start), given the kernels' first-call seconds: the i-th timed kernel runs back to back
    through its window, the windows laid end to end from the start (``timing.time_window``), the same windows on
    every rank, instead of a median of ``repeats``. With ``budget_s`` (on ``clock``) a group is prepared only where
    its forecast preparation and its least timing (``forecast``: the groups prepared so far, here or in an earlier
    sweep, scaled by FLOPs; none before the first) fit what is left, agreed by every rank of the default group
    (collective); the windows shrink to what is left, and the groups left out go to ``skipped``.
    ``tick(advanced, message)`` says each group prepared (advanced True) and each kernel timed. Timed without
    windows, a kernel's repeats stop once two successive readings agree within ``settings.kernel_agree``
    (``timing.time_readings``); ``spared`` gets (kernel, repeats not run) for each that stopped early. ``kinds``
    keeps only those kernels (e.g. ("attention_fwd",)): the others are neither prepared nor timed. ``choice``: the
    block-kernel choice to use and add to (a fresh one from the environment by default)."""
    blocks, heads, gemm_rows, shapes = _checked_sweep(model, blocks, heads, gemm_rows, shapes, dtype)
    device = torch.device(device)
    name = _DTYPE_NAMES.get(dtype, str(dtype))
    gen = torch.Generator(device="cpu").manual_seed(0)
    rnd = lambda *s: torch.randn(*s, generator=gen).to(device=device, dtype=dtype)  # noqa: E731
    choice = choice if choice is not None else BackendChoice.from_env()
    groups = sweep_groups(blocks, heads, gemm_rows if gemm_rows is not None else blocks, shapes)
    started, forecast = clock(), forecast if forecast is not None else Forecast()
    said = tick or (lambda advanced, message: None)
    least = 1 + (settings.window_min_calls if windows is not None else repeats + 1)  # preparing, then timing
    jobs: list[tuple[Callable[[], object], dict]] = []  # (the kernel, its sample's fields but the seconds)
    firsts: list[float] = []  # each job's first call, where windows are agreed from them
    for g in groups:
        flops = group_flops(model, g, causal)
        if budget_s is not None and forecast.rate and \
                _agreed(clock() - started + least * forecast.seconds(g, flops), True) > budget_s:
            (skipped if skipped is not None else []).append(g)
            continue
        t0 = clock()
        new = _attention_jobs(model, g[1], g[2], rnd, choice, causal) if g[0] == "attention" else \
            _gemm_jobs(model, g[1], rnd)
        new = [job for job in new if kinds is None or job[1]["kind"] in kinds]
        jobs += new
        firsts += [_first_call(fn, device) for fn, _ in new] if windows is not None else []
        forecast.learn(g, flops, clock() - t0)
        said(True, f"prepared {shown_group(g)}")
    if windows is None:
        return [_timed(fn, f, device, repeats, name, settings.kernel_agree, spared, said) for fn, f in jobs]
    if callable(windows):
        left = None if budget_s is None else max(budget_s - _agreed(clock() - started, True), 0.0)
        start, lengths = windows(firsts) if left is None else windows(firsts, total_s=left)
    else:
        start, lengths = windows[0], [windows[1]] * len(jobs)
    return _windowed(jobs, lengths, start, device, name, said)


def _sizes(field: str, values) -> list[int]:
    """``values`` as whole numbers of at least 1, else a PlanError naming ``field`` (a 0-token block would divide by
    zero inside the attention kernel)."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise PlanError(field, f"{type(values).__name__} is no list of sizes", f"pass {field} as a list, e.g. [1024]")
    return [whole_number(f"{field}[{i}]", v, 1, f"give {field} of 1 or more") for i, v in enumerate(values)]


def _checked_sweep(model, blocks, heads, gemm_rows, shapes, dtype) -> tuple:
    """``measure_kernels``' sizes and dtype checked before any kernel runs: (blocks, heads, gemm_rows, shapes)."""
    of_type("model", model, ModelSpec, "sp_plan.load_model(name or file)")
    of_type("dtype", dtype, torch.dtype, "a torch.dtype such as torch.bfloat16")
    blocks, heads = _sizes("blocks", blocks), _sizes("heads", heads)
    gemm_rows = None if gemm_rows is None else _sizes("gemm_rows", gemm_rows)
    if shapes is not None:
        shapes = [tuple(_sizes(f"shapes[{i}]", s)) for i, s in enumerate(shapes)]
    return blocks, heads, gemm_rows, shapes


def _windowed(jobs: list, lengths: list[float], start: float, device: torch.device, dtype: str,
              said: Callable[[bool, str], None]) -> list[KernelSample]:
    """Each job back to back through its window (``timing.time_window``), the windows laid end to end from
    ``start``."""
    out: list[KernelSample] = []
    for (fn, fields), each in zip(jobs, lengths):
        t = time_window(fn, device, start, start + 0.9 * each)
        start += each
        out.append(KernelSample(seconds=t, dtype=dtype, batch=1, **fields))
        said(False, f"timed {shown_kernel(fields)}")
    return out


def _timed(fn: Callable[[], object], fields: dict, device: torch.device, repeats: int, dtype: str,
           agree_within: float | None, spared: list | None, said: Callable[[bool, str], None]) -> KernelSample:
    """One kernel timed by this rank: the median of its readings, up to ``repeats`` (fewer where they agree)."""
    got = time_readings(fn, device, repeats, agree_within=agree_within)
    if len(got) < repeats and spared is not None:
        spared.append((shown_kernel(fields), repeats - len(got)))
    said(False, f"timed {shown_kernel(fields)}")
    return KernelSample(seconds=statistics.median(got), dtype=dtype, batch=1, **fields)


def spared_said(spared: list, repeats: int, agree_within: float | None) -> str | None:
    """What the kernel step left untimed where a kernel's readings agreed, in a line (None where nothing)."""
    if not spared or agree_within is None:
        return None
    kernels = len({k for k, _ in spared})
    return (f"{sum(n for _, n in spared)} kernel timing(s) of {kernels} kernel(s) not repeated: their readings "
            f"agreed within {agree_within:.0%} before {repeats} repeats")


def shown_kernel(fields: dict) -> str:
    """A kernel as said: "attention_bwd of 4096-token causal blocks on 8 heads", "matmul 1024 x 4096 x 1024"."""
    if fields["kind"] == "matmul":
        return "matmul " + " x ".join(str(x) for x in fields["gemm"])
    return (f"{fields['kind']} of {fields['size']}-token {'causal' if fields['causal'] else 'dense'} blocks on "
            f"{fields['heads']} heads")


def shown_group(g: tuple) -> str:
    """A sweep group as said: "4096-token blocks on 8 heads", "GEMMs of 1024 rows", "the solo-speedup timing"."""
    if g[0] == "attention":
        return f"{g[1]}-token blocks on {g[2]} heads"
    return f"GEMMs of {g[1]} rows" if g[0] == "matmul" else f"the {g[0]} timing"


def _first_call(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds of one untimed-before call (allocations, a backward's workspace), before any window opens."""
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def shared_windows(firsts: list[float], calls: int = SETTINGS.window_calls, least: float = SETTINGS.window_min_s,
                   total_s: float | None = None, fewest: int = SETTINGS.window_min_calls, span: float | None = None,
                   spared: list | None = None) -> tuple[float, list[float]]:
    """One start (50 ms from now, rank 0's clock) and a window per kernel, ``calls`` times the slowest rank's first
    call of it and at least ``least`` seconds, agreed by every rank of the default group (collective): where ranks
    share cores each kernel is timed while all of them compute it (a median of calls each rank makes when it gets
    there mixes kernels timed alone, fast, with kernels timed among busy peers). With ``span`` a window holds no
    more calls than fill ``span`` seconds (``fewest`` at least): a kernel whose calls take longer needs fewer, its
    calls not run go to ``spared`` as (kernel's index, calls). With ``total_s`` the calls shrink (to ``fewest`` at
    least) until the windows together fit it."""
    import torch.distributed as dist

    slowest = torch.tensor(firsts, dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    shared = [time.time() + 0.05]
    if dist.is_initialized():
        dist.broadcast_object_list(shared, src=0)
    each = [calls if not span or t <= 0 else max(fewest, min(calls, math.ceil(span / float(t)))) for t in slowest]
    if spared is not None:
        spared.extend((i, calls - c) for i, c in enumerate(each) if c < calls)
    if total_s is not None and float(slowest.sum()) > 0:
        calls = max(fewest, min(calls, int(total_s / float(slowest.sum()))))
    return float(shared[0]), [max(least, min(c, calls) * float(t)) for c, t in zip(each, slowest)]


def spanned_said(spared: list, calls: int, span: float | None) -> str | None:
    """What the shared windows left out where a kernel's calls are long, in a line (None where nothing)."""
    if not spared or not span:
        return None
    return (f"{sum(n for _, n in spared)} window call(s) of {len(spared)} kernel(s) not run: a window holds at most "
            f"{span:g} s of calls, and theirs take over {span / calls:.2g} s each")


def _shape(plan: Plan, model: ModelSpec, work: Workload):
    from sp_plan.planner.schedules import Shape

    d = plan.degrees
    return Shape(model, work, d["dp"], d["ulysses"], d["ring"], plan.token_layout, d["tp"], d["pp"],
                 plan.micro_batch_size, plan.algorithm, d.get("team", 1), plan.placement)


def plan_shapes(plan: Plan, model: ModelSpec, work: Workload) -> list[tuple[int, int]]:
    """(block length, head count) pairs one candidate's attention runs on (``kernel_shapes``), largest block first."""
    from sp_plan.planner.schedules import attention_steps

    c = _shape(plan, model, work)
    h = max(1, int(round(model.heads / plan.degrees["tp"] if plan.algorithm == "metp" else c.heads_local)))
    blocks = set()
    for backward in (False, True):
        for step in attention_steps(c, backward):
            for ph in step.phases:
                if getattr(ph, "kind", "") == "attention" and ph.block:
                    blocks.add(int(round(ph.block)))
                    if plan.token_layout == "zigzag":
                        blocks.add(max(1, int(round(ph.block / 2))))
    return [(n, h) for n in sorted(blocks, reverse=True)]


def kernel_shapes(plans: list[Plan], model: ModelSpec, work: Workload) -> tuple[list[int], list[int]]:
    """Block lengths and head counts the candidates' attention runs on (read off the planner's schedules).

    Ring/Ulysses/USP/TokenRing: one ring block seq/ring on heads/(tp ulysses) heads; zigzag also its
    halves seq/(2 ring) (the runtime computes the two chunks separately); WallFacer: team blocks
    C seq/ring; METP: seq/tp on heads/tp heads. Block lengths are rounded to whole tokens.
    """
    for i, p in enumerate(plans):
        of_type(f"plans[{i}]", p, Plan, "the candidates as Plans (Plan.model_validate(mapping) for a mapping)")
    of_type("model", model, ModelSpec, "sp_plan.load_model(name or file)")
    of_type("work", work, Workload, "an sp_plan.Workload")
    pairs = [s for p in plans for s in plan_shapes(p, model, work)]
    return sorted({n for n, _ in pairs}), sorted({h for _, h in pairs})


def kernel_priority(plans: list[Plan], model: ModelSpec, work: Workload) -> list[tuple[int, int]]:
    """The (block, heads) pairs of ``plans`` (the model's best first) in the order a budgeted sweep times them:
    each plan's shapes before the next plan's, so a trimmed sweep keeps what the likeliest candidates run."""
    return _unique(s for p in plans for s in plan_shapes(p, model, work))


def token_rows(plans: list[Plan], work: Workload) -> list[int]:
    """GEMM rows the candidates' linear layers run on: tokens per rank per micro-batch (mbs x seq / sp; METP: / tp)."""
    rows = set()
    for p in plans:
        split = p.degrees["tp"] if p.algorithm == "metp" else p.sp
        rows.add(max(1, p.micro_batch_size * work.seq_len // split))
    return sorted(rows)


def chosen_backends(samples: list[dict]) -> str:
    """The attention backend(s) the kernel samples ran on (the first rank's), e.g. "cpu_flash" or
    "math for 64-token blocks, cpu_flash for 128, 4096-token blocks"; where blocks were timed both under the causal
    mask and without it, each group says which ("... 256-token causal blocks, math for 256-token dense blocks")."""
    att = [s for s in samples if s["kind"] == "attention_fwd" and s.get("rank", 0) == samples[0].get("rank", 0)]
    both = len({bool(s.get("causal")) for s in att}) > 1
    by: dict[tuple[str, str], list[int]] = {}
    for s in sorted(att, key=lambda s: (not s.get("causal"), s["size"])):
        by.setdefault((s["backend"], (" causal" if s.get("causal") else " dense") if both else ""), []).append(s["size"])
    if len({b for b, _ in by}) <= 1:
        return next(iter(by), ("", ""))[0]
    return ", ".join(f"{b} for {', '.join(str(x) for x in sorted(set(n)))}-token{m} blocks" for (b, m), n in by.items())
