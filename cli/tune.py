"""`sp-plan tune`: profile the running cluster once (under torchrun), store the profile, write the best measured plan."""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Literal, Optional

import typer
from rich.markup import escape
from rich.table import Table

from sp_plan.cli.console import as_flag, check_positive, err, out, print_error
from sp_plan.cli.workload import workload_mask_options
from sp_plan.planner.errors import PlanError
from sp_plan.planner.model import MAX_BATCH
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


def attention_table(profile) -> Table:
    """Packed candidates: one layer's attention (forward + backward) under the mask, measured against predicted."""
    t = Table(title="attention under the mask, one layer forward + backward (measured on packed batches)")
    for c in ("layout", "predicted before", "predicted after", "measured", "err after", "work max/mean"):
        t.add_column(c, justify="left" if c == "layout" else "right")
    for c in profile.candidates:
        a = c.detail.get("attention")
        if not a:
            continue
        t.add_row(escape(c.summary), _secs(a.get("predicted_before_s")), _secs(a.get("predicted_after_s")),
                  _secs(a.get("measured_s")), _err(a.get("predicted_after_s"), a.get("measured_s")),
                  "-" if a.get("imbalance") is None else f"{a['imbalance']:.2f}")
    return t


def _world() -> bool:
    """Join torchrun's world, or make a world of one on this host when not under torchrun."""
    from sp_plan.profiles.discover import probe
    from sp_plan.runtime.spawn import free_port

    if not probe.under_torchrun():
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK="0",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    return probe.init_world(120.0)


def workload_of(seq_len: str, batch: int, causal: bool, inference: bool, documents: str | None,
                window: str | int | None, pattern: str | None, seed: int | None):
    """The tuned Workload from the flags, through the mask resolution plan and estimate use (cli/workload.py):
    packed ``--documents`` (a file of lengths or a named distribution) and a sliding ``--window`` (on every layer,
    or the local layers of ``--window-pattern``); errors name the flag."""
    from sp_plan.cli.workload import masked_workload
    from sp_plan.planner.model import parse_seq_len

    fields = {"seq_len": parse_seq_len(seq_len), "batch": batch, "causal": causal, "training": not inference}
    return masked_workload(fields, documents, window, pattern, seed)


def _check_flags(output, max_minutes: float, candidate_timeout: float, quiet: bool, as_json: bool) -> None:
    """The flags typer's declarations (ranges, choices) cannot check, or a PlanError naming the flag: a writable
    output, the two times positive and finite (typer bounds a range on closed ends only, and reads nan and inf),
    --quiet with --json."""
    if output:
        check_writable(output)
    check_positive("--max-minutes", max_minutes)
    check_positive("--candidate-timeout", candidate_timeout)
    if quiet and as_json:
        raise PlanError("--quiet", "and --json both say what to print", "pass one of them")


def _open_store(store: Optional[str], rank: int):
    """Rank 0's store, every rank learning whether it opened (a refused store is exit 2 everywhere)."""
    from sp_plan.profiles.discover import probe

    st, problem = None, None
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
    return st


def _fail(rank: int, prog, e: PlanError | str, owned: bool | None = None, code: int = 2):
    """The one error line (rank 0; and the JSON error event), the world left (where one was joined: ``owned`` not
    None), exit ``code``."""
    if rank == 0:
        print_error(e)
        if prog is not None:
            prog.error(str(as_flag(e)) if isinstance(e, PlanError) else e)
    if owned is not None:
        from sp_plan.profiles.discover import probe  # torch: only where a world was joined

        probe.finish(owned)
    raise typer.Exit(code)


def _header(c, m, w, st) -> str:
    """The first line a tune prints: what it tunes, where it stores."""
    masks = ""
    if w.documents is not None:
        masks += f", packed documents ({getattr(w.documents, 'name', None) or w.documents.kind}, seed {w.seed})"
    if w.window is not None:
        masks += f", window {w.window.size}" + (f" on {w.window.pattern}" if w.window.pattern else "")
    return (f"[bold]tune[/] {c.name} ({c.world_size} ranks, topology {c.topology_fingerprint()}), {m.name}, "
            f"{w.seq_len:,} tokens x {w.batch}{masks}, {'training' if w.training else 'inference'}; store {st.shown}")


def _after_header(prog, head: str | None):
    """``prog`` that prints ``head`` before its first tick (a tune refused before measuring prints only its error)."""
    said = [head is None]

    def tick(*a) -> None:
        if not said[0]:
            said[0] = True
            out.print(head, highlight=False)
        prog(*a)
    return tick


def result_event(report, st, output: Optional[Path]) -> dict:
    """The tune's result as one JSON-ready dict (``--json``'s final event)."""
    p, best = report.profile, report.best
    cands = [{"layout": c.summary, "status": c.status, "measured_s": c.measured_s,
              "predicted_after_s": c.predicted_after_s, "reason": c.reason or None,
              **({"attention": c.detail["attention"]} if c.detail.get("attention") else {})} for c in p.candidates]
    return {"profile": p.id, "store": st.shown, "stop": report.stop_reason, "candidates": cands,
            "loo_error_before": p.loo_error_before, "loo_error_after": p.loo_error_after, "fitted": list(p.fitted),
            "not_fitted": report.not_fitted, "skipped": report.skipped, "budget": report.budget_notes,
            "best": None if best is None else {"layout": best.summary(), "measured_s": best.measured.step_time_s,
                                               "predicted_s": best.predicted.step_time_s},
            "output": str(output) if output and best is not None else None}


def _print_report(report, st) -> None:
    """The tune's story on stdout: candidates, fits, what the budget left out, the stored profile."""
    p = report.profile
    if report.resumed:
        out.print(f"resumed run {report.run_id}: reused {', '.join(report.reused) or 'nothing'}")
    out.print("software stack: " + ", ".join(f"{k} {v}" for k, v in p.stack.items() if v), highlight=False)
    out.print(candidates_table(p))
    if any(c.detail.get("attention") for c in p.candidates):
        out.print(attention_table(p))
    before = "n/a" if p.loo_error_before is None else f"{p.loo_error_before:.1%}"
    after = "n/a" if p.loo_error_after is None else f"{p.loo_error_after:.1%}"
    out.print(f"leave-one-out step-time error: {before} uncalibrated -> {after} calibrated", highlight=False)
    if p.loo_memory_error_after is not None:
        out.print(f"leave-one-out peak-memory error: {p.loo_memory_error_before:.1%} uncalibrated -> "
                  f"{p.loo_memory_error_after:.1%} calibrated", highlight=False)
    out.print("fitted: " + ("; ".join(p.fitted) or "nothing (no candidate ran)"), highlight=False)
    for note in [*report.not_fitted, *report.skipped, *report.budget_notes]:
        out.print(escape(note), highlight=False, soft_wrap=True)  # one line a note, also in a log
    out.print(f"stopped: {report.stop_reason}", highlight=False)


def _upload(p, st, server: str) -> bool:
    """Upload the profile to a planner service; False (said, with how to upload later) where that fails."""
    from sp_plan.client import Client  # noqa: PLC0415

    try:
        out.print(f"uploaded profile {Client.from_env(server).upload_profile(p)} to {server}", highlight=False)
        return True
    except PlanError as e:  # the profile is stored locally: say so, and how to upload it later
        print_error(f"{e} (the profile is in {st.shown}: upload it later with "
                    f"`sp-plan profile export {p.id} -o p.yaml` and `sp-plan profile import p.yaml --server URL`)")
        return False


def _write_best(report, output: Path, loud: bool) -> None:
    """The best measured plan into ``output`` (said unless ``loud`` is False, where there is none)."""
    if report.best is None:
        err.print("[yellow]no candidate ran successfully; no plan written[/]")
        return
    report.best.save(output)
    if loud:
        out.print(f"wrote {output}: {report.best.summary()} measured {_secs(report.best.measured.step_time_s)}, "
                  f"predicted {_secs(report.best.predicted.step_time_s)}", highlight=False)


# the mask flags of plan and estimate (cli/workload.py); tune runs its candidates on packs drawn from them
_TUNE_MASK = workload_mask_options()


class Flag:
    """tune's options, one per flag, declared once (tune_cmd's signature names them)."""

    cluster = typer.Option(..., "--cluster", help="cluster file from `sp-plan discover` (or a preset name)")
    nodes = typer.Option(None, "--nodes", min=1, help="node count for a preset", show_default="1")
    model = typer.Option(..., "--model", help="model preset name or model YAML file")
    seq_len = typer.Option(..., "--seq-len", help="tokens per sequence: 131072, 128k or 1m")
    batch = typer.Option(1, "--batch", min=1, max=MAX_BATCH, help="global batch (sequences per step)")
    causal = typer.Option(True, "--causal/--no-causal", help="causal (decoder) or full attention")
    inference = typer.Option(False, "--inference", help="forward only")
    budget = typer.Option(5, "--budget", min=1, help="candidates to measure at most")
    max_minutes = typer.Option(30.0, "--max-minutes", help="the whole tune's time: links, kernels, the round probe, "
                               "candidates, reread and confirm; a candidate whose estimate does not fit what is left "
                               "is skipped, one running past it is stopped")
    candidate_timeout = typer.Option(600.0, "--candidate-timeout", help="seconds one candidate may run")
    store = typer.Option(None, "--store", help="SQLAlchemy URL of the profile store",
                         show_default="$SP_PLAN_STORE, else SQLite in the user data directory")
    output = typer.Option(None, "-o", "--output", help="write the best measured plan here",
                          show_default="store the profile only")
    layers = typer.Option(2, "--layers", min=1, help="layers each candidate runs (the model's others are scaled)")
    iters = typer.Option(3, "--iters", min=1, help="timed steps per candidate at most (median; fewer where the "
                         "last two readings agree within 5 %)")
    confirm = typer.Option(2, "--confirm", min=0, help="readings more of the best measured candidate and the runners-up "
                           "within 10 % of it, or within the model's leave-one-out error and then the spread of their "
                           "readings where wider (3 at most), each kept at its fastest reading (0: one reading each)")
    reread = typer.Option(2, "--reread", min=0, help="candidates read once whose step reads far slower than the model fitted "
                          "to the others predicts it (over max(10 %, 2 x the leave-one-out error)), read once more "
                          "and kept at their faster reading, this many at most (0: none)")
    warmup = typer.Option(1, "--warmup", min=0, help="untimed steps before them")
    pool = typer.Option(12, "--pool", min=1, help="distinct layouts the choice draws from")
    kernel_timing = typer.Option("auto", "--kernel-timing", help="each: every rank times each kernel as it gets "
                                 "there (median of up to 3, fewer where two agree within 5 %); shared: all ranks time each kernel at once in one window (full "
                                 "contention where ranks share cores); auto: shared on CPU ranks, each on GPUs")
    link_sizes = typer.Option(None, "--link-sizes", help="message sizes for the link step, e.g. 64K,1M",
                              show_default="16K..4M on CPU, 1M..256M on GPU")
    server = typer.Option(None, "--server", help="also upload the profile to a planner service (`sp-plan serve`) at "
                          "this URL (token: $SP_PLAN_TOKEN)", show_default="store locally only")
    quiet = typer.Option(False, "--quiet", help="print only the result (the stored profile, the plan written)")
    as_json = typer.Option(False, "--json", help="print JSON events, one object a line (rank 0): progress (event, "
                           "step, done, total, elapsed_s, eta_s, message), then a result or an error")


def process_started(clock=time.monotonic) -> float | None:
    """The reading of ``clock`` (monotonic) when this command started, where /proc says (else None): under torchrun
    its launcher's start, else this process's. --max-minutes counts from there, so the imports and the world's start
    are inside it."""
    pid = os.getppid() if os.environ.get("TORCHELASTIC_RUN_ID") else os.getpid()  # torchrun sets it in its workers
    try:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        age = float(Path("/proc/uptime").read_text().split()[0]) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return clock() - max(age, 0.0)


def _check_all(a: dict) -> None:
    """The flags of ``a`` (tune_cmd's arguments) that typer did not check, or a PlanError naming one: before torch is
    imported, so that a mistyped flag is answered at once."""
    _check_flags(a["output"], a["max_minutes"], a["candidate_timeout"], a["quiet"], a["as_json"])
    if a["link_sizes"]:
        from sp_plan.cli.discover import parse_sizes

        parse_sizes(a["link_sizes"], "--link-sizes")
    if a["server"]:  # the upload comes after the measuring: a mistyped URL is answered before it, not after
        from sp_plan.client import checked_url  # noqa: PLC0415 - httpx: only a tune that uploads loads it

        checked_url(a["server"])


def _options(a: dict):
    """The TuneOptions of the flags (``a``: tune_cmd's arguments, already checked)."""
    from sp_plan.cli.discover import parse_sizes
    from sp_plan.profiles.tune.run import TuneOptions

    return TuneOptions(**{k: a[k] for k in ("budget", "max_minutes", "candidate_timeout", "pool", "layers", "iters",
                                            "warmup", "confirm", "reread", "kernel_timing")},
                       link_sizes=parse_sizes(a["link_sizes"], "--link-sizes") if a["link_sizes"] else None,
                       started=process_started())


def _prepare(a: dict, early):
    """(cluster, model, workload, options, world owned, rank, store) from the flags, the world joined and checked
    before the store opens (a refused tune creates no store file); an error's line (and ``early``'s JSON event) and
    exit 2 otherwise."""
    try:
        _check_all(a)
    except PlanError as e:
        _fail(0, early, e)
    from sp_plan.profiles import load_cluster, load_model
    from sp_plan.profiles.discover import probe
    from sp_plan.profiles.tune.run import check_world

    rank, owned = 0, False
    try:
        opts = _options(a)
        c, m = load_cluster(a["cluster"], a["nodes"]), load_model(a["model"])
        w = workload_of(a["seq_len"], a["batch"], a["causal"], a["inference"], a["documents"], a["window"],
                        a["window_pattern"], a["seed"])
        owned = _world()
        rank = probe.dist.get_rank()
        check_world(c, probe.dist.get_world_size())
        check_same_flags(c, m, w, opts, probe.dist)
        return c, m, w, opts, owned, rank, _open_store(a["store"], rank)
    except PlanError as e:
        if probe.dist.is_initialized():  # every rank refuses here alike (the world, the store broadcast): none may
            probe.dist.barrier()  # leave while a peer still connects to it (gloo would fail that peer instead)
        _fail(rank, early, e, owned)


#: TuneOptions fields a rank's flags set, which every rank must share (the rest are settings and test hooks)
SHARED_OPTIONS = ("budget", "max_minutes", "candidate_timeout", "pool", "layers", "warmup", "iters", "link_sizes",
                  "confirm", "reread", "kernel_timing")


def tune_flags(c, m, w, opts) -> dict[str, str]:
    """flag -> its value, as every rank of one tune must have it: the cluster by its topology, the model and each
    workload field and option by value."""
    out = {"--cluster": c.topology_fingerprint(), "--model": m.model_dump_json()}
    out.update((f"--{k.replace('_', '-')}", repr(v)) for k, v in w.model_dump(mode="json").items())
    out.update((f"--{k.replace('_', '-')}", repr(getattr(opts, k))) for k in SHARED_OPTIONS)
    return out


def check_same_flags(c, m, w, opts, dist) -> None:
    """Every rank was started with the same tune (``tune_flags``, compared by ``runtime.agree.first_difference``):
    ranks of different models or lengths would time different shapes into one store, then fail at a collective with
    no field named."""
    from sp_plan.runtime.agree import first_difference

    found = first_difference(tune_flags(c, m, w, opts), dist.get_world_size())
    if found is not None:
        differ, r = found[:2]
        raise PlanError(differ, f"rank {r} was started with another {differ} than rank 0",
                        "start every rank with the same flags (torchrun runs one command on every rank)")


def _measure(c, m, w, opts, st, rank: int, prog, a: dict):
    """The tune on this rank, rank 0's progress on ``prog``."""
    from sp_plan.profiles.tune import run

    if rank != 0:
        return run.tune(c, m, w, None, opts)
    head = None if a["quiet"] or a["as_json"] else _header(c, m, w, st)
    return run.tune(c, m, w, st, opts, _after_header(prog, head))


def _tell(report, st, prog, a: dict) -> bool:
    """Rank 0: the report, the upload, the plan written and the result line or event; False where the upload
    failed."""
    loud = not (a["quiet"] or a["as_json"])
    if loud:
        _print_report(report, st)
        out.print(f"stored profile [bold]{report.profile.id}[/] in {st.shown}", highlight=False)
    uploaded = not a["server"] or _upload(report.profile, st, a["server"])
    if a["output"]:
        _write_best(report, a["output"], loud)
    if a["as_json"]:
        prog.result(result_event(report, st, a["output"]))
    elif a["quiet"]:
        out.print(f"stored profile {report.profile.id} in {st.shown}" + (
            f"; wrote {a['output']}: {report.best.summary()}" if a["output"] and report.best else ""),
            highlight=False, soft_wrap=True)
    return uploaded


def tune_cmd(
    cluster: str = Flag.cluster, nodes: Optional[int] = Flag.nodes, model: str = Flag.model,
    seq_len: str = Flag.seq_len, batch: int = Flag.batch, causal: bool = Flag.causal,
    inference: bool = Flag.inference, documents: Optional[str] = _TUNE_MASK.documents,
    window: Optional[str] = _TUNE_MASK.window, window_pattern: Optional[str] = _TUNE_MASK.window_pattern,
    seed: Optional[int] = _TUNE_MASK.seed, budget: int = Flag.budget, max_minutes: float = Flag.max_minutes,
    candidate_timeout: float = Flag.candidate_timeout, store: Optional[str] = Flag.store,
    output: Optional[Path] = Flag.output, layers: int = Flag.layers, iters: int = Flag.iters,
    confirm: int = Flag.confirm, reread: int = Flag.reread, warmup: int = Flag.warmup, pool: int = Flag.pool,
    kernel_timing: Literal["auto", "each", "shared"] = Flag.kernel_timing, link_sizes: Optional[str] = Flag.link_sizes,
    server: Optional[str] = Flag.server, quiet: bool = Flag.quiet, as_json: bool = Flag.as_json,
) -> None:
    """Measure links, kernels and the best candidates on this cluster; calibrate; store the profile."""
    from sp_plan.cli.progress import JsonReporter, reporter

    a = dict(locals())
    c, m, w, opts, owned, rank, st = _prepare(a, JsonReporter("tune") if as_json else None)
    from sp_plan.profiles.discover import probe  # torch, imported by _prepare once the flags passed
    steps = ("links", "kernels", "rounds", "candidates", "reread", "confirm")
    prog = reporter("tune", steps, err, quiet, as_json) if rank == 0 else None
    try:
        with prog or contextlib.nullcontext():
            report = _measure(c, m, w, opts, st, rank, prog, a)
    except PlanError as e:
        _fail(rank, prog, e, owned)
    except KeyboardInterrupt:  # Ctrl-C, or torchrun passing its SIGINT on to the ranks
        _fail(rank, prog, "tune: interrupted; everything measured so far is stored: run the same command again to "
              "resume", owned, code=130)
    except Exception as e:  # noqa: BLE001 - a dead rank or broken world: what was measured is in the store
        _fail(rank, prog, f"the tune stopped: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}; "
              "everything measured so far is stored: run the same command again to resume", code=1)
    uploaded = _tell(report, st, prog, a) if rank == 0 else True
    probe.dist.barrier()
    probe.finish(owned)
    if not uploaded:
        raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    app.command("tune")(tune_cmd)
