"""Search speed at cluster scale: grid wall and CPU time at 1,024 / 16,384 / 131,072 GPUs for batch 1
and 16, the best layout of every algorithm, the schedules and link evaluations the search built, the resident
memory of a 131,072-GPU plan, and how many optuna trials reach within 1 % of the grid optimum at 4,096 GPUs.

    python benchmarks/bench_search.py [--gpus 1024,16384,131072] [--batches 1,16] [--models llama3-70b,llama3-405b]
                                      [--seeds 5] [--trials 200] [--bayes-gpus 4096] [--bayes-batch 16]

Workload: dgx-h100 preset, 1M-token sequences, causal training. Targets, full grid with every
algorithm on a 2-core machine: <= 0.3 s at 1,024 GPUs, <= 1 s at 16,384, <= 10 s at 131,072; a 131,072-GPU
plan under 2 GiB resident. "Candidates" is the size of the space (degrees x algorithm variants x token
layouts x mesh orders x memory policies); "priced" is how many the engine costed after the memory filter,
the Pareto policy filter and the lower bounds (the top 5 and each variant's best are exact).
"""
from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from sp_plan.planner import Workload
from sp_plan.planner.bayes import bayes_search, trials_to_reach
from sp_plan.planner.search import best_per_variant, grid_search
from sp_plan.profiles import load_cluster, load_model
from sp_plan.profiles.kernels import default_params


def commit() -> str:
    """The short commit this ran at, or "unknown" outside git."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=Path(__file__).parent,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (out.stdout.strip() + ("+dirty" if dirty else "")) if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def variant_name(c) -> str:
    return c.algorithm + (f" C{c.team}" if c.team > 1 else "") + (f" {c.placement}" if c.placement else "")


def params_for(cluster, which: str):
    """The physical parameters a search prices with: the presets' defaults (what ``sp-plan plan`` uses when the
    cluster has no profile) or None (the neutral, uncalibrated engine)."""
    return default_params(cluster) if which == "defaults" else None


def run_grid(model_name: str, gpus: int, batch: int, each: bool, which: str) -> float:
    model, cluster = load_model(model_name), load_cluster("dgx-h100", gpus // 8)
    work = Workload(seq_len="1m", batch=batch, causal=True, training=True)
    w0, c0 = time.perf_counter(), time.process_time()
    res = grid_search(cluster, model, work, params=params_for(cluster, which))
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    t, best = res.ranked[0]
    st, est = res.estimator.stats, res.estimator
    print(f"{model_name:>11} {gpus:>7} {batch:>5} {wall:>7.2f} {cpu:>7.2f} {res.space:>11,} {res.evaluated:>8,} "
          f"{st.schedules_built:>9,} {est.engine.evaluations:>6,}  {best.to_plan().summary()} ({t:.2f} s/step)",
          flush=True)
    if each:
        per = best_per_variant(res.ranked)
        algs: dict[str, list] = {}
        for tv, c in per:  # fastest first: an algorithm's first entry is its best variant
            algs.setdefault(c.algorithm, []).append((tv, c))
        line = "; ".join(f"{a} {v[0][0]:.2f} s ({len(v)} variant{'s' if len(v) > 1 else ''}, "
                         f"best {variant_name(v[0][1])})" for a, v in algs.items())
        print(f"{'':>11} best of each algorithm: {line}", flush=True)
    return t


def plan_rss(model_name: str, gpus: int, batch: int) -> tuple[float, float]:
    """Max resident MiB and wall seconds of ``sp-plan plan`` for one world, in a fresh process."""
    code = ("import resource, sys; from sp_plan.cli.app import app; sys.argv = ['sp-plan', 'plan', '--cluster', "
            f"'dgx-h100', '--nodes', '{gpus // 8}', '--model', '{model_name}', '--seq-len', '1m', '--batch', "
            f"'{batch}']\ntry:\n    app()\nexcept SystemExit:\n    pass")
    w0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    wall = time.perf_counter() - w0
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="1024,16384,131072")
    ap.add_argument("--batches", default="1,16", help="global batches of 1M-token sequences")
    ap.add_argument("--models", default="llama3-70b,llama3-405b")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--bayes-gpus", type=int, default=4096)
    ap.add_argument("--bayes-batch", type=int, default=16)
    ap.add_argument("--params", choices=("defaults", "neutral"), default="defaults",
                    help="defaults: the presets' model terms, as `sp-plan plan` prices a cluster with no profile; "
                         "neutral: Params(), the uncalibrated engine")
    args = ap.parse_args()
    print(f"commit {commit()}, Python {sys.version.split()[0]}, grid_search in-process, dgx-h100, 1M tokens, training, "
          f"{args.params} params")
    print(f"{'model':>11} {'GPUs':>7} {'batch':>5} {'wall s':>7} {'cpu s':>7} {'candidates':>11} {'priced':>8} "
          f"{'schedules':>9} {'links':>6}  best layout")
    gpus = [int(x) for x in args.gpus.split(",")]
    for name in args.models.split(","):
        for n in gpus:
            for b in (int(x) for x in args.batches.split(",")):
                run_grid(name, n, b, each=(name == args.models.split(",")[0] and n == max(gpus)), which=args.params)
    n = max(gpus)
    rss, wall = plan_rss(args.models.split(",")[-1], n, 16)
    print(f"sp-plan plan --nodes {n // 8} --model {args.models.split(',')[-1]} --seq-len 1m --batch 16: "
          f"max RSS {rss:.0f} MiB, {wall:.1f} s wall (fresh process, imports included)")
    if args.seeds:
        model, work = load_model("llama3-70b"), Workload(seq_len="1m", batch=args.bayes_batch)
        cluster = load_cluster("dgx-h100", args.bayes_gpus // 8)
        params = params_for(cluster, args.params)
        optimum = grid_search(cluster, model, work, params=params).ranked[0][0]
        needed = []
        for seed in range(args.seeds):
            w0 = time.perf_counter()
            res = bayes_search(cluster, model, work, trials=args.trials, seed=seed, params=params)
            k = trials_to_reach(res, optimum)
            needed.append(k if k is not None else float("inf"))
            print(f"bayes seed {seed}: within 1 % of the grid optimum after {k} trials "
                  f"(best {res.ranked[0][0]:.2f} s vs grid {optimum:.2f} s; {time.perf_counter() - w0:.1f} s)")
        print(f"bayes at {args.bayes_gpus} GPUs (llama3-70b, batch {args.bayes_batch}): median trials to within 1 % = "
              f"{statistics.median(needed)} (over {args.seeds} seeds)")


if __name__ == "__main__":
    main()
