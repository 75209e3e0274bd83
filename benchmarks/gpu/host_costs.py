"""Host time of one degree-1 attention call on the CPU, where tiny blocks make the kernels cost little (a script).

Forward + backward of 1,000 calls back to back, median of 7 rounds, interleaved: ``ctx.attention`` through a
world-1 ``init(plan)``, ``runtime.kernels.local_attention`` alone, SDPA from (batch, seq, heads, dim) with its
transposes in the call, and plain SDPA on (batch, heads, seq, dim). The differences are the plan's dispatch, the
backend hold and the layout, which the GPU's per-call readings carry (docs/benchmarks/gpu.md).

    python benchmarks/gpu/host_costs.py [--calls 1000] [--rounds 7]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from sp_plan.planner.plan import Plan
from sp_plan.runtime import init
from sp_plan.runtime.kernels import local_attention

def _calls(ctx) -> dict:
    """The four calls, each one forward and backward on the same tiny GQA block."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 16, h, 8, generator=g, requires_grad=True) for h in (4, 2, 2))
    do = torch.randn(1, 16, 4, 8, generator=g)
    qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
    dot = do.transpose(1, 2)
    return {
        "ctx.attention": lambda: ctx.attention(q, k, v, causal=True).backward(do),
        "local_attention": lambda: local_attention(q, k, v, causal=True, backend="cpu_flash").backward(do),
        "sdpa, transposes in the call": lambda: F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
            enable_gqa=True).transpose(1, 2).backward(do),
        "sdpa": lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True).backward(dot),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=1000, help="calls back to back in one reading")
    p.add_argument("--rounds", type=int, default=7, help="readings of each call, interleaved (the median is printed)")
    args = p.parse_args(argv)
    dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/init", rank=0, world_size=1)
    torch.set_num_threads(1)
    calls = _calls(init(Plan(algorithm="ring", degrees={"ring": 1}, order=["ring"]), device_type="cpu"))
    us = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, fn in calls.items():
            for _ in range(max(args.calls // 10, 1)):
                fn()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn()
            us[name].append((time.perf_counter() - t0) / args.calls * 1e6)
    for name, xs in us.items():
        print(f"{name:30s} {statistics.median(xs):7.1f} us a call (forward + backward)")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
