"""Search speed at cluster scale: grid wall and CPU time at 1,024 / 16,384 / 131,072 GPUs for batch 1
and 16, the best layout of every algorithm, the schedules and link evaluations the search built; the whole
`sp-plan plan -o plan.yaml` command as a user runs it (a fresh process: imports, search, tables, the plan file),
its time net of `sp-plan presets`, its peak resident memory and the plan file's size, and with `--documents NAME`
packed (default magi-long) and `--window W`, alone and with the documents (target: at most twice the same plan's
time without); and how many optuna trials reach within 1 % of the grid optimum at 4,096 GPUs.

    python benchmarks/bench_search.py [--gpus 1024,16384,131072] [--batches 1,16] [--models llama3-70b,llama3-405b]
                                      [--repeats 5] [--documents magi-long] [--window 4096] [--seeds 5] [--trials 200]
                                      [--bayes-gpus 4096] [--bayes-batch 16] [--whole-only] [--jobs 1,]
    python benchmarks/bench_search.py --where 1024x1,131072x16 [--models llama3-70b] [--where-top 40]

Workload: dgx-h100 preset, 1M-token sequences, causal training. Targets on a quiet 2-core machine: the in-process
grid with every algorithm <= 0.3 s at 1,024 GPUs, <= 1 s at 16,384, <= 10 s at 131,072; the whole command
(`--no-profile`, llama3-70b) net of `sp-plan presets` <= 0.3 s at 1,024 GPUs, <= 1 s at 16,384, <= 3 s at
131,072, with `sp-plan presets` <= 0.5 s, <= 400 MiB resident and a plan file <= 50 kB at 131,072. "Candidates"
is the size of the space (degrees x algorithm variants x token layouts x mesh orders x memory policies); "priced"
is how many the engine costed after the memory filter, the Pareto policy filter and the lower bounds (the top 5 and
each variant's best are exact); "jobs s" is the same grid's wall time over the command's default ``--jobs`` (the
usable cores, each process a share of the degrees choices; the bench stops if its winner or a variant's best
differs). ``--jobs 1,`` times the whole command in one process and at its default. Whole-process figures are the median and the least of ``--repeats`` runs (wall
clock: other processes on the machine slow them, and the least reading is the nearest to a quiet machine's; the CPU
column says how much of the wall was the command's own work, and "net cpu" is its CPU net of `sp-plan presets`'s: the
reading to compare on a busy machine, where wall clock measures the other processes). ``--whole-only`` runs the
whole-process figures alone (no in-process grid, no optuna). ``--where GPUSxBATCH`` prints where one whole
command's time goes: a sampling profile of the process, each function's share of the samples.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sp_plan.planner import Workload
from sp_plan.planner.bayes import bayes_search, trials_to_reach
from sp_plan.planner.search import best_per_variant, grid_search
from sp_plan.profiles import load_cluster, load_model
from sp_plan.profiles.kernels import default_params
from sp_plan.service.collector import collector_paused
from sp_plan.workers import auto_jobs, forked_grid_search, usable_cores
from harness.stamp import commit


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
    with collector_paused():  # as `sp-plan plan` runs it
        res = grid_search(cluster, model, work, params=params_for(cluster, which))
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    w0 = time.perf_counter()
    with collector_paused():  # the same grid over the command's default --jobs (the usable cores)
        forked = forked_grid_search(cluster, model, work, None, auto_jobs(), params=params_for(cluster, which))
    jobs_wall = time.perf_counter() - w0
    if best_per_variant(forked.ranked) != best_per_variant(res.ranked) or forked.ranked[0] != res.ranked[0]:
        raise SystemExit(f"{gpus} x {batch}: the forked grid's winner or variant bests differ from one process's")
    t, best = res.ranked[0]
    st, est = res.estimator.stats, res.estimator
    print(f"{model_name:>11} {gpus:>7} {batch:>5} {wall:>7.2f} {cpu:>7.2f} {jobs_wall:>7.2f} {res.space:>11,} "
          f"{res.evaluated:>8,} "
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


#: runs one command and prints its wall seconds, CPU seconds and peak resident KiB as JSON (getrusage of its child)
CHILD = """import json, resource, subprocess, sys, time
t = time.perf_counter()
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE).returncode
wall = time.perf_counter() - t
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": rc, "wall": wall, "cpu": ru.ru_utime + ru.ru_stime, "maxrss_kib": ru.ru_maxrss}))
"""


#: runs `sp-plan ARGS` in this process under a sampling profiler (a thread reads the main thread's stack every 0.5 ms,
#: so that many small calls are not inflated as under cProfile) and prints each function's share of the samples: the
#: functions on the stack (inclusive; the CLI framework's frames left out), from the interpreter's start (imports
#: included), and the CPU seconds
WHERE = """import collections, io, sys, threading, time
from contextlib import redirect_stdout
main, shares, stop, n = threading.get_ident(), collections.Counter(), [], [0]
def sample():
    while not stop:
        time.sleep(0.0005)
        f, seen = sys._current_frames().get(main), set()
        n[0] += 1
        while f is not None:
            co = f.f_code
            name = co.co_filename.split("site-packages/")[-1].replace("/work/main/", "") + ":" + co.co_name
            if name not in seen:
                seen.add(name)
                shares[name] += 1
            f = f.f_back
sys.setswitchinterval(0.0005)
t = threading.Thread(target=sample, daemon=True)
t.start()
c0 = time.process_time()
with redirect_stdout(io.StringIO()):
    from sp_plan.cli.app import run_line
    rc = run_line(sys.argv[2:])
cpu = time.process_time() - c0
stop.append(1)
t.join()
print(f"{cpu:.2f} s CPU, {n[0]} samples, rc {rc}; share of the samples with the function on the stack:")
for name, k in shares.most_common(int(sys.argv[1]) + 12):
    if not any(x in name for x in ("frozen importlib", "<string>", "typer/", "cli/options.py:run", "cli/app.py:run_line")):
        print(f"  {100 * k / n[0]:5.1f} %  {name}")
"""


def where(gpus: int, batch: int, model_name: str, top: int) -> None:
    """Where the whole `sp-plan plan` command's time goes (``WHERE``), one process, its plan file in a temporary
    folder."""
    with tempfile.TemporaryDirectory() as d:
        args = ["plan", "--cluster", "dgx-h100", "--nodes", str(gpus // 8), "--model", model_name, "--seq-len", "1m",
                "--batch", str(batch), "--no-profile", "-o", str(Path(d) / "plan.yaml")]
        print(f"where the time goes: sp-plan {' '.join(args[:-1])} plan.yaml (load average {os.getloadavg()[0]:.2f})")
        subprocess.run([sys.executable, "-c", WHERE, str(top), *args], check=True, timeout=600)


def sp_plan_command() -> list[str]:
    """The `sp-plan` console script installed beside this Python (what a user's shell runs), else its entry point."""
    script = Path(sys.executable).with_name("sp-plan")
    return [str(script)] if script.exists() else [sys.executable, "-c", "from sp_plan.cli.app import main; main()"]


def compile_package() -> None:
    """The package's bytecode written, as an installed package has it: where PYTHONDONTWRITEBYTECODE is set a module
    edited since its .pyc was written is compiled again in every timed process (tens of ms for a large module)."""
    import compileall  # noqa: PLC0415 - the whole-process figures only

    import sp_plan  # noqa: PLC0415

    compileall.compile_dir(str(Path(sp_plan.__file__).parent), quiet=1, workers=1)


def whole_process(args: list[str], repeats: int) -> dict:
    """Median wall and CPU seconds and the largest peak RSS (MiB) of `sp-plan ARGS` over ``repeats`` fresh processes,
    after one untimed run (the files it reads in the page cache)."""
    runs = []
    subprocess.run([*sp_plan_command(), *args], capture_output=True, timeout=600, check=True)
    for _ in range(repeats):
        r = subprocess.run([sys.executable, "-c", CHILD, *sp_plan_command(), *args], capture_output=True, text=True,
                           timeout=600, check=True)
        run = json.loads(r.stdout)
        if run["rc"] != 0:
            raise SystemExit(f"sp-plan {' '.join(args)} exited {run['rc']}")
        runs.append(run)
    return {"wall": statistics.median(r["wall"] for r in runs), "cpu": statistics.median(r["cpu"] for r in runs),
            "rss": max(r["maxrss_kib"] for r in runs) / 1024, "walls": [r["wall"] for r in runs]}


def run_command(model_name: str, gpus: int, batch: int, base: dict, repeats: int, folder: Path,
                masks: tuple[str, ...] = (), jobs: str = "") -> dict:
    """`sp-plan plan --no-profile -o plan.yaml` for one world as a user runs it, net of `sp-plan presets` (with
    ``masks``: those flags too, e.g. `--documents NAME`, the row named by their values; with ``jobs``: `--jobs JOBS`,
    else the command's default, the usable cores)."""
    name = "+".join(masks[1::2]) or model_name
    out = folder / f"plan-{model_name}-{gpus}-{batch}-{name}-{jobs}.yaml"
    args = ["plan", "--cluster", "dgx-h100", "--nodes", str(gpus // 8), "--model", model_name, "--seq-len", "1m",
            "--batch", str(batch), "--no-profile", "-o", str(out), *masks]
    w = whole_process(args + (["--jobs", jobs] if jobs else []), repeats)
    print(f"{name:>11} {gpus:>7} {batch:>5} {jobs or 'auto':>5} {w['wall']:>7.2f} {min(w['walls']):>7.2f} {w['cpu']:>7.2f} "
          f"{w['cpu'] - base['cpu']:>7.2f} {w['wall'] - base['wall']:>7.2f} {min(w['walls']) - min(base['walls']):>7.2f} "
          f"{w['rss']:>7.0f} "
          f"{out.stat().st_size / 1e3:>8.1f}   " + " ".join(f"{x:.2f}" for x in w["walls"]), flush=True)
    return w


def masked_rows(args, masks: tuple[str, ...], gpus: list[int], plain: dict, base: dict, folder: Path) -> None:
    """The whole command with ``masks`` (batch 1, each GPU count, the last ``--jobs``) and its wall and CPU seconds
    against the same plan's without (``plain``'s rows); the target is at most twice."""
    ratios, jobs = [], args.jobs.split(",")[-1]
    for n in gpus:
        w = run_command(args.models.split(",")[0], n, 1, base, args.repeats, folder, masks, jobs)
        if (n, 1, jobs) in plain:
            p = plain[n, 1, jobs]
            ratios.append(f"{n:,} GPUs {w['wall'] / p['wall']:.2f}x / {w['cpu'] / p['cpu']:.2f}x")
    print(f"{' '.join(masks)}, wall / CPU seconds against the same plan without: " + ", ".join(ratios))


def parser() -> argparse.ArgumentParser:
    """The benchmark's options: which clusters, batches and models, and which of its parts to run."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="1024,16384,131072")
    ap.add_argument("--batches", default="1,16", help="global batches of 1M-token sequences")
    ap.add_argument("--models", default="llama3-70b,llama3-405b")
    ap.add_argument("--repeats", type=int, default=5, help="fresh `sp-plan` processes per whole-process figure "
                    "(0: none)")
    ap.add_argument("--documents", default="magi-long", help="also time the whole command with --documents NAME "
                    "(batch 1, each GPU count; '' for none): its CPU seconds against the same plan's without")
    ap.add_argument("--window", default="", help="also time the whole command with --window W, and with it and "
                    "--documents (batch 1, each GPU count; '' for none)")
    ap.add_argument("--jobs", default="", help="the whole command's --jobs, comma-separated values each timed "
                    "(e.g. '1,' for one process and the default; '': the default, the usable cores)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--bayes-gpus", type=int, default=4096)
    ap.add_argument("--bayes-batch", type=int, default=16)
    ap.add_argument("--whole-only", action="store_true", help="only the whole command's figures (no in-process grid, "
                    "no optuna)")
    ap.add_argument("--params", choices=("defaults", "neutral"), default="defaults",
                    help="defaults: the presets' model terms, as `sp-plan plan` prices a cluster with no profile; "
                         "neutral: Params(), the uncalibrated engine")
    ap.add_argument("--where", default="", help="GPUSxBATCH[,...]: where the whole command's time goes in one process "
                    "(a sampling profile: each function's share), then exit")
    ap.add_argument("--where-top", type=int, default=40, help="functions listed by --where")
    return ap


def main() -> None:
    args = parser().parse_args()
    if args.where:
        compile_package()
        for case in args.where.split(","):
            gpus, batch = (int(x) for x in case.split("x"))
            where(gpus, batch, args.models.split(",")[0], args.where_top)
        return
    print(f"commit {commit()}, Python {sys.version.split()[0]}, grid_search in-process, dgx-h100, 1M tokens, training, "
          f"{args.params} params")
    gpus = [int(x) for x in args.gpus.split(",")]
    if not args.whole_only:
        grid_rows(args, gpus)
    if args.repeats:
        whole_rows(args, gpus)
    if args.seeds and not args.whole_only:
        bayes_rows(args)


def grid_rows(args, gpus: list[int]) -> None:
    """The in-process grid search of each model, GPU count and batch: its time, candidates and best layout."""
    print(f"{'model':>11} {'GPUs':>7} {'batch':>5} {'wall s':>7} {'cpu s':>7} {'jobs s':>7} {'candidates':>11} "
          f"{'priced':>8} {'schedules':>9} {'links':>6}  best layout")
    for name in args.models.split(","):
        for n in gpus:
            for b in (int(x) for x in args.batches.split(",")):
                run_grid(name, n, b, each=(name == args.models.split(",")[0] and n == max(gpus)), which=args.params)


def whole_rows(args, gpus: list[int]) -> None:
    """The whole `sp-plan plan` command as a user runs it, fresh processes, with and without masks."""
    compile_package()
    base = whole_process(["presets"], args.repeats)
    print(f"\nwhole process: {' '.join(Path(x).name for x in sp_plan_command()[:1])} ... as a user runs it, "
          f"fresh processes, median and least of {args.repeats} (load average {os.getloadavg()[0]:.2f} before); "
          f"`sp-plan presets` {base['wall']:.2f} s wall (least {min(base['walls']):.2f}), {base['cpu']:.2f} s CPU, "
          f"{base['rss']:.0f} MiB (" + " ".join(f"{x:.2f}" for x in base["walls"]) + ")")
    print(f"usable cores {usable_cores()}: the default --jobs is {auto_jobs()}")
    print(f"{'model':>11} {'GPUs':>7} {'batch':>5} {'jobs':>5} {'wall s':>7} {'least':>7} {'cpu s':>7} {'net cpu':>7} "
          f"{'net s':>7} {'least':>7} {'RSS MiB':>7} {'file kB':>8}   walls (net: minus `sp-plan presets`)")
    with tempfile.TemporaryDirectory() as d:
        plain = {}
        for n in gpus:
            for b in (int(x) for x in args.batches.split(",")):
                for jobs in args.jobs.split(","):
                    plain[n, b, jobs] = run_command(args.models.split(",")[0], n, b, base, args.repeats, Path(d),
                                                    jobs=jobs)
        docs = ("--documents", args.documents) if args.documents else ()
        window = ("--window", args.window) if args.window else ()
        for masks in {m: None for m in (docs, window, window + docs) if m}:
            masked_rows(args, masks, gpus, plain, base, Path(d))
    print(f"load average after: {os.getloadavg()[0]:.2f}")


def bayes_rows(args) -> None:
    """Trials the Bayesian search needs to come within 1 % of the grid's optimum, over seeds."""
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
        best = f"{res.ranked[0][0]:.2f} s" if res.ranked else "none that fits"
        print(f"bayes seed {seed}: within 1 % of the grid optimum after {k} trials "
              f"(best {best} vs grid {optimum:.2f} s; {time.perf_counter() - w0:.1f} s)")
    print(f"bayes at {args.bayes_gpus} GPUs (llama3-70b, batch {args.bayes_batch}): median trials to within 1 % = "
          f"{statistics.median(needed)} (over {args.seeds} seeds)")


if __name__ == "__main__":
    main()
