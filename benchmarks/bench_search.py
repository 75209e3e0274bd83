"""Search speed: grid wall time and candidates per second at 1,024 / 4,096 / 16,384 GPUs, and how many
optuna trials reach within 1 % of the grid optimum (median over 5 seeds).

    python benchmarks/bench_search.py [--gpus 1024,4096,16384] [--batch 16] [--seeds 5] [--trials 200]

Workload: dgx-h100 preset, llama3-70b, 1M-token sequences, training. Targets (issue 6): grid <= 1 s,
3 s, 10 s on a 2-core machine; Bayesian within 1 % in <= 200 trials at 4,096 GPUs. "Candidates" is
the size of the space searched (degrees x algorithm variants x token layouts x mesh orders x memory
policies); "priced" is how many of them the engine actually costed after the memory filter, the
Pareto policy filter and the compute lower bound.
"""
from __future__ import annotations

import argparse
import statistics
import time

from sp_plan.planner import Workload
from sp_plan.planner.bayes import bayes_search, trials_to_reach
from sp_plan.planner.search import grid_search
from sp_plan.profiles import load_cluster, load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="1024,4096,16384")
    ap.add_argument("--batch", type=int, default=16, help="global batch of 1M-token sequences")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--bayes-gpus", type=int, default=4096)
    args = ap.parse_args()
    model = load_model("llama3-70b")
    work = Workload(seq_len="1m", batch=args.batch, causal=True, training=True)
    print(f"{'GPUs':>6} {'wall s':>8} {'cpu s':>7} {'candidates':>11} {'priced':>8} {'cand/s':>11}  best layout")
    optimum = {}
    for n in (int(x) for x in args.gpus.split(",")):
        cluster = load_cluster("dgx-h100", n // 8)
        w0, c0 = time.perf_counter(), time.process_time()
        res = grid_search(cluster, model, work)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        t, best = res.ranked[0]
        optimum[n] = t
        print(f"{n:>6} {wall:>8.2f} {cpu:>7.2f} {res.space:>11,} {res.evaluated:>8,} {res.space / wall:>11,.0f}  "
              f"{best.to_plan().summary()} ({t:.1f} s/step)")
    n = args.bayes_gpus
    if n not in optimum:
        optimum[n] = grid_search(load_cluster("dgx-h100", n // 8), model, work).ranked[0][0]
    cluster = load_cluster("dgx-h100", n // 8)
    needed = []
    for seed in range(args.seeds):
        w0 = time.perf_counter()
        res = bayes_search(cluster, model, work, trials=args.trials, seed=seed)
        k = trials_to_reach(res, optimum[n])
        needed.append(k if k is not None else float("inf"))
        print(f"bayes seed {seed}: within 1 % of the grid optimum after {k} trials "
              f"(best {res.ranked[0][0]:.2f} s vs grid {optimum[n]:.2f} s; {time.perf_counter() - w0:.1f} s)")
    print(f"bayes at {n} GPUs: median trials to within 1 % = {statistics.median(needed)} (over {args.seeds} seeds)")


if __name__ == "__main__":
    main()
