"""`sp-plan tune`: profile the running cluster once (under torchrun), store the profile, write the best measured plan."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from sp_plan.cli.console import err, out, print_error
from sp_plan.planner.errors import PlanError
from sp_plan.planner.yamlio import check_writable



def _secs(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.3f} s"


def _gib(x: float | None) -> str:
    return "-" if x is None else f"{x / 2**30:.2f} GiB"


def _err(pred: float | None, meas: float | None) -> str:
    return "-" if not pred or not meas else f"{(pred - meas) / meas:+.0%}"


def candidates_table(profile) -> Table:
    """Every measured candidate: predicted before and after calibration, measured; time and peak memory."""
    t = Table(title="measured candidates (predicted before -> after calibration, measured)")
    for c in ("#", "layout", "status", "step before", "step after", "measured", "err after", "mem before",
              "mem after", "mem measured", "note"):
        t.add_column(c, justify="left" if c in ("layout", "status", "note") else "right")
    for i, c in enumerate(profile.candidates):
        note = c.reason if c.status != "ok" else "; ".join(str(v) for k, v in c.detail.items() if k == "fallbacks" and v)
        if c.status == "ok" and len(c.detail.get("readings_s", ())) > 1:  # read again (tune's reread or confirm)
            r = c.detail["readings_s"]
            note = f"fastest of {len(r)}: " + ", ".join(_secs(x) for x in r) + (f"; {note}" if note else "")
        if c.status != "ok" and c.rank is not None:
            note = f"rank {c.rank}: {note}"
        t.add_row(str(i + 1), c.summary, c.status, _secs(c.predicted_before_s), _secs(c.predicted_after_s),
                  _secs(c.measured_s), _err(c.predicted_after_s, c.measured_s), _gib(c.predicted_memory_before),
                  _gib(c.predicted_memory_after), _gib(c.measured_memory), escape(note[:80]))
    return t


def _world() -> bool:
    """Join torchrun's world, or make a world of one on this host when not under torchrun."""
    from sp_plan.runtime import probe
    from sp_plan.runtime.spawn import free_port

    if not probe.under_torchrun():
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK="0",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    return probe.init_world(120.0)


def tune_cmd(
    cluster: str = typer.Option(..., "--cluster", help="cluster file from `sp-plan discover` (or a preset name)"),
    nodes: Optional[int] = typer.Option(None, "--nodes", help="node count for a preset", show_default="1"),
    model: str = typer.Option(..., "--model", help="model preset name or model YAML file"),
    seq_len: str = typer.Option(..., "--seq-len", help="tokens per sequence: 131072, 128k or 1m"),
    batch: int = typer.Option(1, "--batch", help="global batch (sequences per step)"),
    causal: bool = typer.Option(True, "--causal/--no-causal", help="causal (decoder) or full attention"),
    inference: bool = typer.Option(False, "--inference", help="forward only"),
    budget: int = typer.Option(5, "--budget", help="candidates to measure at most"),
    max_minutes: float = typer.Option(30.0, "--max-minutes", help="stop choosing candidates after this long"),
    candidate_timeout: float = typer.Option(600.0, "--candidate-timeout", help="seconds one candidate may run"),
    store: Optional[str] = typer.Option(None, "--store", help="SQLAlchemy URL of the profile store",
                                        show_default="$SP_PLAN_STORE, else SQLite in the user data directory"),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="write the best measured plan here",
                                          show_default="store the profile only"),
    layers: int = typer.Option(2, "--layers", help="layers each candidate runs (the model's others are scaled)"),
    iters: int = typer.Option(3, "--iters", help="timed steps per candidate (median)"),
    confirm: int = typer.Option(2, "--confirm", help="readings more of the best measured candidate and the "
                                "runners-up within 10 % of it, or within the model's leave-one-out error and then the spread of their "
                                "readings where wider (3 at most), each kept at its fastest reading (0: one reading each)"),
    reread: int = typer.Option(2, "--reread", help="candidates read once whose step reads far slower than the model "
                               "fitted to the others predicts it (over max(10 %, 2 x the leave-one-out error)), read "
                               "once more and kept at their faster reading, this many at most (0: none)"),
    warmup: int = typer.Option(1, "--warmup", help="untimed steps before them"),
    pool: int = typer.Option(12, "--pool", help="distinct layouts the choice draws from"),
    kernel_timing: str = typer.Option("auto", "--kernel-timing", help="each: every rank times each kernel as it gets "
                                      "there (median of 3); shared: all ranks time each kernel at once in one window "
                                      "(full contention where ranks share cores); auto: shared on CPU ranks, each on "
                                      "GPUs"),
    link_sizes: Optional[str] = typer.Option(None, "--link-sizes", help="message sizes for the link step, e.g. 64K,1M",
                                             show_default="16K..4M on CPU, 1M..256M on GPU"),
    server: Optional[str] = typer.Option(None, "--server", help="also upload the profile to a planner service "
                                         "(`sp-plan serve`) at this URL (token: $SP_PLAN_TOKEN)",
                                         show_default="store locally only"),
) -> None:
    """Measure links, kernels and the best candidates on this cluster; calibrate; store the profile."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    from sp_plan.runtime import probe

    from sp_plan.planner.model import Workload, parse_seq_len
    from sp_plan.profiles import load_cluster, load_model

    rank, owned, st, upload_failed = 0, False, None, False
    try:
        if output:
            check_writable(output)
        for flag, v in (("--budget", budget), ("--iters", iters), ("--layers", layers), ("--pool", pool), ("--batch", batch)):
            if v < 1:
                raise PlanError(flag, f"must be at least 1, got {v}", f"pass {flag} 1 or more")
        for flag, v in (("--warmup", warmup), ("--confirm", confirm), ("--reread", reread)):
            if v < 0:
                raise PlanError(flag, f"must be 0 or more, got {v}", f"pass {flag} 0 or more")
        if kernel_timing not in ("auto", "each", "shared"):
            raise PlanError("--kernel-timing", f"unknown timing {kernel_timing!r}", "pass auto, each or shared")
        if max_minutes <= 0 or candidate_timeout <= 0:
            raise PlanError("--max-minutes" if max_minutes <= 0 else "--candidate-timeout", "must be positive",
                            "pass a positive number")
        c = load_cluster(cluster, nodes)
        m = load_model(model)
        w = Workload(seq_len=parse_seq_len(seq_len), batch=batch, causal=causal, training=not inference)
        from sp_plan.cli.discover import parse_sizes
        from sp_plan.profiles.tune.run import TuneOptions, check_world, tune

        opts = TuneOptions(budget=budget, max_minutes=max_minutes, candidate_timeout=candidate_timeout, pool=pool,
                           layers=layers, iters=iters, warmup=warmup, confirm=confirm, reread=reread,
                           kernel_timing=kernel_timing,
                           link_sizes=parse_sizes(link_sizes) if link_sizes else None)
        owned = _world()
        rank = probe.dist.get_rank()
        check_world(c, probe.dist.get_world_size())  # before the store: a refused tune creates no store file
        problem = None
        if rank == 0:
            try:
                from sp_plan.profiles.store import Store

                st = Store(store)
            except PlanError as e:
                problem = (e.field, e.problem, e.fix)
        box = [problem]
        probe.dist.broadcast_object_list(box, src=0)
        if box[0]:
            raise PlanError(*box[0])
    except PlanError as e:
        if rank == 0:
            print_error(str(e))
        probe.finish(owned)
        raise typer.Exit(2)

    try:
        if rank == 0:
            out.print(f"[bold]tune[/] {c.name} ({c.world_size} ranks, topology {c.topology_fingerprint()}), {m.name}, "
                      f"{w.seq_len:,} tokens x {w.batch}, {'training' if w.training else 'inference'}; store {st.shown}",
                      highlight=False)
            with Progress(TextColumn("{task.fields[step]:>10}"), BarColumn(), MofNCompleteColumn(),
                          TextColumn("{task.description}"), TimeElapsedColumn(), console=err) as prog:
                tasks = {s: prog.add_task("", total=None, step=s) for s in ("links", "kernels", "candidates")}
                for later in ("reread", "confirm"):  # shown once they have something to read
                    tasks[later] = prog.add_task("", total=None, step=later, visible=False)
                tick = lambda step, i, n, label: prog.update(tasks[step], completed=i, total=n,  # noqa: E731
                                                             description=escape(label[:90]), visible=True)
                report = tune(c, m, w, st, opts, tick)
        else:
            report = tune(c, m, w, None, opts)
    except PlanError as e:
        if rank == 0:
            print_error(str(e))
        probe.finish(owned)
        raise typer.Exit(2)
    except Exception as e:  # noqa: BLE001 - a dead rank or broken world: what was measured is in the store
        if rank == 0:
            print_error(f"the tune stopped: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}; "
                        "everything measured so far is stored: run the same command again to resume")
        raise typer.Exit(1)
    if rank == 0:
        p = report.profile
        if report.resumed:
            out.print(f"resumed run {report.run_id}: reused {', '.join(report.reused) or 'nothing'}")
        out.print("software stack: " + ", ".join(f"{k} {v}" for k, v in p.stack.items() if v), highlight=False)
        out.print(candidates_table(p))
        before = "n/a" if p.loo_error_before is None else f"{p.loo_error_before:.1%}"
        after = "n/a" if p.loo_error_after is None else f"{p.loo_error_after:.1%}"
        out.print(f"leave-one-out step-time error: {before} uncalibrated -> {after} calibrated", highlight=False)
        if p.loo_memory_error_after is not None:
            out.print(f"leave-one-out peak-memory error: {p.loo_memory_error_before:.1%} uncalibrated -> "
                      f"{p.loo_memory_error_after:.1%} calibrated", highlight=False)
        out.print("fitted: " + ("; ".join(p.fitted) or "nothing (no candidate ran)"), highlight=False)
        for note in report.not_fitted:  # "... not fitted: why"
            out.print(note, highlight=False)
        out.print(f"stopped: {report.stop_reason}", highlight=False)
        out.print(f"stored profile [bold]{p.id}[/] in {st.shown}", highlight=False)
        if server:
            from sp_plan.client import Client  # noqa: PLC0415

            try:
                out.print(f"uploaded profile {Client.from_env(server).upload_profile(p)} to {server}", highlight=False)
            except PlanError as e:  # the profile is stored locally: say so, and how to upload it later
                print_error(f"{e} (the profile is in {st.shown}: upload it later with "
                            f"`sp-plan profile export {p.id} -o p.yaml` and `sp-plan profile import p.yaml --server URL`)")
                upload_failed = True
        if output and report.best is not None:
            report.best.save(output)
            out.print(f"wrote {output}: {report.best.summary()} measured {_secs(report.best.measured.step_time_s)}, "
                      f"predicted {_secs(report.best.predicted.step_time_s)}", highlight=False)
        elif output:
            err.print("[yellow]no candidate ran successfully; no plan written[/]")
    probe.dist.barrier()
    probe.finish(owned)
    if upload_failed:
        raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    app.command("tune")(tune_cmd)
