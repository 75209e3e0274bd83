"""The `sp-plan` command: presets, plan, show.

Each command imports what it uses when it runs (the cost engine, the store, SciPy, torch), so a command pays only
for its own work: `presets` and `--help` load no search, `plan --no-profile` no store.
"""
from __future__ import annotations

import functools
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Optional

import typer
from rich.table import Table

from sp_plan.cli.console import err, out, print_error
from sp_plan.cli.examples import add_examples
from sp_plan.cli.workload import masked_workload, plan_workload, print_mask, print_notes, print_rank_work, workload_mask_options
from sp_plan.planner.errors import PlanError
from sp_plan.service.collector import collector_paused, skip_final_collection

if TYPE_CHECKING:
    from sp_plan.planner.plan import Plan

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Plan sequence-parallel layouts (Ring, Ulysses, USP, ...) for long-context Transformers on your "
                       "cluster, tune the plan's model on it, and serve plans over HTTP.")


def _version(value: bool) -> None:
    """`sp-plan --version`: the installed package's version, then exit."""
    if value:
        import sp_plan  # noqa: PLC0415

        out.print(f"sp-plan {sp_plan.__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="print sp-plan's version and exit")) -> None:
    """Plan sequence-parallel layouts (Ring, Ulysses, USP, ...) for long-context Transformers on your cluster,
    tune the plan's model on it, and serve plans over HTTP."""


def fail(e: PlanError) -> None:
    print_error(str(e))
    raise typer.Exit(2)


def gib(x: float) -> str:
    return f"{x / 2**30:.1f} GiB"


def _profile_options(profile: Optional[str], no_profile: bool) -> object:
    """The profile spec for calibration.resolve_params: False (--no-profile), an id or file, or None (the store's)."""
    if no_profile and profile:
        raise PlanError("--profile", "both --profile and --no-profile given", "pass one of them")
    return False if no_profile else profile


PROFILE_HELP = "calibration profile: a stored profile id or a profile file"
PROFILE_DEFAULT = "the cluster's newest stored profile"
NO_PROFILE_HELP = "price with the presets' default model terms, without a profile (opens no store)"
STORE_HELP = "profile store URL, e.g. sqlite:////path/store.db"
STORE_DEFAULT = "$SP_PLAN_STORE, else SQLite in the user data directory"


def mfu_text(pred) -> str:
    """'MFU 20.7%', and where a mask cuts the attention the MFU counted with full causal attention, as papers count
    it ('MFU 20.7% (23.3% counting full causal attention)')."""
    if pred.mfu_causal is None:
        return f"MFU {pred.mfu:.1%}"
    return f"MFU {pred.mfu:.1%} ({pred.mfu_causal:.1%} counting full causal attention)"


def secs(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.3f} s"


@app.command()
def presets() -> None:
    """List the cluster and model presets: devices per node, memory and links; model sizes."""
    from sp_plan.profiles import cluster_presets, load_model, model_presets, preset_cluster

    t = Table(title="cluster presets (per node)")
    for c in ("name", "devices", "device", "memory", "intra-node", "network"):
        t.add_column(c)
    for name in cluster_presets():
        c = preset_cluster(name, 1)
        node = c.node_type(0)
        d = node.devices[0]
        kinds = sorted({l.kind for l in node.links if "net" not in (l.src, l.dst)})
        nets = sorted({l.kind for l in node.links if "net" in (l.src, l.dst)})
        t.add_row(name, str(len(node.devices)), d.model, gib(d.memory_bytes), ",".join(kinds), ",".join(nets))
    out.print(t)
    m = Table(title="model presets")
    for c in ("name", "params", "layers", "hidden", "heads", "kv heads", "ffn", "vocab"):
        m.add_column(c)
    for name in model_presets():
        s = load_model(name)
        m.add_row(name, f"{s.params() / 1e9:.2f} B", str(s.layers), str(s.hidden), str(s.heads), str(s.kv_heads),
                  str(s.ffn_hidden), str(s.vocab))
    out.print(m)


def _ranking(plans: list[Plan], title: str = "ranked layouts (fastest first)") -> Table:
    from sp_plan.planner.equivalent import group  # noqa: PLC0415
    from sp_plan.planner.measured import step_time  # noqa: PLC0415
    from sp_plan.planner.search import largest_extra_cost  # noqa: PLC0415

    measured = any(p.measured for p in plans)  # planner/measured.py: a layout tune measured ranks by its measurement
    t = Table(title=title, caption="ranked by the measured step where tune measured the layout" if measured else None)
    cols = ("#", "layout", "step", "measured", "tokens/s", "MFU", "peak mem", "vs #1: largest extra cost")
    for c in cols if measured else [c for c in cols if c != "measured"]:
        t.add_column(c, justify="right" if c in ("#", "step", "measured", "tokens/s", "MFU", "peak mem") else "left")
    win = plans[0]
    for i, row in enumerate(group(plans)):  # equivalent candidates (planner/equivalent.py) share a row
        p = row.plan
        pr = p.predicted
        why = "-"
        if i and (p.measured or win.measured):  # ranked by a measurement: the phases do not say why
            why = f"{secs(step_time(p) - step_time(win))} slower" + (" (both measured)" if p.measured and win.measured else "")
        elif i:
            name, extra = largest_extra_cost(p, win)
            why = f"{name} +{secs(extra)}" if extra > 0 else f"{secs(pr.step_time_s - win.predicted.step_time_s)} slower"
        cells = [str(i + 1), row.label(), secs(pr.step_time_s)]
        if measured:
            cells.append(secs(p.measured.step_time_s) if p.measured else "-")
        t.add_row(*cells, f"{pr.tokens_per_s:,.0f}", f"{pr.mfu:.1%}", gib(pr.peak_memory_bytes), why)
    return t


def _explain(p: Plan, label: str = "winner's step") -> str:
    """A step in a line: compute, exposed communication per dimension, pipeline bubble."""
    from sp_plan.planner.search import summarize  # noqa: PLC0415

    parts = summarize(p)
    total = p.predicted.step_time_s
    items = sorted(parts.items(), key=lambda kv: -kv[1])
    return f"{label}: " + ", ".join(f"{k} {secs(v)} ({v / total:.0%})" for k, v in items if v > 0)


def _breakdown(p: Plan) -> Table:
    t = Table(title=f"breakdown of {p.summary()}")
    for c in ("phase", "kind", "group", "bytes/rank", "seconds", "exposed"):
        t.add_column(c, justify="right" if c in ("bytes/rank", "seconds", "exposed") else "left")
    for b in p.predicted.breakdown:
        t.add_row(b.name, b.kind, b.group or "", gib(b.bytes_per_rank) if b.bytes_per_rank else "", secs(b.seconds),
                  secs(b.exposed_seconds))
    return t


SERVER_HELP = "ask a planner service (`sp-plan serve`) at this URL instead of planning here (token: $SP_PLAN_TOKEN)"


def _client(server: str):
    from sp_plan.client import Client  # noqa: PLC0415

    return Client.from_env(server)


def _is_file(spec) -> bool:
    """Whether a --cluster/--model/--profile value names a file (as the loaders decide), not a preset or id."""
    return isinstance(spec, str) and (Path(spec).suffix in (".yaml", ".yml", ".json") or Path(spec).exists())


def _request(cls, server: Optional[str], **fields):
    """A service request from the options; with --server, cluster and model files are read here and sent inline."""
    from pydantic import ValidationError  # noqa: PLC0415

    if server:
        from sp_plan.profiles import load_cluster, load_model  # noqa: PLC0415

        if _is_file(fields["cluster"]):
            fields["cluster"], fields["nodes"] = load_cluster(fields["cluster"], fields["nodes"]), None
        if _is_file(fields.get("model")):
            fields["model"] = load_model(fields["model"])
        if _is_file(fields.get("profile")):
            raise PlanError("--profile", "a profile file cannot be sent with --server",
                            "upload it with `sp-plan profile import FILE --server URL` and pass its id")
    try:
        return cls(**fields)
    except ValidationError as e:
        x = e.errors()[0]
        raise PlanError(f"--{str(x['loc'][0]).replace('_', '-')}", x["msg"], "fix that option") from None


def owns_collector(command: Callable) -> Callable:
    """A command run with the garbage collector paused (``service.collector.collector_paused``): this process owns its
    collector, and a command that plans allocates ~10^5 objects a collection would walk again and again."""
    @functools.wraps(command)  # typer reads the options from the wrapped function's signature
    def run(*args, **kwargs):
        with collector_paused():
            return command(*args, **kwargs)

    return run


_PLAN_MASK = workload_mask_options()


@app.command("plan")
@owns_collector
def plan_cmd(
    cluster: str = typer.Option(..., "--cluster", help="preset name (see `sp-plan presets`) or cluster YAML file"),
    nodes: Optional[int] = typer.Option(None, "--nodes", help="node count for a preset", show_default="1"),
    model: str = typer.Option(..., "--model", help="model preset name or model YAML file"),
    seq_len: str = typer.Option(..., "--seq-len", help="tokens per sequence: 131072, 128k or 1m"),
    batch: int = typer.Option(1, "--batch", help="global batch (sequences per step)"),
    causal: bool = typer.Option(True, "--causal/--no-causal", help="causal (decoder) or full attention"),
    inference: bool = typer.Option(False, "--inference", help="forward only (prefill), no gradients or optimizer"),
    top: int = typer.Option(5, "--top", help="how many ranked layouts to print (equivalent ones share a row)"),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="write the best plan here (.yaml or .json)",
                                          show_default="print only"),
    search: str = typer.Option("grid", "--search", help="grid (every layout) or bayes (optuna TPE over the degrees)"),
    trials: int = typer.Option(200, "--trials", help="optuna trials for --search bayes"),
    seed: int = typer.Option(0, "--seed", help="seed of the --search bayes sampler and of the packs drawn from "
                             "--documents (recorded in the plan)"),
    storage: Optional[str] = typer.Option(None, "--storage", help="optuna storage to resume a study, e.g. "
                                          "sqlite:///study.db", show_default="in memory"),
    profile: Optional[str] = typer.Option(None, "--profile", help=PROFILE_HELP, show_default=PROFILE_DEFAULT),
    no_profile: bool = typer.Option(False, "--no-profile", help=NO_PROFILE_HELP),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP, show_default=STORE_DEFAULT),
    server: Optional[str] = typer.Option(None, "--server", help=SERVER_HELP, show_default="plan here"),
    report: Optional[Path] = typer.Option(None, "--report", help="also write the HTML report here (see `sp-plan report`)",
                                          show_default="none"),
    sensitivity: bool = typer.Option(False, "--sensitivity", help="re-rank with each link class's bandwidth halved "
                                     "and doubled and compute efficiency at 80 %: does the winner hold?"),
    documents: Optional[str] = _PLAN_MASK.documents,
    window: Optional[int] = _PLAN_MASK.window,
    window_pattern: Optional[str] = _PLAN_MASK.window_pattern,
) -> None:
    """Rank every valid layout for a cluster, model and sequence length; write the best as a plan file."""
    from sp_plan.planner.model import parse_seq_len  # noqa: PLC0415
    from sp_plan.planner.yamlio import check_writable  # noqa: PLC0415
    from sp_plan.service.planning import PlanRequest, resolve  # noqa: PLC0415
    from sp_plan.service.planning import search as run_search  # noqa: PLC0415

    try:
        if batch < 1:
            raise PlanError("--batch", f"must be at least 1, got {batch}", "pass --batch 1 or more")
        if top < 1:
            raise PlanError("--top", f"must be at least 1, got {top}", "pass --top 1 or more")
        if trials < 1:
            raise PlanError("trials", f"must be at least 1, got {trials}", "pass --trials 1 or more")
        if output:
            check_writable(output)
        if report:
            check_writable(report, "--report")
        if search not in ("grid", "bayes"):
            raise PlanError("--search", f"unknown search {search!r}", "use grid or bayes")
        _profile_options(profile, no_profile)
        if server and (report or sensitivity):
            raise PlanError("--report" if report else "--sensitivity", "needs the cluster's profile here, not on a server",
                            "run without --server (the service's report is at URL/v1/plans/ID/report)")
        w = masked_workload(dict(seq_len=parse_seq_len(seq_len), batch=batch, causal=causal, training=not inference),
                            documents, window, window_pattern, seed if documents is not None else None)
        print_notes(w)
        req = _request(PlanRequest, server, cluster=cluster, nodes=nodes, model=model, workload=w, search=search,
                       trials=trials, seed=seed, top=top, use_profile=not no_profile, profile=profile, families=True)
        if server:
            res = _client(server).plan(req)
        else:
            inputs = resolve(req, store, max_world=None)
            with _search_progress(search) as tick:
                res = run_search(req, inputs, storage=storage, progress=tick)  # = service.planning.run_plan
    except PlanError as e:
        fail(e)
    c, w, plans = res.cluster, res.workload, res.plans
    out.print(f"[bold]{c.name}[/] ({c.nodes} node(s), {c.world_size} x {c.device}, fingerprint {c.fingerprint}, topology {c.topology_fingerprint}), "
              f"[bold]{res.model.name}[/], {w.seq_len:,} tokens x {w.batch}, {'causal' if w.causal else 'full'}, "
              f"{'training' if w.training else 'inference'}", highlight=False)
    print_mask(w)
    out.print(res.profile_line, highlight=False)
    s = res.search
    how = (f"grid: {s.space:,} candidates, {s.evaluated:,} priced" if s.kind == "grid" else
           f"bayes: {s.trials} trials (best first reached at trial {s.best_trial + 1}), {s.evaluated:,} priced")
    out.print(how, highlight=False)
    out.print(_ranking(plans))
    out.print(_ranking([plans[0]] + [f for f in res.families if f.summary() != plans[0].summary()],
                       title="best layout of each algorithm variant (team C, placement)"))
    out.print(_explain(plans[0]))
    out.print(_breakdown(plans[0]))
    print_rank_work(plans[0])
    if output:
        try:
            plans[0].save(output)
        except PlanError as e:
            fail(e)
        out.print(f"wrote {output}")
    if sensitivity or report:
        from sp_plan.planner.equivalent import group  # noqa: PLC0415

        _sensitivity_and_report(inputs.cluster, inputs.model, inputs.workload, inputs.params, inputs.profile,
                                inputs.line, [r.plan for r in group(plans)], res.families, sensitivity, report)


@contextmanager
def _search_progress(kind: str) -> Iterator[Callable[[int, int], None]]:
    """A progress bar of the search on a terminal (rich draws on a terminal only); elsewhere no callback at all."""
    if not err.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    with Progress(TextColumn(f"{kind} search"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as prog:
        task = prog.add_task("search", total=None)
        last = [0.0]

        def tick(i: int, n: int) -> None:  # the search calls this per queue item: redraw at most 20 times a second
            now = time.monotonic()
            if now - last[0] >= 0.05 or i >= n:
                last[0] = now
                prog.update(task, completed=i, total=n)

        yield tick


def _sensitivity_and_report(c, m, w, params, prof, line, plans, families, sensitivity, report) -> None:
    """`plan --sensitivity` and `plan --report` (cli/report.py)."""
    from sp_plan.cli.report import report_plans, sensitivity_table, write_report
    from sp_plan.planner.sensitivity import sensitivity as rerank

    try:
        sen = rerank(c, m, w, plans[0], params) if sensitivity else None
        if sen is not None:
            out.print(sensitivity_table(sen))
        if report:
            rows, chosen = report_plans(plans, families)
            write_report(report, rows, c, chosen, prof, sen, [line], field="--report")
            out.print(f"wrote {report}")
    except PlanError as e:
        fail(e)


_ESTIMATE_MASK = workload_mask_options(from_plan=True)


@app.command()
def estimate(
    path: Path = typer.Argument(..., help="a plan file (written by `sp-plan plan -o` or by hand)"),
    cluster: str = typer.Option(..., "--cluster", help="preset name or cluster YAML file to price the plan on"),
    nodes: Optional[int] = typer.Option(None, "--nodes", help="node count for a preset", show_default="1"),
    model: Optional[str] = typer.Option(None, "--model", help="model preset or file", show_default="the plan's"),
    seq_len: Optional[str] = typer.Option(None, "--seq-len", help="tokens per sequence", show_default="the plan's"),
    batch: Optional[int] = typer.Option(None, "--batch", help="global batch", show_default="the plan's, else 1"),
    causal: Optional[bool] = typer.Option(None, "--causal/--no-causal", help="causal (decoder) or full attention",
                                          show_default="the plan's, else causal"),
    inference: bool = typer.Option(False, "--inference", help="forward only (prefill), no gradients or optimizer"),
    profile: Optional[str] = typer.Option(None, "--profile", help=PROFILE_HELP, show_default=PROFILE_DEFAULT),
    no_profile: bool = typer.Option(False, "--no-profile", help=NO_PROFILE_HELP),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP, show_default=STORE_DEFAULT),
    server: Optional[str] = typer.Option(None, "--server", help=SERVER_HELP, show_default="price here"),
    documents: Optional[str] = _ESTIMATE_MASK.documents,
    window: Optional[int] = _ESTIMATE_MASK.window,
    window_pattern: Optional[str] = _ESTIMATE_MASK.window_pattern,
    seed: Optional[int] = _ESTIMATE_MASK.seed,
) -> None:
    """Price one plan on a cluster: step time, MFU, memory and the per-phase breakdown."""
    from sp_plan.planner.plan import Plan  # noqa: PLC0415
    from sp_plan.service.planning import EstimateRequest, run_estimate  # noqa: PLC0415

    try:
        p = Plan.load(path)
        if model is None and p.model is None:
            raise PlanError("--model", f"{path} names no model", "pass --model NAME|FILE")
        base = p.workload
        if seq_len is None and base is None:
            raise PlanError("--seq-len", f"{path} names no workload", "pass --seq-len N")
        w = plan_workload(base, seq_len, batch, causal, inference, documents, window, window_pattern, seed)
        print_notes(w)
        _profile_options(profile, no_profile)
        req = _request(EstimateRequest, server, plan=p, cluster=cluster, nodes=nodes, model=model, workload=w,
                       use_profile=not no_profile, profile=profile)
        res = _client(server).estimate(req) if server else run_estimate(req, store)
    except PlanError as e:
        fail(e)
    p, c, w, pred = res.plan, res.cluster, res.workload, res.plan.predicted
    out.print(f"[bold]{p.summary()}[/] on {c.name} ({c.world_size} ranks), {res.model.name}, {w.seq_len:,} tokens x {w.batch}",
              highlight=False)
    print_mask(w)
    out.print(res.profile_line, highlight=False)
    out.print(f"step {secs(pred.step_time_s)}, {pred.tokens_per_s:,.0f} tokens/s, {mfu_text(pred)}, peak memory "
              f"{gib(pred.peak_memory_bytes)} of {gib(pred.memory_capacity_bytes)}"
              + ("" if pred.fits else "  [bold red]does not fit[/]"))
    out.print(_explain(p, "step"))
    out.print(_breakdown(p))
    print_rank_work(p.model_copy(update={"workload": w}))


#: rank lists `show` prints per dimension (the rest are elided)
SHOWN_GROUPS = 4


@app.command()
def show(path: Path = typer.Argument(..., help="a plan file written by `sp-plan plan -o` (or by hand)")) -> None:
    """Print a plan file: layout, the groups its mesh makes (derived from degrees and order) and predictions."""
    from sp_plan.planner.plan import Plan  # noqa: PLC0415

    try:
        p = Plan.load(path)
    except PlanError as e:
        fail(e)
    out.print(f"[bold]{p.summary()}[/]  (world {p.world_size}, cluster {p.cluster or '-'} {p.cluster_fingerprint or ''})")
    t = Table(title="groups")
    t.add_column("dimension")
    t.add_column("degree", justify="right")
    t.add_column("rank lists")
    for name, gs in p.layout().all_groups().items():  # the layout module's groups: as `init` builds them
        if len(gs[0]) > 1:
            shown = " ".join(str(g) for g in gs[:SHOWN_GROUPS]) + (" ..." if len(gs) > SHOWN_GROUPS else "")
            t.add_row(name, str(len(gs[0])), shown)
    out.print(t)
    if p.predicted:
        pr = p.predicted
        out.print(f"step {secs(pr.step_time_s)}, {pr.tokens_per_s:,.0f} tokens/s, {mfu_text(pr)}, "
                  f"peak memory {gib(pr.peak_memory_bytes)} of {gib(pr.memory_capacity_bytes)}")
        out.print(_breakdown(p))
    if p.workload is not None:
        print_mask(p.workload)
    try:
        print_rank_work(p)
    except PlanError as e:
        fail(e)


# the other command modules register on the app defined above (they import its helpers)
from sp_plan.cli.discover import register as _register_discover  # noqa: E402
from sp_plan.cli.tune import register as _register_tune  # noqa: E402
from sp_plan.cli.report import register as _register_report  # noqa: E402
from sp_plan.cli.export import register as _register_export  # noqa: E402
_register_discover(app)
_register_tune(app)
_register_report(app)
_register_export(app)
from sp_plan.cli.serve import register as _register_serve  # noqa: E402
_register_serve(app)
add_examples(app)


def main() -> None:
    """Console entry point: bad input exits 2 with one line, never a traceback; the command line's own usage
    errors too (an unknown option, a value of the wrong type, a missing option), which typer would box."""
    try:
        code = app(standalone_mode=False)
    except PlanError as e:  # pragma: no cover - commands catch their own
        print_error(str(e))
        sys.exit(2)
    except typer.Abort:
        err.print("aborted", highlight=False)
        sys.exit(130)
    except typer.TyperException as e:  # click's exceptions (typer vendors click): usage errors and the like
        ctx = getattr(e, "ctx", None)
        if type(e).__name__ == "NoArgsIsHelpError" and ctx is not None:  # bare `sp-plan`: its help
            out.print(ctx.get_help(), highlight=False, markup=False)
            sys.exit(0)
        where = f"; see '{ctx.command_path} --help'" if ctx is not None else ""
        print_error(f"{e.format_message().rstrip('.')}{where}")
        sys.exit(getattr(e, "exit_code", 2))
    skip_final_collection()  # the process ends here
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
