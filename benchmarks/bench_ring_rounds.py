"""What a ring round costs where ranks share cores, by variant and token layout (a script, not a test).

    python benchmarks/bench_ring_rounds.py [--world 4] [--seqs 64,1024,4096] [--iters 5]

Ring and TokenRing attention (runtime/variants/ring.py, runtime/variants/tokenring.py), causal, contiguous and zigzag,
forward + backward through 8 layers of tiny-llama's attention shape (8 query heads, 4 KV heads, 32 wide,
fp32) on a local gloo world (benchmarks/harness/worlds.py), every rank one thread: the median over ``--iters`` timed
runs, after two, of rank 0's wall time between barriers. At a few tokens the blocks cost next to nothing
and what is left is the rounds' fixed cost: launching the block, the merge, posting and waiting for the
messages. On a contiguous causal ring most ranks skip most blocks; if the fixed cost were the skipped
calls' own work it would shrink with them, if it is the rounds' messages and the waits it would not.
The cost model prices a round's fixed cost per attention call, split with the round's balance where
ranks share cores (``Estimator.calls``); this measures what a round costs instead.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from sp_plan.runtime.variants.ring import ring_attention
from harness.worlds import run_world
from sp_plan.runtime.variants.tokenring import tokenring_attention

VARIANTS = {"ring": ring_attention, "tokenring": tokenring_attention}
LAYOUTS = ("contiguous", "zigzag")
LAYERS = 8


def _bench(rank: int, world: int, seq: int, algo: str, layout: str, iters: int) -> float:
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    n = seq // world
    q = torch.randn(1, n, 8, 32, requires_grad=True)
    k = torch.randn(1, n, 4, 32, requires_grad=True)
    v = torch.randn(1, n, 4, 32, requires_grad=True)
    fn = VARIANTS[algo]
    times = []
    for _ in range(iters + 2):
        dist.barrier()
        t = time.perf_counter()
        for _ in range(LAYERS):
            fn(q, k, v, causal=True, token_layout=layout).sum().backward()
        dist.barrier()
        times.append(time.perf_counter() - t)
    return statistics.median(times[2:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--seqs", default="64,1024,4096", help="whole sequence lengths, comma-separated")
    ap.add_argument("--iters", type=int, default=5)
    a = ap.parse_args()
    cols = [(algo, lay) for algo in VARIANTS for lay in LAYOUTS]
    print(f"{a.world} gloo ranks, causal, {LAYERS} layers forward + backward, ms (median of {a.iters})")
    print(f"{'tokens':>7} " + " ".join(f"{algo + ' ' + lay:>21}" for algo, lay in cols))
    rows = []
    for seq in (int(s) for s in a.seqs.split(",")):
        rows.append([run_world(_bench, a.world, seq, algo, lay, a.iters, timeout=900)[0] for algo, lay in cols])
        print(f"{seq:>7} " + " ".join(f"{t * 1e3:>21.1f}" for t in rows[-1]), flush=True)
    rounds = 2 * LAYERS * a.world  # a ring of P ranks: P rounds forward, P backward, per layer
    print(f"at {a.seqs.split(',')[0]} tokens, per round ({rounds} rounds): "
          + ", ".join(f"{algo} {lay} {t * 1e3 / rounds:.2f} ms" for (algo, lay), t in zip(cols, rows[0])))


if __name__ == "__main__":
    main()
