"""Does `sp-plan tune` make predictions true? Ground truth against the model, uncalibrated and calibrated.

    python benchmarks/bench_tune.py [--worlds local4,local8,netns2x2] [--budget 5] [--repeats 2] [--json out.json]
    python benchmarks/bench_tune.py --worlds local8 --truth DIR --reread 12 --repeats 2 --keep NEW   # settle the top
    python benchmarks/bench_tune.py --worlds local8 --truth DIR --head-to-head 6 --keep NEW   # the top, head to head
    python benchmarks/bench_tune.py --rescore benchmarks/truths/local8   # judge a kept truth and tune again
    python benchmarks/bench_tune.py --pack DIR   # a --keep folder as kept in the repository (benchmarks/truths)
    python benchmarks/bench_tune.py --budget-check [--worlds local4,netns2x2] [--keep DIR]   # tune keeps its time

For each world (4 and 8 gloo ranks on this host; two hosts simulated by network namespaces joined
by a veth shaped to 800 Mbit/s with `tc tbf`, two ranks each; benchmarks/harness/netns.py):
1. `sp-plan discover -o cluster.yaml` under the world, as a user starts;
2. ground truth: every distinct layout of the model's ranking that fits (each algorithm, degrees,
   placement and token layout with its best mesh order and memory policy) measured end to end with
   the bundled runtime (`profiles/tune/candidate.py`: stacks of 1 and ``--layers`` blocks, the median of
   ``--iters`` timed steps each, scaled to the model's layers; the fastest of ``--repeats`` such runs
   (``--truth-estimator median``: their median; ``blocked``: the passes as blocks, a robust additive fit),
   taken as whole passes over every layout, for two small
   workloads: tiny-llama at 1k tokens (A) and tiny-gpt at 512 (B);
3. `sp-plan tune` on workload A with a fresh store (``--budget`` candidates at most; ``--kernel-timing``
   passed on);
4. against the ground truth, uncalibrated (the cluster file as discovered) and calibrated (the stored
   profile): Spearman of predicted vs measured step time, median absolute step-time and peak-memory
   error, the regret of the predicted best (its measured time over the measured best, minus 1), how
   many candidates tune measured, and the transfer error: the profile tuned on A predicting B.
``--head-to-head K`` reads a kept truth's decisive layouts (its fastest, the calibrated model's, tune's and
`sp-plan plan`'s picks) head to head (profiles/tune/head_to_head.py: full depth, one step of each a round) in K
launches, and judges each party's pick by those paired readings.
Targets: calibrated median step-time error <= 15 %, Spearman >= 0.8, regret <= 5 % with <= 5
measured candidates, transfer error <= 25 %.
``--budget-check`` runs `sp-plan tune` as a user does (``BUDGET_CHECKS``: discover, then tune with a fresh store,
its output into a file) and reports the whole wall time against ``--max-minutes`` (target: within 30 s of it), each
step's time from its progress lines, the longest silence of the log, the candidates measured, what the budget left
out, and whether the step-time fit used at least 3 candidates.
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.stamp import commit

WORKLOADS = {"A": ("tiny-llama", "1k"), "B": ("tiny-gpt", "512")}
WORLDS = {"local4": (4, 4, None), "local8": (8, 8, None), "netns2x2": (4, 2, 800)}
HERE = Path(__file__).resolve()
#: --budget-check's runs: world -> (model, sequence length, --budget, --max-minutes)
BUDGET_CHECKS = {"local4": ("bert-large", "4k", 3, 9.0), "local8": ("bert-large", "4k", 3, 9.0),
                 "netns2x2": ("bert-large", "8k", 5, 12.0)}
#: the whole command may take this long beyond --max-minutes (the launcher's start and the world's end)
BUDGET_SLACK_S = 30.0


def _world_pool(args):
    """(Inside the world) join it; the cluster, model, workload and every distinct layout of the model's ranking."""
    from sp_plan.planner.model import Workload
    from sp_plan.planner.params import Params
    from sp_plan.profiles import load_cluster, load_model
    from sp_plan.profiles.tune.choose import diversify
    from sp_plan.profiles.tune.pool import ranked_plans
    from sp_plan.profiles.discover import probe

    owned = probe.init_world(300)
    cluster, model = load_cluster(args.cluster), load_model(args.model)
    work = Workload(seq_len=args.seq_len, batch=1, causal=True, training=True)
    return owned, cluster, model, work, diversify(ranked_plans(cluster, model, work, Params(), keep=None), 1000)


def worker_truth(args) -> None:
    """(Inside the world) measure every distinct layout that fits; rank 0 writes them as JSON."""
    import dataclasses

    from sp_plan.profiles.tune.measure import run_candidate
    from sp_plan.profiles.tune.run import TuneOptions
    from sp_plan.profiles.tune.settings import SETTINGS
    from sp_plan.profiles.discover import probe

    owned, cluster, model, work, pool = _world_pool(args)
    rank = probe.dist.get_rank()
    if args.only:  # --recheck, --reread: these layouts only
        pool = [p for p in pool if p.summary() in args.only.split(";")]
    # the truth times every step (a tune's candidates stop once two readings agree: settings.step_agree)
    opts = TuneOptions(candidate_timeout=args.timeout, layers=args.layers, iters=args.iters, warmup=args.warmup,
                       settings=dataclasses.replace(SETTINGS, step_agree=None))
    runs: list[list] = [[] for _ in pool]
    for rep in range(args.repeats):  # whole passes, interleaved: a slow spell of the host lands on several layouts
        for i, plan in enumerate(pool):
            if rep and runs[i][0].status == "oom":
                continue  # did not fit in the first pass: not retried (an error or a timeout is)
            r = run_candidate(plan, model, work, cluster, opts)
            runs[i].append(r)
            if rank == 0:
                print(f"[pass {rep + 1}/{args.repeats}, {i + 1}/{len(pool)}] {plan.summary()}: {r.status} "
                      f"{r.measured_s if r.measured_s is not None else '-'}", flush=True)
    rows = [_truth_row(rs).model_dump(mode="json") for rs in runs]
    if rank == 0:
        Path(args.out).write_text(json.dumps(rows))
    probe.dist.barrier()
    probe.finish(owned)


def worker_head_to_head(args) -> None:
    """(Inside the world) read the ``--only`` layouts head to head (profiles/tune/head_to_head.py); rank 0 writes
    {"layouts": [...], "steps": [[seconds of each round] of each layout]}."""
    from sp_plan.profiles.tune.head_to_head import head_to_head
    from sp_plan.profiles.discover import probe

    owned, _, model, work, pool = _world_pool(args)
    names, by_name = args.only.split(";"), {p.summary(): p for p in pool}
    steps = head_to_head([by_name[n] for n in names], model, work, rounds=args.rounds, warmup=args.warmup)
    if probe.dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps({"layouts": names, "steps": steps}))
    probe.dist.barrier()
    probe.finish(owned)


def additive_fit(table: list[list[float | None]], c: float = 1.345, sweeps: int = 50) -> tuple[list[float], list[float]]:
    """Robust two-way additive fit of a table with gaps (None): ``table[l][p] = row[l] + col[p] + residual``,
    ``col[0] = 0``, by Huber's M-estimator (iteratively reweighted least squares, tuning constant ``c`` in units of
    the residuals' MAD scale; Huber, Robust Statistics, 1981, ch. 7). A reading that met a slow spell weighs less
    than a mean would let it; the fit is unique (two readings of a layout meet at their mean) and, unlike Tukey's
    median polish, exact for an additive table whatever its gaps, so a pass read by a few layouts is compared
    through exactly those layouts."""
    import numpy as np

    cells = [(i, j, x) for i, r in enumerate(table) for j, x in enumerate(r) if x is not None]
    n_row, n_col = len(table), max(len(r) for r in table)
    a = np.zeros((len(cells), n_row + n_col - 1))
    for k, (i, j, _) in enumerate(cells):
        a[k, i] = 1.0
        if j:
            a[k, n_row + j - 1] = 1.0
    y = np.array([x for _, _, x in cells])
    repeated = np.array([sum(x is not None for x in table[i]) > 1 for i, _, _ in cells])  # a row alone fits exactly
    w = np.ones(len(cells))
    for _ in range(sweeps):
        sw = np.sqrt(w)
        sol = np.linalg.lstsq(a * sw[:, None], y * sw, rcond=None)[0]
        r = y - a @ sol
        scale = float(np.median(np.abs(r[repeated]))) / 0.6745 if repeated.any() else 0.0
        if scale <= 1e-12:
            break
        new = np.minimum(1.0, c * scale / np.maximum(np.abs(r), 1e-300))
        if np.allclose(new, w, atol=1e-9):
            break
        w = new
    return [float(x) for x in sol[:n_row]], [0.0] + [float(x) for x in sol[n_row:]]


def blocked(rows: list[list[float]]) -> list[float]:
    """Each layout's time with the passes as blocks: the additive fit of the log readings (a layout's i-th reading
    from pass i, as ``--repeats`` and ``--reread`` take them; ``additive_fit``, Huber's), each layout at the speed of the pass
    that holds the median reading (the passes weighted by the readings they hold: a reread pass of six layouts does
    not set the level of a first pass of ninety). A pass that ran slow all through (the host's other work) then
    moves every layout read in it, not the one whose fastest or median reading it happened to hold: the four reread
    passes of the kept 8-rank truth (benchmarks/truths/local8) took 1.06-1.30 times as long as its first pass."""
    import math

    row, col = additive_fit([[math.log(x) for x in r] for r in rows])
    cells = sorted(col[j] for r in rows for j in range(len(r)))
    level = cells[(len(cells) - 1) // 2]
    return [math.exp(level + a) for a in row]


#: how a layout's passes make its truth, each over every layout's readings (a list per layout, in pass order):
#: "fastest" (what tune keeps of a contender's readings: whatever else runs on the host only adds time), "median",
#: or "blocked" (the passes as blocks: ``blocked``)
ESTIMATORS = {"fastest": lambda rows: [min(r) for r in rows],
              "median": lambda rows: [statistics.median(r) for r in rows],
              "blocked": blocked}


def _truth_row(runs):
    """One layout's truth: its fastest pass that ran (each reading kept in ``detail['readings_s']``; ``judge``
    takes the truth from them by ``--truth-estimator``)."""
    ok = [r for r in runs if r.status == "ok"]
    if not ok:
        return runs[0]
    readings = [r.measured_s for r in ok]
    return ok[0].model_copy(update={
        "measured_s": min(readings),
        "measured_memory": statistics.median(r.measured_memory for r in ok),
        "detail": {**ok[0].detail, "readings_s": readings, "passes_failed": len(runs) - len(ok)}})


def _run(argv, world, per_node, cwd, pair, timeout=3600) -> str:
    from harness import netns

    res = netns.launch(argv, world, per_node, cwd, pair, timeout)
    for r, (code, out) in enumerate(res):
        if code != 0:
            raise RuntimeError(f"rank {r} of `{' '.join(argv)}` exited {code}:\n{out[-3000:]}")
    return res[0][1]


def spearman(a, b) -> float:
    import pandas as pd

    return float(pd.Series(a).corr(pd.Series(b), method="spearman")) if len(a) > 2 else float("nan")


def self_agreement(truth: list[dict], estimator: str = "fastest") -> dict | None:
    """How well the ground truth agrees with itself (None with one pass): Spearman of each pass's readings against
    ``estimator`` of the other passes (with two passes, of one against the other), over the layouts every pass read,
    and the median spread of a layout's readings (max / min - 1). A model judged against this truth cannot be
    expected to rank it much better than its own passes rank each other."""
    rows = [t["detail"]["readings_s"] for t in truth if t["status"] == "ok" and "readings_s" in t.get("detail", {})]
    k = max((len(r) for r in rows), default=0)
    rows = [r for r in rows if len(r) == k]
    if k < 2 or len(rows) < 3:
        return None
    rhos = [spearman([r[i] for r in rows], ESTIMATORS[estimator]([r[:i] + r[i + 1:] for r in rows])) for i in range(k)]
    return {"passes": k, "n": len(rows), "spearman": rhos,
            "spread": statistics.median(max(r) / min(r) - 1 for r in rows)}


def score(cluster, truth: list[dict], params, profile=None) -> dict:
    """Spearman, median |error| of step time and memory, regret of the predicted best, under ``params``; with the
    ``profile``, also the regret of `sp-plan plan`'s pick (a layout tune measured ranks at its measurement,
    planner/measured.py)."""
    from sp_plan.planner.plan import Plan
    from sp_plan.profiles.tune.head_to_head import regret
    from sp_plan.profiles.tune.pool import predict

    ok = [t for t in truth if t["status"] == "ok"]
    plans = {t["summary"]: Plan.model_validate(t["plan"]) for t in ok}
    pred = {n: predict(cluster, p, params) for n, p in plans.items()}
    ps, pm = [pred[n][0] for n in plans], [pred[n][1] for n in plans]
    ms, mm = [t["measured_s"] for t in ok], [t["measured_memory"] for t in ok]
    measured = dict(zip(plans, ms))
    ranked = plan_ranking(profile, plans, {n: p[0] for n, p in pred.items()})
    return {"n": len(ok), "failed": len(truth) - len(ok), "spearman": spearman(ps, ms),
            "step_err": statistics.median(abs(p - m) / m for p, m in zip(ps, ms)),
            "mem_err": statistics.median(abs(p - m) / m for p, m in zip(pm, mm)),
            "regret": regret(measured, min(plans, key=lambda n: pred[n][0])),
            "plan_regret": regret(measured, min(ranked, key=ranked.get))}


def plan_ranking(profile, plans: dict, predicted: dict[str, float]) -> dict[str, float]:
    """What `sp-plan plan` ranks the layouts (summary -> Plan) by with ``profile``: a layout tune measured at its
    measurement (planner/measured.py), the others at ``predicted`` (summary -> seconds); no profile, the prediction."""
    from sp_plan.planner.measured import twins

    first = next(iter(plans.values()))
    ran = twins(profile, first.model, first.workload) if profile else {}
    return {n: ran[n].measured_s if n in ran else predicted[n] for n in plans}


def pick_regret(profile, truth: list[dict]) -> float:
    """Regret of the plan tune hands the user (its best measured candidate), judged by the ground truth."""
    from sp_plan.profiles.tune.head_to_head import regret

    ok = {t["summary"]: t["measured_s"] for t in truth if t["status"] == "ok"}
    return regret(ok, tune_pick(profile, ok))


def tune_pick(profile, fits) -> str | None:
    """The layout tune hands the user: its best measured candidate among ``fits`` (summaries)."""
    mine = [c for c in profile.candidates if c.status == "ok" and c.summary in fits]
    return min(mine, key=lambda c: c.measured_s).summary if mine else None


def _hosts(rate):
    """Two hosts shaped to ``rate`` Mbit/s (benchmarks/harness/netns.py), or this host alone (None) when ``rate`` is None."""
    from harness import netns

    return netns.shaped_pair(rate) if rate else contextlib.nullcontext()


def _truth_argv(args, workload: str, out: Path, only: list[str] | None = None) -> list[str]:
    """The truth worker's command line for ``workload`` (``WORKLOADS``), all layouts or ``only`` these."""
    model, seq = WORKLOADS[workload]
    return ([str(HERE), "--worker", "truth", "--cluster", "cluster.yaml", "--model", model, "--seq-len", seq,
             "--out", str(out), "--repeats", str(args.repeats), "--timeout", str(args.timeout),
             "--layers", str(args.layers), "--iters", str(args.iters), "--warmup", str(args.warmup)]
            + (["--only", ";".join(only)] if only else []))


def bench_world(name: str, args, tmp: Path) -> dict:
    from sp_plan.planner.cluster import Cluster
    from sp_plan.profiles.store import Store

    world, per_node, rate = WORLDS[name]
    cwd = tmp / name
    cwd.mkdir(exist_ok=False)
    with _hosts(rate) as pair:
        t0 = time.monotonic()
        kept = Path(args.truth) / name if args.truth else None
        if kept:  # the cluster file and ground truth of an earlier run (the runtime they measured is unchanged)
            shutil.copy(kept / "cluster.yaml", cwd / "cluster.yaml")
            for w in WORKLOADS:
                (cwd / f"truth-{w}.json").write_bytes(kept_bytes(kept, f"truth-{w}.json"))
        else:
            _run(["-m", "sp_plan.cli.app", "discover", "-o", "cluster.yaml"], world, per_node, cwd, pair)
        cluster = Cluster.load(cwd / "cluster.yaml")
        truths = {}
        for w in WORKLOADS:
            out = cwd / f"truth-{w}.json"
            if not kept:
                _run(_truth_argv(args, w, out), world, per_node, cwd, pair)
            truths[w] = json.loads(out.read_text())
        t_truth = float("nan") if kept else time.monotonic() - t0
        store = f"sqlite:///{cwd / 'store.db'}"
        model, seq = WORKLOADS["A"]
        t1 = time.monotonic()
        log = _run(["-m", "sp_plan.cli.app", "tune", "--cluster", "cluster.yaml", "--model", model, "--seq-len", seq,
                    "--budget", str(args.budget), "--store", store, "--candidate-timeout", str(args.timeout),
                    "--layers", str(args.layers), "--iters", str(args.iters), "--warmup", str(args.warmup),
                    "--kernel-timing", args.kernel_timing],
                   world, per_node, cwd, pair)
        t_tune = time.monotonic() - t1
        (cwd / "tune.log").write_text(log)
        profile = Store(store).list_profiles()[0]
    return judge(name, world, cluster, truths, profile, t_truth, t_tune, args.truth_estimator)


def truth_by(truth: list[dict], estimator: str) -> list[dict]:
    """The truth with each layout at ``estimator`` (``ESTIMATORS``) of its passes' readings (as written where a
    row has none)."""
    rows = [t.get("detail", {}).get("readings_s") or [t.get("measured_s")] for t in truth]
    ok = [i for i, t in enumerate(truth) if t["status"] == "ok" and rows[i][0]]
    times = dict(zip(ok, ESTIMATORS[estimator]([rows[i] for i in ok]))) if ok else {}
    return [dict(t, measured_s=times[i]) if i in times else t for i, t in enumerate(truth)]


def host_drift(profile, truth: list[dict]) -> float | None:
    """The median ratio of tune's readings of the layouts it measured to the truth's of the same layouts (1.0: the
    host ran as fast during the tune as during the truth; no model can be closer to the truth than this)."""
    ok = {t["summary"]: t["measured_s"] for t in truth if t["status"] == "ok"}
    r = [c.measured_s / ok[c.summary] for c in profile.candidates if c.status == "ok" and c.summary in ok]
    return statistics.median(r) if r else None


def judge(name, world, cluster, truths, profile, t_truth, t_tune, estimator: str = "fastest") -> dict:
    """One world's figures: each workload's truth (``estimator`` of its passes) scored uncalibrated and under the
    tuned profile, and calibrated under the other estimators too."""
    from sp_plan.planner.params import Params

    others = [e for e in ESTIMATORS if e != estimator]
    truths, raw = {w: truth_by(t, estimator) for w, t in truths.items()}, truths
    res = {"world": name, "ranks": world, "truth_s": t_truth, "tune_s": t_tune, "estimator": estimator,
           "others": others, "tuned": len(profile.candidates), "profile": profile.id,
           "pick_regret": pick_regret(profile, truths["A"]), "drift": host_drift(profile, truths["A"])}
    for w, truth in truths.items():
        res[w] = {"uncalibrated": score(cluster, truth, Params()),
                  "calibrated": score(cluster, truth, profile.params, profile), "self": self_agreement(truth, estimator),
                  "others": {e: score(cluster, truth_by(raw[w], e), profile.params, profile) for e in others}}
    return res


def rescore(folder: Path, estimator: str = "fastest") -> list[dict]:
    """``--rescore``: judge the truth and tune kept by ``--keep`` in ``folder`` again with this code (nothing run)."""
    from sp_plan.planner.cluster import Cluster

    out = []
    for d in sorted(p for p in folder.iterdir() if p.name in WORLDS and has_tune(p)):
        truths = {w: read_json(d, f"truth-{w}.json") for w in WORKLOADS}
        profile = kept_profile(d)
        cluster = Cluster.load(d / "cluster.yaml")
        out.append(judge(d.name, WORLDS[d.name][0], cluster, truths, profile, float("nan"), float("nan"), estimator))
        if has_json(d, H2H):
            out[-1]["head_to_head"] = judge_head_to_head(cluster, truths["A"], profile, read_json(d, H2H))
    return out


def recheck(args, tmp: Path) -> None:
    """``--recheck``: measure again, ``--repeats`` passes, the ``--layouts`` layouts of workload A whose kept passes
    (``--truth``) disagree most, and print each one's kept passes, their fastest and median, and the new readings'
    median: which of the two estimators a later measurement bears out."""
    for name in args.worlds.split(","):
        world, per_node, rate = WORLDS[name]
        kept = Path(args.truth) / name
        truth = [t for t in read_json(kept, "truth-A.json")
                 if t["status"] == "ok" and len(t.get("detail", {}).get("readings_s", ())) > 1]
        spread = sorted(truth, key=lambda t: -statistics.median(t["detail"]["readings_s"]) / min(t["detail"]["readings_s"]))
        pick = spread[:args.layouts] + spread[max(args.layouts, len(spread) - 2):]  # the most disputed, two agreed
        cwd = tmp / name
        cwd.mkdir(parents=True, exist_ok=False)
        shutil.copy(kept / "cluster.yaml", cwd / "cluster.yaml")
        with _hosts(rate) as pair:
            _run(_truth_argv(args, "A", cwd / "again.json", [t["summary"] for t in pick]), world, per_node, cwd, pair)
        again = {t["summary"]: t["detail"].get("readings_s", []) for t in json.loads((cwd / "again.json").read_text())
                 if t["status"] == "ok"}
        print(f"\n{name}: kept passes ({args.truth}) against {args.repeats} new ones, workload A, seconds")
        print(f"{'layout':<58} {'kept passes':<22} {'fastest':>7} {'median':>7} {'new median':>10} {'fastest':>8} {'median':>7}")
        for t in pick:
            r, new = t["detail"]["readings_s"], statistics.median(again.get(t["summary"]) or [float("nan")])
            print(f"{t['summary'][:58]:<58} {', '.join(f'{x:.3f}' for x in r):<22} {min(r):>7.3f} "
                  f"{statistics.median(r):>7.3f} {new:>10.3f} {min(r) / new - 1:>+8.1%} {statistics.median(r) / new - 1:>+7.1%}")
        print("last two columns: the kept fastest and median pass against the new readings' median")


def add_readings(truth: list[dict], more: dict[str, list[float]]) -> list[dict]:
    """``truth`` with each layout's readings in ``more`` (by summary) added after its own (a row without readings
    counts its ``measured_s`` as one); ``measured_s`` is left as written (``truth_by`` reads the readings)."""
    out = []
    for t in truth:
        extra = more.get(t["summary"])
        if extra:
            d = t.get("detail", {})
            t = dict(t, detail=dict(d, readings_s=list(d.get("readings_s", [t["measured_s"]])) + list(extra)))
        out.append(t)
    return out


#: a kept world's tune as packed (``--pack``): the stored profile exported as YAML, gzipped
PROFILE = "profile.yaml.gz"


def has_json(folder: Path, name: str) -> bool:
    """Whether ``folder`` holds ``name`` (a --keep folder) or ``name``.gz (packed)."""
    return (folder / name).exists() or (folder / f"{name}.gz").exists()


def kept_bytes(folder: Path, name: str) -> bytes:
    """``name`` of a kept world's folder, as written by --keep (plain) or by --pack (gzipped)."""
    plain = folder / name
    return plain.read_bytes() if plain.exists() else gzip.decompress((folder / f"{name}.gz").read_bytes())


def read_json(folder: Path, name: str):
    """``name`` of a kept world's folder (``kept_bytes``), parsed."""
    return json.loads(kept_bytes(folder, name))


def has_tune(folder: Path) -> bool:
    """Whether a kept world's folder holds a tune: its store (--keep) or its profile (packed)."""
    return (folder / "store.db").exists() or (folder / PROFILE).exists()


def kept_profile(folder: Path):
    """The profile of a kept world's tune: the one in its store (--keep), or its packed profile."""
    from sp_plan.planner.profile import Profile
    from sp_plan.planner.yamlio import model_from_data, yaml_load
    from sp_plan.profiles.store import Store

    if (folder / "store.db").exists():
        return Store(f"sqlite:///{folder / 'store.db'}").list_profiles()[0]
    return model_from_data(Profile, yaml_load(gzip.decompress((folder / PROFILE).read_bytes()).decode()), "profile",
                           str(folder / PROFILE))


def copy_kept(kept: Path, out: Path) -> None:
    """A kept world's folder (cluster file, truths, head-to-head readings, tune log, store or packed profile) copied
    to ``out``, its JSON as --keep writes it (plain), so that a reread's readings replace the truth there."""
    out.mkdir(parents=True, exist_ok=False)
    for f in [H2H] + [f"truth-{w}.json" for w in WORKLOADS]:
        if has_json(kept, f):
            (out / f).write_bytes(kept_bytes(kept, f))
    for f in ["cluster.yaml", "tune.log", PROFILE] + [f"store.db{x}" for x in ("", "-wal", "-shm")]:
        if (kept / f).exists():
            shutil.copy(kept / f, out / f)


def pack(folder: Path) -> list[Path]:
    """``--pack``: each world of a --keep folder as benchmarks/truths keeps it: its JSON gzipped, its store's profile
    exported as gzipped YAML (``PROFILE``) in place of the SQLite store; the cluster file and tune log left as they
    are. Returns the files written."""
    from sp_plan.planner.yamlio import yaml_dump

    written = []
    for d in sorted(p for p in folder.iterdir() if p.name in WORLDS):
        for f in sorted(d.glob("*.json")):
            written.append(_gzip_to(d / f"{f.name}.gz", f.read_bytes()))
            f.unlink()
        if (d / "store.db").exists():
            profile = kept_profile(d)
            text = yaml_dump(profile.model_dump(mode="json", exclude_none=True))
            written.append(_gzip_to(d / PROFILE, text.encode()))
            for x in ("", "-wal", "-shm"):
                (d / f"store.db{x}").unlink(missing_ok=True)
    return written


def _gzip_to(path: Path, data: bytes) -> Path:
    """``data`` gzipped to ``path``, byte for byte the same for the same data (no timestamp)."""
    path.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    return path


def decisive(folder: Path, truth: list[dict], n: int, estimator: str, pick: bool = False) -> list[str]:
    """The layouts that decide a regret: the truth's ``n`` fastest (``estimator``), the kept tune's calibrated
    3 fastest, and with ``pick`` the tune's pick (its best measured) and `sp-plan plan`'s with the profile."""
    from sp_plan.planner.cluster import Cluster
    from sp_plan.planner.plan import Plan
    from sp_plan.profiles.tune.pool import predict

    ok = sorted(truth_by([t for t in truth if t["status"] == "ok"], estimator), key=lambda t: t["measured_s"])
    cluster = Cluster.load(folder / "cluster.yaml")
    profile = kept_profile(folder)
    model = sorted(ok, key=lambda t: predict(cluster, Plan.model_validate(t["plan"]), profile.params)[0])
    names = [t["summary"] for t in ok[:n] + model[:3]]
    if pick:
        names += [p for p in picks(cluster, truth, profile).values() if p]
    return list(dict.fromkeys(names))


def picks(cluster, truth: list[dict], profile) -> dict[str, str | None]:
    """The layouts each party would run, among the truth's that fit: the uncalibrated model's best, the calibrated
    model's, `sp-plan plan`'s with the profile (a layout tune measured at its measurement) and tune's (its best
    measured)."""
    from sp_plan.planner.params import Params
    from sp_plan.planner.plan import Plan
    from sp_plan.profiles.tune.pool import predict

    plans = {t["summary"]: Plan.model_validate(t["plan"]) for t in truth if t["status"] == "ok"}
    cal = {n: predict(cluster, p, profile.params)[0] for n, p in plans.items()}
    ranked = plan_ranking(profile, plans, cal)
    return {"model": min(plans, key=lambda n: predict(cluster, plans[n], Params())[0]),
            "calibrated": min(cal, key=cal.get), "plan": min(ranked, key=ranked.get),
            "tune": tune_pick(profile, plans)}


#: the head-to-head readings of a kept world (``--head-to-head``), beside its truths
H2H = "head-to-head-A.json"


def head_to_head_times(readings: dict) -> dict:
    """Each layout's head-to-head time (its median step over its round's median step, pooled over every launch's
    rounds; profiles/tune/head_to_head.relative) and the same of each launch alone (its spread)."""
    from sp_plan.profiles.tune.head_to_head import relative

    names, launches = readings["layouts"], readings["launches"]
    each = [relative(steps) for steps in launches]
    pooled = {n: statistics.median(x for rel in each for x in rel[i]) for i, n in enumerate(names)}
    per_launch = [{n: statistics.median(rel[i]) for i, n in enumerate(names)} for rel in each]
    return {"pooled": pooled, "launches": per_launch,
            "rounds": sum(len(steps[0]) for steps in launches),
            "step_s": {n: statistics.median(x for steps in launches for x in steps[i]) for i, n in enumerate(names)}}


def judge_head_to_head(cluster, truth: list[dict], profile, readings: dict) -> dict:
    """The regret of each party's pick (``picks``) under the head-to-head times of the layouts read (None where its
    pick was not read), pooled and launch by launch; and the median error of the model's step time, uncalibrated and
    calibrated, against the layouts' median head-to-head steps (full depth: no scaling from fewer layers)."""
    from sp_plan.planner.params import Params
    from sp_plan.planner.plan import Plan
    from sp_plan.profiles.tune.head_to_head import regret
    from sp_plan.profiles.tune.pool import predict

    h = head_to_head_times(readings)
    who = picks(cluster, truth, profile)
    plans = {t["summary"]: Plan.model_validate(t["plan"]) for t in truth if t["summary"] in h["step_s"]}
    err = {k: statistics.median(abs(predict(cluster, plans[n], params)[0] / h["step_s"][n] - 1) for n in plans)
           for k, params in (("uncalibrated", Params()), ("calibrated", profile.params))}
    pooled = {k: regret(h["pooled"], n) if n in h["pooled"] else None for k, n in who.items()}
    each = {k: [regret(t, n) for t in h["launches"]] if n in h["pooled"] else None for k, n in who.items()}
    return {**h, "picks": who, "regret": pooled, "regret_launches": each, "step_err": err,
            "best": min(h["pooled"], key=h["pooled"].get)}


def head_to_head_run(args) -> list[dict]:
    """``--head-to-head K``: read the layouts that decide ``--truth``'s regret (``decisive``: its ``--reread`` N
    fastest, default 4, the tune's calibrated 3 fastest, its pick and `sp-plan plan`'s) head to head, ``--rounds``
    rounds in each of K launches of the world; keep the folder with the readings (``H2H``) under ``--keep`` and judge
    it (as ``--rescore`` would)."""
    for name in args.worlds.split(","):
        world, per_node, rate = WORLDS[name]
        kept, out = Path(args.truth).resolve() / name, Path(args.keep).resolve() / name
        copy_kept(kept, out)
        truth = read_json(kept, "truth-A.json")
        names = decisive(out, truth, args.reread or 4, args.truth_estimator, pick=True)
        model, seq = WORKLOADS["A"]
        launches = []
        for k in range(args.head_to_head):
            part = out / f"h2h-{k}.json"
            with _hosts(rate) as pair:
                _run([str(HERE), "--worker", "head-to-head", "--cluster", "cluster.yaml", "--model", model,
                      "--seq-len", seq, "--out", str(part), "--rounds", str(args.rounds), "--warmup",
                      str(args.warmup), "--only", ";".join(names)], world, per_node, out, pair)
            launches.append(json.loads(part.read_text())["steps"])
            part.unlink()
            print(f"{name}: launch {k + 1}/{args.head_to_head}: {len(names)} layouts, {args.rounds} rounds", flush=True)
        (out / H2H).write_text(json.dumps({"layouts": names, "launches": launches}))
    return rescore(Path(args.keep), args.truth_estimator)


def reread(args) -> list[dict]:
    """``--reread N``: read again, ``--repeats`` passes, the N layouts of ``--truth``'s workload A that are fastest
    (``--truth-estimator``) and the kept tune's calibrated 3 fastest, and keep the folder under ``--keep`` with those
    readings added to the truth; then judge it (as ``--rescore`` would). A regret decided by layouts a few percent
    apart is only as good as their readings: this reads them as often as a many-pass truth would, the rest once."""
    for name in args.worlds.split(","):
        world, per_node, rate = WORLDS[name]
        kept, out = Path(args.truth).resolve() / name, Path(args.keep).resolve() / name
        copy_kept(kept, out)
        truth = read_json(kept, "truth-A.json")
        only = decisive(out, truth, args.reread, args.truth_estimator)
        with _hosts(rate) as pair:
            _run(_truth_argv(args, "A", out / "reread-A.json", only), world, per_node, out, pair)
        more = {t["summary"]: t["detail"].get("readings_s", []) for t in json.loads((out / "reread-A.json").read_text())
                if t["status"] == "ok"}
        (out / "truth-A.json").write_text(json.dumps(add_readings(truth, more)))
        print(f"{name}: {len(more)} of workload A's layouts read {args.repeats} more time(s), kept in {out}")
    return rescore(Path(args.keep), args.truth_estimator)


def report_head_to_head(h: dict) -> None:
    """The head-to-head lines of a world's report: each layout read, pooled and per launch, and each party's regret."""
    n = len(h["launches"])
    print(f"{'':<9} workload A head to head ({n} launch(es), {h['rounds']} rounds in all; a layout's step over its "
          f"round's median step, pooled, then launch by launch):")
    for name, t in sorted(h["pooled"].items(), key=lambda kv: kv[1]):
        who = ", ".join(k for k, v in h["picks"].items() if v == name)
        print(f"{'':<11} {t:6.3f}  ({' '.join(f'{x[name]:.3f}' for x in h['launches'])})  step {h['step_s'][name]:.3f} s"
              f"  {name}" + (f"   <- {who}" if who else ""))
    print(f"{'':<11} regret head to head: " + "; ".join(
        f"{k} {v:.1%} ({'/'.join(f'{x:.1%}' for x in h['regret_launches'][k])})" if v is not None else f"{k} not read"
        for k, v in h["regret"].items()))
    print(f"{'':<11} step err against these steps (median over the layouts read): "
          f"{h['step_err']['uncalibrated']:.1%} -> {h['step_err']['calibrated']:.1%}")


def report(results: list[dict]) -> None:
    print(f"\n{'world':<9} {'wl':<3} {'model':<13} {'n':>3} {'Spearman':>17} {'step err':>15} {'mem err':>15} "
          f"{'regret':>15} {'plan':>6} {'tuned':>5}")
    for r in results:
        for w in WORKLOADS:
            u, c = r[w]["uncalibrated"], r[w]["calibrated"]
            tag = "A (tuned)" if w == "A" else "B (transfer)"
            print(f"{r['world']:<9} {w:<3} {WORKLOADS[w][0]:<13} {u['n']:>3} {u['spearman']:>7.2f} -> {c['spearman']:>5.2f}"
                  f" {u['step_err']:>6.1%} -> {c['step_err']:>5.1%} {u['mem_err']:>6.1%} -> {c['mem_err']:>5.1%}"
                  f" {u['regret']:>6.1%} -> {c['regret']:>5.1%} {c['plan_regret']:>6.1%}"
                  f" {r['tuned'] if w == 'A' else '':>5}  {tag}")
        took = "" if r["tune_s"] != r["tune_s"] else (
            ("ground truth kept" if r["truth_s"] != r["truth_s"] else f"ground truth {r['truth_s']:.0f} s")
            + f", tune {r['tune_s']:.0f} s, ")
        print(f"{'':<9} {took}profile {r['profile']}; "
              f"regret of tune's pick (its best measured of {r['tuned']}): {r['pick_regret']:.1%}")
        for e in r.get("others", ()):
            o = {w: r[w]["others"][e] for w in WORKLOADS}
            print(f"{'':<9} truth by the {r['estimator']} estimator; by the {e} one instead, calibrated: "
                  + "; ".join(f"{w}: Spearman {o[w]['spearman']:.2f}, step err {o[w]['step_err']:.1%}, "
                              f"regret {o[w]['regret']:.1%}, plan {o[w]['plan_regret']:.1%}" for w in WORKLOADS))
        if r.get("drift"):
            print(f"{'':<9} host speed: tune's readings of its layouts / the truth's of the same layouts, median "
                  f"{r['drift']:.2f}")
        if r.get("head_to_head"):
            report_head_to_head(r["head_to_head"])
        agree = [(w, r[w].get("self")) for w in WORKLOADS if r[w].get("self")]
        if agree:
            print(f"{'':<9} the truth against itself: " + "; ".join(
                f"{w}: Spearman of each of {a['passes']} passes vs the others' {r.get('estimator', 'median')} "
                + "/".join(f"{x:.2f}" for x in a["spearman"]) + f", readings of a layout spread {a['spread']:.0%}"
                for w, a in agree))
    print("columns: uncalibrated -> calibrated; regret: the model's predicted best over the whole truth; plan: the "
          "regret of `sp-plan plan`'s pick with the profile (layouts tune measured rank at their measurement); "
          "transfer error = B's calibrated step err (profile tuned on A)")


def _launch_logged(argv: list[str], name: str, cwd: Path, pair, timeout: float) -> tuple[int, str, float]:
    """(exit code, rank 0's output, wall seconds) of ``python argv`` on world ``name``: under torchrun on this host
    as a user starts it, or on the two namespace hosts (``harness.netns``); the output goes into a file, never a
    terminal."""
    world, per_node, _ = WORLDS[name]
    t0 = time.monotonic()
    if pair is None:
        with open(cwd / "run.log", "w") as log:
            code = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                   str(world), *argv], cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout).returncode
        return code, (cwd / "run.log").read_text(), time.monotonic() - t0
    from harness import netns

    res = netns.launch(argv, world, per_node, cwd, pair, timeout)
    return max(abs(c) for c, _ in res), res[0][1], time.monotonic() - t0


def progress_lines(log: str) -> list[tuple[str, int, str, float, str]]:
    """The plain progress lines of a tune's log: (step, done, total, elapsed seconds, message)."""
    import re

    out = []
    for m in re.finditer(r"^\[tune\] (\w+) (\d+)/(\S+) elapsed (\d+):(\d\d) eta \S+: (.*)$", log, re.M):
        out.append((m[1], int(m[2]), m[3], int(m[4]) * 60 + int(m[5]), m[6]))
    return out


def step_times(lines: list[tuple]) -> dict[str, float]:
    """Each step's seconds, from its first progress line to its last."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for step, _, _, t, _ in lines:
        first.setdefault(step, t)
        last[step] = t
    return {s: last[s] - first[s] for s in first}


def budget_check_world(name: str, tmp: Path) -> dict:
    """One --budget-check run: discover, then tune as ``BUDGET_CHECKS`` says, judged from its log and its store."""
    from sp_plan.profiles.store import Store

    model, seq, budget, minutes = BUDGET_CHECKS[name]
    cwd = tmp / name
    cwd.mkdir(parents=True, exist_ok=False)
    store = f"sqlite:///{cwd / 'store.db'}"
    load = [os.getloadavg()[0]]
    with _hosts(WORLDS[name][2]) as pair:
        code, log, _ = _launch_logged(["-m", "sp_plan.cli.app", "discover", "-o", "cluster.yaml"], name, cwd, pair, 600)
        if code:
            raise RuntimeError(f"discover on {name} exited {code}:\n{log[-3000:]}")
        code, log, wall = _launch_logged(["-m", "sp_plan.cli.app", "tune", "--cluster", "cluster.yaml", "--model",
                                          model, "--seq-len", seq, "--budget", str(budget), "--max-minutes",
                                          f"{minutes:g}", "--store", store], name, cwd, pair, minutes * 60 + 600)
    load.append(os.getloadavg()[0])
    (cwd / "tune.log").write_text(log)
    lines = progress_lines(log)
    profiles = Store(store).list_profiles() if (cwd / "store.db").exists() else []
    prof = profiles[0] if profiles else None
    ok = [c for c in prof.candidates if c.status == "ok" and c.measured_s] if prof else []
    gaps = [b[3] - a[3] for a, b in zip(lines, lines[1:])]
    return {"world": name, "model": model, "seq_len": seq, "budget": budget, "max_minutes": minutes, "exit": code,
            "wall_s": wall, "within": wall <= minutes * 60 + BUDGET_SLACK_S, "load": load,
            "steps": step_times(lines), "progress_lines": len(lines), "longest_silence_s": max(gaps, default=None),
            "profile": prof.id if prof else None,
            "candidates": [{"layout": c.summary, "status": c.status, "measured_s": c.measured_s,
                            "wall_s": c.detail.get("wall_s"), "estimate_s": c.detail.get("estimate_s"),
                            "readings": len(c.detail.get("readings_s") or [1]), "iters": c.detail.get("iters"),
                            "steps_timed": c.detail.get("steps_timed")} for c in (prof.candidates if prof else [])],
            "fit_candidates": len(ok), "step_fit": bool(prof) and any("compute efficiency" in f for f in prof.fitted),
            "skipped": [ln for ln in log.splitlines() if not ln.startswith("[tune]") and (
                        " skipped: estimated" in ln or "kernel sweep trimmed" in ln
                        or ln.startswith("estimated ") or "a step-time fit needs are estimated" in ln
                        or ln.startswith("the step-time fit needs") or "not repeated: their readings agreed" in ln
                        or ln.startswith("candidates timed at") or "window call(s) of" in ln)],
            "spent": next((ln for ln in log.splitlines() if ln.startswith("spent ")), None)}


def report_budget_check(r: dict) -> None:
    """One --budget-check run as read."""
    mm = r["max_minutes"]
    print(f"\n{r['world']}: tune {r['model']} {r['seq_len']} --budget {r['budget']} --max-minutes {mm:g}: exit "
          f"{r['exit']}, whole command {r['wall_s'] / 60:.2f} min ({'within' if r['within'] else 'OVER'} "
          f"{mm:g} min + {BUDGET_SLACK_S:.0f} s); load average {r['load'][0]:.1f} before, {r['load'][1]:.1f} after")
    print("  steps (first to last progress line): " + ", ".join(f"{s} {t:.0f} s" for s, t in r["steps"].items()))
    print(f"  {r['progress_lines']} progress lines in the log, the longest silence {r['longest_silence_s']} s; "
          f"{r['spent'] or 'no spent line'}")
    for c in r["candidates"]:
        est = "-" if c["estimate_s"] is None else f"{c['estimate_s']:.0f} s"
        took = "-" if c["wall_s"] is None else f"{c['wall_s']:.0f} s"
        step = "-" if not c["measured_s"] else f"{c['measured_s']:.2f} s"
        timed = "" if not c.get("steps_timed") else ", steps timed " + ", ".join(
            f"{n} at {k} block(s)" for k, n in c["steps_timed"].items()) + f" of {c['iters']}"
        print(f"  candidate {c['layout']}: {c['status']}, step {step}, took {took} (estimated {est}), "
              f"{c['readings']} reading(s){timed}")
    for s in r["skipped"]:
        print(f"  left out: {s}")
    print(f"  profile {r['profile']}; step-time fit from {r['fit_candidates']} candidates: "
          f"{'yes' if r['step_fit'] and r['fit_candidates'] >= 3 else 'NO'} (at least 3, compute efficiency fitted)")


def budget_check(args) -> list[dict]:
    """--budget-check over ``args.worlds`` (those of ``BUDGET_CHECKS``); namespaces skipped where unavailable."""
    results = []
    with tempfile.TemporaryDirectory(prefix="sp_plan_bench_budget_") as d:
        tmp = Path(args.keep or d)
        for name in runnable_worlds(args.worlds):
            results.append(budget_check_world(name, tmp))
            report_budget_check(results[-1])
    return results


def runnable_worlds(worlds: str):
    """The names in ``worlds`` (comma-separated) this machine can start; a namespace world is skipped, with why,
    where namespaces are unavailable."""
    for name in worlds.split(","):
        if WORLDS[name][2]:
            from harness import netns

            why = netns.unavailable()
            if why:
                print(f"{name}: skipped ({why})")
                continue
        yield name


def parser() -> argparse.ArgumentParser:
    """The benchmark's options: a measured run by default, or one of the modes that read a kept folder."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="local4,local8,netns2x2")
    ap.add_argument("--budget", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--layers", type=int, default=4, help="layers each candidate runs (1 and this many, then scaled)")
    ap.add_argument("--iters", type=int, default=5, help="timed steps per layer count (median)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (truth and tune alike)")
    ap.add_argument("--kernel-timing", default="auto", choices=("auto", "each", "shared"),
                    help="tune's --kernel-timing (how its kernel step times the kernels where ranks share cores)")
    ap.add_argument("--truth-estimator", default="fastest", choices=tuple(ESTIMATORS),
                    help="a layout's truth from its passes: the fastest (default; what tune keeps of a contender's "
                         "readings), the median, or blocked (the passes as blocks: a robust additive fit of the log "
                         "readings); the others are printed beside it")
    ap.add_argument("--json", default=None)
    ap.add_argument("--keep", default=None,
                    help="keep each world's cluster file, ground truth, tune log and store under this folder "
                         "(default: a temporary folder, removed)")
    ap.add_argument("--truth", default=None, help="take each world's cluster file and ground truth from this --keep "
                    "folder of an earlier run instead of measuring them (then tune and judge with this code)")
    ap.add_argument("--rescore", default=None, help="judge the truth and tune a --keep folder holds again, "
                    "with this code (nothing is measured)")
    ap.add_argument("--pack", default=None, metavar="DIR", help="turn a --keep folder into the form "
                    "benchmarks/truths keeps (JSON gzipped, the store's profile as gzipped YAML); nothing is measured")
    ap.add_argument("--recheck", action="store_true", help="measure again (--repeats passes) the --layouts layouts "
                    "of --truth's workload A whose passes disagree most, and two they agree on (nothing is tuned)")
    ap.add_argument("--layouts", type=int, default=8, help="--recheck: how many disputed layouts")
    ap.add_argument("--reread", type=int, default=None, metavar="N",
                    help="read again (--repeats passes) --truth's N fastest layouts of workload A and its tune's "
                         "calibrated 3 fastest; keep the folder with the readings added under --keep, and judge it")
    ap.add_argument("--head-to-head", type=int, default=None, metavar="K",
                    help="read --truth's decisive layouts of workload A (its --reread N fastest, default 4, the tune's "
                         "calibrated 3 fastest, its pick and `sp-plan plan`'s) head to head at full depth, --rounds "
                         "rounds in each of K launches; keep the folder with the readings under --keep, and judge it")
    ap.add_argument("--rounds", type=int, default=12, help="--head-to-head: rounds per launch (one step of each "
                    "layout a round)")
    ap.add_argument("--budget-check", action="store_true", help="run tune as a user does on each of --worlds "
                    f"(local4, local8, netns2x2: {BUDGET_CHECKS}) and judge whether it keeps --max-minutes")
    ap.add_argument("--only", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker", default=None)
    ap.add_argument("--cluster")
    ap.add_argument("--model")
    ap.add_argument("--seq-len")
    ap.add_argument("--out")
    return ap


def main() -> None:
    ap = parser()
    args = ap.parse_args()
    if args.worker:
        return {"truth": worker_truth, "head-to-head": worker_head_to_head}[args.worker](args)
    if args.pack:
        return pack_run(ap, args)
    if args.budget_check:
        return budget_check_run(ap, args)
    if args.rescore:
        print(f"bench_tune --rescore {args.rescore}: the kept truth and tune judged by this code")
        return report(rescore(Path(args.rescore), args.truth_estimator))
    if args.recheck:
        if not args.truth:
            ap.error("--recheck needs --truth DIR (a --keep folder of a run with --repeats 2 or more)")
        with tempfile.TemporaryDirectory(prefix="sp_plan_bench_recheck_") as d:
            return recheck(args, Path(d))
    if args.reread or args.head_to_head:
        check_kept(ap, args)
        return report(head_to_head_run(args) if args.head_to_head else reread(args))
    return measured_run(args)


def pack_run(ap: argparse.ArgumentParser, args) -> None:
    """--pack: a --keep folder in the form benchmarks/truths keeps."""
    if not Path(args.pack).is_dir() or not any(p.name in WORLDS for p in Path(args.pack).iterdir()):
        ap.error(f"--pack: {args.pack} holds no world's folder ({', '.join(WORLDS)}); name a --keep folder")
    for f in pack(Path(args.pack)):
        print(f"wrote {f}")


def budget_check_run(ap: argparse.ArgumentParser, args) -> None:
    """--budget-check: tune run as a user runs it on each world, judged against its --max-minutes."""
    if args.worlds == ap.get_default("worlds"):
        args.worlds = "local4,netns2x2"
    print(f"bench_tune --budget-check at commit {commit()}, {os.cpu_count()} CPU cores, {os.uname().nodename}")
    results = budget_check(args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def check_kept(ap: argparse.ArgumentParser, args) -> None:
    """--reread and --head-to-head read a kept truth and tune (--truth) and write a new folder (--keep)."""
    flag = "--head-to-head K" if args.head_to_head else "--reread N"
    if not (args.truth and args.keep):
        ap.error(f"{flag} needs --truth DIR (a --keep folder with a tune) and --keep NEW")
    for name in args.worlds.split(","):
        kept, new = Path(args.truth) / name, Path(args.keep) / name
        if not ((kept / "cluster.yaml").exists() and has_json(kept, "truth-A.json") and has_tune(kept)):
            ap.error(f"--truth: {kept} holds no kept truth and tune (cluster.yaml, truth-A.json, store.db or "
                     f"{PROFILE}); name a --keep folder of an earlier run and its world with --worlds")
        if new.exists():
            ap.error(f"--keep: {new} exists; name a new folder")


def measured_run(args) -> None:
    """The default: each world's truth measured, tune run, and tune's pick judged against the truth."""
    print(f"bench_tune at commit {commit()}, {os.cpu_count()} CPU cores, tune --kernel-timing {args.kernel_timing}")
    results = []
    with tempfile.TemporaryDirectory(prefix="sp_plan_bench_tune_") as d:
        if args.keep:
            d = args.keep
            Path(d).mkdir(parents=True, exist_ok=True)
        for name in runnable_worlds(args.worlds):
            results.append(bench_world(name, args, Path(d)))
            report(results[-1:])
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    report(results)


if __name__ == "__main__":
    sys.exit(main())
