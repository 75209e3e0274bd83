"""What the fused attention ops of this torch build take, and where world-1 ``ctx.attention`` spends its time.

    python benchmarks/gpu/probe_ops.py [--seq 8192] [--heads 32] [--kv-heads 8] [--head-dim 128] [--trace DIR]

1. Each fused op's schema here beside the one ``runtime.backends`` was written for (``backends.SCHEMAS``).
2. Whether cuDNN's and flash's SDPA ops take K/V with fewer heads than Q (GQA) as they are, forward and
   backward, against float64; and their forward + backward time with K/V as they are against K/V repeated
   to Q's heads (what ``kernels`` does for a backend without ``gqa``).
3. A profiler table of world-1 ``init(plan)`` + ``ctx.attention`` forward + backward beside plain
   ``scaled_dot_product_attention`` (causal, GQA, bfloat16): the kernels each launches and their time.
"""
from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F

from sp_plan.profiles.tune.timing import time_call
from sp_plan.runtime import backends as B
from sp_plan.runtime.kernels import _repeat_kv, _reduce_kv


def schemas() -> None:
    print("## op schemas (expected: runtime.backends.SCHEMAS)")
    for op, want in B.SCHEMAS.items():
        try:
            have = str(getattr(torch.ops.aten, op).default._schema)
        except (AttributeError, RuntimeError) as e:
            print(f"{op}: MISSING ({e})")
            continue
        print(f"{op}: {'as expected' if have == want else 'DIFFERS: ' + have}")


def _native(name: str, q, k, v, do, scale):
    """Forward + backward of backend ``name`` on K/V with fewer heads, no repeat."""
    be = B.get(name)
    o, lse = be.forward(q, k, v, scale, True, None)
    return (o, lse, *be.backward(do, q, k, v, o, lse, scale, True, None))


def _repeated(name: str, q, k, v, do, scale):
    be = B.get(name)
    h, kv = q.shape[2], k.shape[2]
    kr, vr = _repeat_kv(k, h), _repeat_kv(v, h)
    o, lse = be.forward(q, kr, vr, scale, True, None)
    dq, dk, dv = be.backward(do, q, kr, vr, o, lse, scale, True, None)
    return o, lse, dq, _reduce_kv(dk, kv), _reduce_kv(dv, kv)


def gqa(args, device) -> None:
    print("\n## native GQA in the fused ops (causal, bfloat16): relative error of the native call against the "
          "repeated-K/V call, and fwd+bwd ms")
    for n in args.gqa_seqs:
        gqa_at(n, args, device)


def gqa_at(n: int, args, device) -> None:
    g = torch.Generator().manual_seed(0)
    d = args.head_dim
    x = [torch.randn(1, n, h, d, generator=g).to(device, torch.bfloat16)
         for h in (args.heads, args.kv_heads, args.kv_heads, args.heads)]
    scale = d ** -0.5
    for name in ("cudnn", "flash"):
        why = B.get(name).unavailable(device.type, torch.bfloat16, d)
        if why:
            print(f"{name}: unavailable: {why}")
            continue
        try:
            nat = _native(name, *x, scale)
        except Exception as e:  # noqa: BLE001 - the answer is that it does not take GQA
            print(f"S={n} {name}: native GQA FAILED: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            continue
        rep = _repeated(name, *x, scale)
        errs = [float((a.float() - b.float()).norm() / b.float().norm()) for a, b in zip(nat, rep)]
        t_nat = time_call(lambda: _native(name, *x, scale), device, 5)
        t_rep = time_call(lambda: _repeated(name, *x, scale), device, 5)
        print(f"S={n} {name}: native GQA runs; rel diff out/lse/dq/dk/dv "
              + " ".join(f"{e:.1e}" for e in errs) + f"; fwd+bwd native {1e3 * t_nat:.2f} ms, repeated "
              f"{1e3 * t_rep:.2f} ms")


def profile(args, device) -> None:
    from torch.profiler import ProfilerActivity, profile as prof

    from sp_plan.planner import Plan
    from sp_plan.runtime import init

    print(f"\n## profiler: world-1 ctx.attention vs SDPA, S={args.seq}, causal, {args.heads}/{args.kv_heads} heads")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29534")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            init_method=f"file://{tempfile.mkdtemp()}/init", rank=0, world_size=1)
    ctx = init(Plan(algorithm="ring", degrees={"ring": 1}, order=["ring"]), device_type=device.type)
    g = torch.Generator().manual_seed(1)
    q, k, v, do = (torch.randn(1, args.seq, h, args.head_dim, generator=g).to(device, torch.bfloat16)
                   for h in (args.heads, args.kv_heads, args.kv_heads, args.heads))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    dot = do.transpose(1, 2)
    ours = lambda: ctx.attention(q, k, v, causal=True).backward(do)  # noqa: E731
    sdpa = lambda: F.scaled_dot_product_attention(  # noqa: E731
        qt, kt, vt, is_causal=True, enable_gqa=True).backward(dot)
    for name, fn in (("ctx.attention", ours), ("sdpa", sdpa)):
        fn()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with prof(activities=acts) as p:
            for _ in range(3):
                fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
        key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
        print(f"### {name} ({ctx.attention_backend if name != 'sdpa' else 'default dispatch'}), 3 calls")
        print(p.key_averages().table(sort_by=key, row_limit=14, max_name_column_width=60))
        if args.trace:
            p.export_chrome_trace(os.path.join(args.trace, f"trace-{name}.json"))
    dist.destroy_process_group()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--trace", default=None, help="also write chrome traces into this folder")
    p.add_argument("--gqa-seqs", default="4096,16384,65536", help="sequence lengths of the native-GQA timing")
    args = p.parse_args(argv)
    args.gqa_seqs = [int(x) for x in args.gqa_seqs.split(",")]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"# {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
    schemas()
    if device.type == "cuda":
        gqa(args, device)
    profile(args, device)


if __name__ == "__main__":
    main()
