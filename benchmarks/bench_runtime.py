"""Time every attention variant of the runtime on a local gloo world (a script, not a test).

    python benchmarks/bench_runtime.py [--world 4] [--seq 4096] [--heads 8] [--head-dim 64]

Prints, per variant, the step time of forward and of forward+backward (slowest rank, median over
steps; variants interleaved step by step) with that rank's split into compute (block kernels and merges), exposed communication (time blocked
in p2p waits and all-to-alls, which on an oversubscribed CPU also absorbs waiting for a peer that
is still computing) and the rest (packing copies, autograd, Python); the world-1 overhead of
``attention`` against plain ``F.scaled_dot_product_attention``; and, if ``yunchang`` is
importable, yunchang 0.6.4's ``LongContextAttention`` (TORCH_MATH backend, USP 2x2, forward,
non-causal) timed in the same world, alternating step by step with ours, with the ratio.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from sp_plan.planner.layout import Layout
from sp_plan.runtime import kernels
from sp_plan.runtime.variants import ring as ring_mod, ulysses as ulysses_mod
from sp_plan.runtime.attention import attention
from harness.worlds import run_world

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


# ---------------------------------------------------------------- compute / communication timers

class Split:
    """Seconds spent in compute and in exposed communication since the last reset."""

    def __init__(self):
        self.compute = self.comm = 0.0

    def reset(self):
        self.compute = self.comm = 0.0


SPLIT = Split()


def _timed(fn, kind):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            setattr(SPLIT, kind, getattr(SPLIT, kind) + time.perf_counter() - t0)
    return wrapper


class _TimedWork:
    def __init__(self, work):
        self.work = work

    def wait(self):
        t0 = time.perf_counter()
        try:
            return self.work.wait()
        finally:
            SPLIT.comm += time.perf_counter() - t0


def instrument() -> None:
    """Wrap the block kernels, the merge, p2p waits and all-to-alls with timers (in this process)."""
    for mod in (kernels, ring_mod):
        for name in ("block_attention", "block_attention_backward", "merge"):
            if hasattr(mod, name):
                setattr(mod, name, _timed(getattr(mod, name), "compute"))
    shift = ring_mod.Ring.shift

    def timed_shift(self, send, recv, tag):
        t0 = time.perf_counter()
        works = [_TimedWork(w) for w in shift(self, send, recv, tag)]
        SPLIT.comm += time.perf_counter() - t0
        return works
    ring_mod.Ring.shift = timed_shift
    ulysses_mod.all_to_all = _timed(ulysses_mod.all_to_all, "comm")


# ---------------------------------------------------------------- variants

def variants(world: int) -> list[dict]:
    """Every variant valid on ``world`` ranks: ring x layouts, Ulysses, USP x placements x layouts."""
    out = [dict(name=f"ring {t}", algorithm="ring", degrees={"ring": world}, order=("ring",), layout=t)
           for t in ("contiguous", "zigzag", "striped")]
    out.append(dict(name="ulysses", algorithm="ulysses", degrees={"ulysses": world}, order=("ulysses",),
                    layout="contiguous"))
    u = 2 if world % 2 == 0 and world > 2 else 0
    if u:
        r = world // u
        for order in (("ulysses", "ring"), ("ring", "ulysses")):
            for t in ("contiguous", "zigzag", "striped"):
                out.append(dict(name=f"usp {u}x{r} {order[0]}-inner {t}", algorithm="usp",
                                degrees={"ulysses": u, "ring": r}, order=order, layout=t))
    return out


def _full_inputs(args):
    """Global q, k, v, dout (float64), the same on every rank."""
    g = torch.Generator().manual_seed(0)
    shape_q = (args.batch, args.seq, args.heads, args.head_dim)
    shape_kv = (args.batch, args.seq, args.kv_heads, args.head_dim)
    return [torch.randn(s, generator=g, dtype=torch.float64) for s in (shape_q, shape_kv, shape_kv, shape_q)]


def _inputs(args, rank, layout: Layout, dtype, requires_grad):
    """This rank's tokens of the global inputs, in the layout's local order."""
    tok = torch.as_tensor(np.array(layout.tokens(rank, args.seq)))
    return [x[:, tok].to(dtype).contiguous().requires_grad_(requires_grad and i < 3)
            for i, x in enumerate(_full_inputs(args))]


def _groups(layout: Layout, rank: int, made: dict) -> tuple[dict, dict]:
    pg, ranks = {}, {}
    for dim in ("ulysses", "ring"):
        if layout.degree(dim) > 1:
            pg[dim] = made[tuple(layout.group_of(dim, rank))]
            if dim == "ring":
                ranks["ring"] = layout.group_of("ring", rank)
    return pg, ranks


def _make_all_groups(world: int, vs: list[dict]) -> dict:
    made = {tuple(range(world)): dist.group.WORLD}
    for v in vs:
        lay = Layout(v["degrees"], v["order"], v["layout"])
        for dim in ("ulysses", "ring"):
            for g in lay.groups(dim):
                if len(g) > 1 and tuple(g) not in made:
                    made[tuple(g)] = dist.new_group(list(g))
    return made


def _step(fn, backward_of=None):
    """One timed step on this rank, started together with the world; returns (seconds, compute, comm)."""
    dist.barrier()
    SPLIT.reset()
    t0 = time.perf_counter()
    out = fn()
    if backward_of is not None:
        out.backward(backward_of)
    return time.perf_counter() - t0, SPLIT.compute, SPLIT.comm


def _bench_child(rank, world, args, vs):
    """All variants, interleaved step by step, so that drifting machine load hits them alike."""
    torch.manual_seed(0)
    instrument()
    made = _make_all_groups(world, vs)
    dtype = DTYPES[args.dtype]
    runs = []
    for v in vs:
        lay = Layout(v["degrees"], v["order"], v["layout"])
        pg, ranks = _groups(lay, rank, made)
        q, k, vv, do = _inputs(args, rank, lay, dtype, True)
        for causal in args.causal:
            def run(q=q, k=k, vv=vv, pg=pg, ranks=ranks, v=v, causal=causal):
                return attention(q, k, vv, algorithm=v["algorithm"], groups=pg, ranks=ranks, causal=causal,
                                 token_layout=v["layout"])
            runs.append(((v["name"], causal), run, (q, k, vv), do))
    res = {(key, mode): [] for key, *_ in runs for mode in ("fwd", "fwd+bwd")}
    for i in range(args.warmup + args.steps):
        for key, run, leaves, do in runs:
            with torch.no_grad():
                fwd = _step(run)
            both = _step(run, do)
            for x in leaves:
                x.grad = None
            if i >= args.warmup:
                res[(key, "fwd")].append(fwd)
                res[(key, "fwd+bwd")].append(both)
    if args.yunchang and world == 4:
        res["yunchang"] = _bench_yunchang(rank, world, args, made, dtype)
    return res


def _bench_yunchang(rank, world, args, made, dtype):
    """yunchang LongContextAttention (TORCH_MATH, USP 2x2 ulysses-low, non-causal, fwd) vs ours."""
    from yunchang import LongContextAttention, set_seq_parallel_pg
    from yunchang.kernels import AttnType

    set_seq_parallel_pg(2, 2, rank, world, use_ulysses_low=True)
    yc = LongContextAttention(ring_impl_type="basic", attn_type=AttnType.TORCH_MATH)
    lay = Layout({"ulysses": 2, "ring": 2}, ("ulysses", "ring"), "contiguous")
    pg, ranks = _groups(lay, rank, made)
    q, k, v, _ = _inputs(args, rank, lay, dtype, False)
    full_q, full_k, full_v, _ = _full_inputs(args)
    mine = torch.as_tensor(np.array(lay.tokens(rank, args.seq)))
    ref = F.scaled_dot_product_attention(full_q[:, mine].transpose(1, 2), full_k.transpose(1, 2), full_v.transpose(1, 2),
                                         enable_gqa=True).transpose(1, 2)
    ours_t, yc_t = [], []
    with torch.no_grad():
        ours_out = attention(q, k, v, algorithm="usp", groups=pg, ranks=ranks, causal=False,
                             token_layout="contiguous")
        yc_out = yc(q, k, v, causal=False)
        for i in range(args.warmup + args.steps):
            a = _step(lambda: attention(q, k, v, algorithm="usp", groups=pg, ranks=ranks, causal=False,
                                        token_layout="contiguous"))
            b = _step(lambda: yc(q, k, v, causal=False))
            if i >= args.warmup:
                ours_t.append(a)
                yc_t.append(b)
    err = {name: (o.double() - ref).abs().max().item() for name, o in (("ours", ours_out), ("yunchang", yc_out))}
    return {"ours": ours_t, "yunchang": yc_t, "max_abs_err": err}


# ---------------------------------------------------------------- world 1 vs plain SDPA

def _bench_world1(rank, world, args):
    dtype = DTYPES[args.dtype]
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(args.batch, args.seq, args.heads, args.head_dim, generator=g).to(dtype)
                   for _ in range(4))
    res = {}
    for mode in ("fwd", "fwd+bwd"):
        for x in (q, k, v):
            x.requires_grad_(mode != "fwd")

        def ours():
            return attention(q, k, v, algorithm="usp", groups={}, ranks=None, causal=False,
                             token_layout="contiguous")

        def sdpa():
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                  v.transpose(1, 2)).transpose(1, 2)
        times = {"ours": [], "sdpa": []}
        for i in range(args.warmup + args.world1_reps):
            for name, fn in (("ours", ours), ("sdpa", sdpa)) if i % 2 == 0 else (("sdpa", sdpa), ("ours", ours)):
                t0 = time.perf_counter()
                if mode == "fwd":
                    with torch.no_grad():
                        fn()
                else:
                    fn().backward(do)
                    q.grad = k.grad = v.grad = None
                if i >= args.warmup:
                    times[name].append(time.perf_counter() - t0)
        res[mode] = {n: statistics.median(t) for n, t in times.items()}
    return res


# ---------------------------------------------------------------- report

def _summary(per_rank: list[list[tuple]]) -> tuple[float, float, float]:
    """Median over steps of the slowest rank's (time, compute, comm) in that step."""
    steps = list(zip(*per_rank))  # per step: one (t, compute, comm) per rank
    rows = sorted(max(s) for s in steps)
    return rows[len(rows) // 2]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", choices=list(DTYPES), default="float32")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--world1-reps", type=int, default=5)
    p.add_argument("--causal", choices=["both", "causal", "full"], default="both")
    p.add_argument("--only", default=None, help="run only variants whose name contains this")
    p.add_argument("--no-yunchang", action="store_true")
    p.add_argument("--skip-world1", action="store_true")
    args = p.parse_args(argv)
    args.kv_heads = args.kv_heads or args.heads
    args.causal = {"both": (False, True), "causal": (True,), "full": (False,)}[args.causal]
    try:
        import yunchang  # noqa: F401
        args.yunchang = not args.no_yunchang
    except ImportError:
        args.yunchang = False

    print(f"# world {args.world}, seq {args.seq}, batch {args.batch}, heads {args.heads} (kv {args.kv_heads}), "
          f"head dim {args.head_dim}, {args.dtype}; gloo on {torch.get_num_threads()}-thread parent, "
          f"1 thread per rank; {args.steps} steps after {args.warmup} warm-up")
    if not args.skip_world1:
        w1 = run_world(_bench_world1, 1, args, timeout=1800)[0]
        print("\n## world 1: attention() vs F.scaled_dot_product_attention (median seconds)")
        for mode, r in w1.items():
            print(f"{mode:8s} ours {r['ours']:.4f}  sdpa {r['sdpa']:.4f}  overhead {100 * (r['ours'] / r['sdpa'] - 1):+.1f}%")

    vs = [v for v in variants(args.world) if args.only is None or args.only in v["name"]]
    res = run_world(_bench_child, args.world, args, vs, timeout=1800)
    print(f"\n## world {args.world}: step time of the slowest rank (ms) and its compute / exposed comm / other")
    print(f"{'variant':34s} {'mask':6s} {'mode':8s} {'step':>8s} {'compute':>8s} {'comm':>8s} {'other':>8s}")
    for v in vs:
        for causal in args.causal:
            for mode in ("fwd", "fwd+bwd"):
                t, comp, comm = _summary([r[((v["name"], causal), mode)] for r in res])
                print(f"{v['name']:34s} {'causal' if causal else 'full':6s} {mode:8s} {1e3 * t:8.1f} "
                      f"{1e3 * comp:8.1f} {1e3 * comm:8.1f} {1e3 * (t - comp - comm):8.1f}")
    if "yunchang" in res[0]:
        ours = _summary([r["yunchang"]["ours"] for r in res])
        theirs = _summary([r["yunchang"]["yunchang"] for r in res])
        err = {n: max(r["yunchang"]["max_abs_err"][n] for r in res) for n in ("ours", "yunchang")}
        print("\n## USP 2x2 forward, non-causal: ours vs yunchang 0.6.4 LongContextAttention (TORCH_MATH)")
        print(f"ours {1e3 * ours[0]:.1f} ms   yunchang {1e3 * theirs[0]:.1f} ms   ratio ours/yunchang "
              f"{ours[0] / theirs[0]:.2f}")
        print(f"max |error| against float64 SDPA on the full sequence: ours {err['ours']:.2g}, "
              f"yunchang {err['yunchang']:.2g}")
    elif args.world == 4:
        print("\n(yunchang not importable or disabled: no comparison)")


if __name__ == "__main__":
    main()
