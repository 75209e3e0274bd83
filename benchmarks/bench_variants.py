"""Per-step time of every attention variant through `init(plan)` and `ctx.attention` (a script, not a test).

    python benchmarks/bench_variants.py [--worlds 4,8] [--seq 4096] [--heads 8] [--head-dim 64] [--steps 5]

For each world size it runs one gloo world and times, interleaved step by step, forward + backward
of Ring, TokenRing, TokenRing x Ring (team 2), WallFacer (C = 2, both placements where C^2 divides
the ring) and USP, causal with the zigzag layout, float32; plus METP's MHA and FFN modules against
a Ring MHA layer of the same size. Prints the median step (slowest rank) and the ratio to Ring.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from sp_plan.planner import Plan
from sp_plan.runtime import init
from harness.worlds import run_world


def plans(world: int) -> dict[str, Plan]:
    out = {"ring": Plan(algorithm="ring", degrees={"ring": world}, order=["ring"], token_layout="zigzag"),
           "tokenring": Plan(algorithm="tokenring", degrees={"ring": world}, order=["ring"], token_layout="zigzag"),
           "tokenring_ring team2": Plan(algorithm="tokenring_ring", degrees={"ring": world, "team": 2}, order=["ring"],
                                        token_layout="zigzag"),
           "usp u2": Plan(algorithm="usp", degrees={"ulysses": 2, "ring": world // 2}, order=["ulysses", "ring"],
                          token_layout="zigzag")}
    if world % 4 == 0:
        for pl in ("collective_intra", "p2p_intra"):
            out[f"wallfacer C2 {pl}"] = Plan(algorithm="wallfacer", degrees={"ring": world, "team": 2}, order=["ring"],
                                             token_layout="zigzag", placement=pl)
    return out


def _bench(rank, world, seq, heads, head_dim, steps):
    torch.manual_seed(0)
    b = 1
    q, k, v, dout = (torch.randn(b, seq, heads, head_dim) for _ in range(4))
    ctxs = {name: init(p) for name, p in plans(world).items()}
    local = {name: [c.shard(x) for x in (q, k, v, dout)] for name, c in ctxs.items()}
    times = {name: [] for name in ctxs}
    for step in range(steps + 1):
        for name, c in ctxs.items():
            ql, kl, vl, dl = (x.clone().requires_grad_(i < 3) for i, x in enumerate(local[name]))
            dist.barrier()
            t0 = time.perf_counter()
            c.attention(ql, kl, vl, causal=True).backward(dl)
            dist.barrier()
            if step:
                times[name].append(time.perf_counter() - t0)
    out = {name: statistics.median(t) for name, t in times.items()}
    out.update(_bench_metp(rank, world, seq, heads, head_dim, steps))
    return out


def _bench_metp(rank, world, seq, heads, head_dim, steps):
    """METP MHA and FFN modules (tokens split over the world) vs a Ring MHA layer with full weights."""
    from sp_plan.runtime.variants.metp import METPAttention, METPFeedForward
    from sp_plan.runtime.variants.ring import ring_attention

    hidden = heads * head_dim
    torch.manual_seed(1)
    x = torch.randn(1, seq // world, hidden)
    mha = METPAttention(hidden, heads, causal=True, token_layout="contiguous")
    ffn = METPFeedForward(hidden, 4 * hidden)
    w_qkv, w_o = torch.randn(hidden, 3 * hidden) * hidden ** -0.5, torch.randn(hidden, hidden) * hidden ** -0.5

    def ring_mha(xl):
        qkv = (xl @ w_qkv).view(1, -1, 3 * heads, head_dim)
        q, k, v = qkv.split(heads, dim=2)
        return ring_attention(q, k, v, None, causal=True).reshape(1, -1, hidden) @ w_o

    fns = {"ring MHA layer": ring_mha, "metp MHA": mha, "metp FFN": ffn}
    times = {n: [] for n in fns}
    for step in range(steps + 1):
        for name, fn in fns.items():
            xl = x.clone().requires_grad_()
            dist.barrier()
            t0 = time.perf_counter()
            fn(xl).sum().backward()
            dist.barrier()
            if step:
                times[name].append(time.perf_counter() - t0)
    return {n: statistics.median(t) for n, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="4,8")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    for world in (int(w) for w in args.worlds.split(",")):
        res = run_world(_bench, world, args.seq, args.heads, args.head_dim, args.steps, timeout=1200)
        slowest = {n: max(r[n] for r in res) for n in res[0]}
        print(f"world {world}, seq {args.seq}, {args.heads} heads x {args.head_dim}, causal zigzag, fwd+bwd, float32:")
        for n, t in slowest.items():
            ref = slowest["ring MHA layer"] if n.startswith("metp") else slowest["ring"]
            print(f"  {n:<32} {t * 1e3:9.1f} ms   x{t / ref:.2f} of {'ring MHA layer' if n.startswith('metp') else 'ring'}")


if __name__ == "__main__":
    main()
