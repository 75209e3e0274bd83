"""The `sp-plan` command: presets, plan, show.

Each command imports what it uses when it runs (the cost engine and numpy, the store, SciPy, torch), so a command
pays only for its own work: `presets` and `--help` load no search, `plan --no-profile` no store; the presets, the
models and the plan file's checks load with the app.
"""
from __future__ import annotations

from sp_plan.cli import startup  # first: pauses the collector while the modules below load (resumed at the end)

import copy
import gc
import sys
import time
from collections.abc import MutableMapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, Optional

import typer
from pydantic import ValidationError
from typer.core import TyperGroup
from rich.table import Table

import sp_plan

from sp_plan.cli.console import err, out, print_error, text_row
from sp_plan.cli.examples import add_examples
from sp_plan.cli.options import (JSON_HELP, NO_PROFILE_HELP, PROFILE_DEFAULT, PROFILE_HELP, STORE_DEFAULT, STORE_HELP,
                                 fail, jobs_option, owns_collector, profile_options)
from sp_plan.cli.workload import masked_workload, plan_workload, print_mask, print_notes, print_rank_work, workload_mask_options
from sp_plan.planner.errors import PlanError
from sp_plan.planner.model import DEFAULT_TRIALS, MAX_BATCH, MAX_SEED, MAX_TOP, MAX_TRIALS, parse_seq_len
from sp_plan.planner.ranking import mfu_text, secs, summarize, versus_first
from sp_plan.planner.yamlio import check_writable, names_file
from sp_plan.profiles import cluster_presets, load_cluster, load_model, model_presets, preset_cluster
from sp_plan.service.collector import exit_without_teardown

if TYPE_CHECKING:
    from sp_plan.planner.plan import Plan

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Plan sequence-parallel layouts (Ring, Ulysses, USP, ...) for long-context Transformers on your "
                       "cluster, tune the plan's model on it, and serve plans over HTTP.")


def _version(value: bool) -> None:
    """`sp-plan --version`: the installed package's version, then exit."""
    if value:
        out.print(f"sp-plan {sp_plan.__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="print sp-plan's version and exit")) -> None:
    """Plan sequence-parallel layouts (Ring, Ulysses, USP, ...) for long-context Transformers on your cluster,
    tune the plan's model on it, and serve plans over HTTP."""


def print_json(model) -> None:
    """A response model as JSON on stdout, unwrapped (what the service answers the same request with)."""
    sys.stdout.write(model.model_dump_json(indent=2) + "\n")


def gib(x: float) -> str:
    return f"{x / 2**30:.1f} GiB"


_profile_options = profile_options  # the name cli/export.py imports


@app.command()
def presets() -> None:
    """List the cluster and model presets: devices per node, memory and links; model sizes."""
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
    """The ranking table: equivalent candidates (planner/equivalent.py) share a row; with a layout tune measured,
    the measured column (planner/measured.py ranks it by its measurement)."""
    from sp_plan.planner.equivalent import group  # noqa: PLC0415 - the equivalence test reads Candidate (numpy)

    measured = any(p.measured for p in plans)
    t = Table(title=title, caption="ranked by the measured step where tune measured the layout" if measured else None)
    cols = ("#", "layout", "step", "measured", "tokens/s", "MFU", "peak mem", "vs #1: largest extra cost")
    for c in cols if measured else [c for c in cols if c != "measured"]:
        t.add_column(c, justify="right" if c in ("#", "step", "measured", "tokens/s", "MFU", "peak mem") else "left")
    for i, row in enumerate(group(plans)):
        pr = row.plan.predicted
        cells = [str(i + 1), row.label(), secs(pr.step_time_s)]
        if measured:
            cells.append(secs(row.plan.measured.step_time_s) if row.plan.measured else "-")
        text_row(t, *cells, f"{pr.tokens_per_s:,.0f}", f"{pr.mfu:.1%}", gib(pr.peak_memory_bytes),
                 versus_first(row.plan, plans[0], first=i == 0))
    return t


def _explain(p: Plan, label: str = "winner's step") -> str:
    """A step in a line: compute, exposed communication per dimension, pipeline bubble."""
    parts = summarize(p)
    total = p.predicted.step_time_s
    items = sorted(parts.items(), key=lambda kv: -kv[1])
    return f"{label}: " + ", ".join(f"{k} {secs(v)} ({v / total:.0%})" for k, v in items if v > 0)


def _breakdown(p: Plan) -> Table:
    t = Table(title=f"breakdown of {p.summary()}")
    for c in ("phase", "kind", "group", "bytes/rank", "seconds", "exposed"):
        t.add_column(c, justify="right" if c in ("bytes/rank", "seconds", "exposed") else "left")
    for b in p.predicted.breakdown:
        text_row(t, b.name, b.kind, b.group or "", gib(b.bytes_per_rank) if b.bytes_per_rank else "", secs(b.seconds),
                 secs(b.exposed_seconds))
    return t


SERVER_HELP = "ask a planner service (`sp-plan serve`) at this URL instead of planning here (token: $SP_PLAN_TOKEN)"


def _client(server: str):
    from sp_plan.client import Client  # noqa: PLC0415 - httpx and the pipeline's models: only --server loads them

    return Client.from_env(server)


def _request(cls, server: Optional[str], **fields):
    """A service request from the options; with --server, cluster and model files are read here and sent inline."""
    if server:
        if names_file(fields["cluster"]):
            fields["cluster"], fields["nodes"] = load_cluster(fields["cluster"], fields["nodes"]), None
        if names_file(fields.get("model")):
            fields["model"] = load_model(fields["model"])
        if names_file(fields.get("profile")):
            raise PlanError("--profile", "a profile file cannot be sent with --server",
                            "upload it with `sp-plan profile import FILE --server URL` and pass its id")
    try:
        return cls(**fields)
    except ValidationError as e:
        x = e.errors()[0]
        raise PlanError(f"--{str(x['loc'][0]).replace('_', '-')}", x["msg"], "fix that option") from None


_PLAN_MASK = workload_mask_options()


@app.command("plan")
@owns_collector
def plan_cmd(
    cluster: str = typer.Option(..., "--cluster", help="preset name (see `sp-plan presets`) or cluster YAML file"),
    nodes: Optional[int] = typer.Option(None, "--nodes", min=1, help="node count for a preset", show_default="1"),
    model: str = typer.Option(..., "--model", help="model preset name or model YAML file"),
    seq_len: str = typer.Option(..., "--seq-len", help="tokens per sequence: 131072, 128k or 1m"),
    batch: int = typer.Option(1, "--batch", min=1, max=MAX_BATCH, help="global batch (sequences per step)"),
    causal: bool = typer.Option(True, "--causal/--no-causal", help="causal (decoder) or full attention"),
    inference: bool = typer.Option(False, "--inference", help="forward only (prefill), no gradients or optimizer"),
    top: int = typer.Option(5, "--top", min=1, max=MAX_TOP, help="how many ranked layouts to print (equivalent ones share a row)"),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="write the best plan here (.yaml or .json)",
                                          show_default="print only"),
    search: Literal["grid", "bayes"] = typer.Option("grid", "--search", help="grid (every layout) or bayes (optuna TPE over the degrees)"),
    trials: Optional[int] = typer.Option(None, "--trials", min=1, show_default=str(DEFAULT_TRIALS),
                                         help=f"optuna trials for --search bayes (1 to {MAX_TRIALS:,})"),
    seed: int = typer.Option(0, "--seed", min=0, help="seed of the --search bayes sampler and of the packs drawn from "
                             f"--documents (recorded in the plan; 0 to {MAX_SEED:,})"),
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
    window: Optional[str] = _PLAN_MASK.window,
    window_pattern: Optional[str] = _PLAN_MASK.window_pattern,
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    jobs: Optional[int] = jobs_option(),
) -> None:
    """Rank every valid layout for a cluster, model and sequence length; write the best as a plan file."""
    try:
        _check_plan_options(output, report, profile, no_profile, server, sensitivity, jobs)
        if search == "grid" and (storage or trials is not None):
            flag = "--storage" if storage else "--trials"
            raise PlanError(flag, "sets the Bayesian search, and a grid search prices every layout",
                            f"pass --search bayes with {flag}, or drop it")
        w = masked_workload(dict(seq_len=parse_seq_len(seq_len), batch=batch, causal=causal, training=not inference),
                            documents, window, window_pattern, seed if documents is not None else None)
        if not as_json:
            print_notes(w)
        res, inputs = _planned(server, store, storage, jobs, cluster=cluster, nodes=nodes, model=model, workload=w,
                               search=search, trials=trials or DEFAULT_TRIALS, seed=seed, top=top,
                               use_profile=not no_profile,
                               profile=profile, families=True)
    except PlanError as e:
        fail(e)
    if as_json:
        print_json(res)
    else:
        _print_plans(res)
    _write_plan(res.plans[0], output, quiet=as_json)
    if sensitivity or report:
        from sp_plan.planner.equivalent import group  # noqa: PLC0415 - as in _ranking

        _sensitivity_and_report(inputs, [r.plan for r in group(res.plans)], res.families, sensitivity, report,
                                jobs, to=err if as_json else out)


def _check_plan_options(output: Optional[Path], report: Optional[Path], profile: Optional[str], no_profile: bool,
                        server: Optional[str], sensitivity: bool, jobs: Optional[int] = None) -> None:
    """`plan`'s options that neither typer (ranges, choices: their declarations) nor a model checks: writable
    outputs, options that exclude each other."""
    if output:
        check_writable(output)
    if report:
        check_writable(report, "--report")
    profile_options(profile, no_profile)
    if server and (report or sensitivity):
        raise PlanError("--report" if report else "--sensitivity", "needs the cluster's profile here, not on a server",
                        "run without --server (the service's report is at URL/v1/plans/ID/report)")
    if server and jobs:
        raise PlanError("--jobs", "sets the processes of a search here; a server searches in its own",
                        "leave out --jobs with --server (`sp-plan serve --workers` sizes the service)")


def _served_estimate(server: str, req):
    """The service's estimate of ``req``. The service names a field of the plan by its place in the request body
    (``plan.cluster_fingerprint``); here the plan is a file, whose fields are named as the file holds them."""
    try:
        return _client(server).estimate(req)
    except PlanError as e:
        if not e.field.startswith("plan.") or type(e).__init__ is not PlanError.__init__:
            raise
        raise type(e)(e.field.removeprefix("plan."), e.problem, e.fix) from None


def _planned(server: Optional[str], store: Optional[str], storage: Optional[str], jobs: Optional[int], **fields):
    """(PlanResponse, the resolved inputs or None) of the pipeline here, its grid in ``jobs`` processes (None: the
    usable cores, ``workers.auto_jobs``), or of the service at ``server``."""
    from sp_plan.pipeline import PlanRequest, resolve, search  # noqa: PLC0415 - numpy: `presets`, --help do without
    from sp_plan.workers import auto_jobs  # noqa: PLC0415 - as the pipeline

    req = _request(PlanRequest, server, **fields)
    if server:
        return _client(server).plan(req), None
    inputs = resolve(req, store, max_world=None)
    with _search_progress(req.search) as tick:
        return search(req, inputs, storage=storage, progress=tick, jobs=jobs or auto_jobs()), inputs


def _print_answer_notes(res, w) -> None:
    """The answer's own notes (the cluster's, the plan's): the workload's were printed before the request."""
    for n in res.notes[len(w.notes):]:
        out.print(f"note: {n}", highlight=False)


def _print_plans(res) -> None:
    """`plan`'s report on the terminal: the header, the profile line, the search, both rankings and the winner."""
    c, w, plans = res.cluster, res.workload, res.plans
    out.print(f"[bold]{c.name}[/] ({c.nodes} node(s), {c.world_size} x {c.device}, fingerprint {c.fingerprint}, "
              f"topology {c.topology_fingerprint}), [bold]{res.model.name}[/], {w.seq_len:,} tokens x {w.batch}, "
              f"{'causal' if w.causal else 'full'}, {'training' if w.training else 'inference'}", highlight=False)
    print_mask(w)
    _print_answer_notes(res, w)
    out.print(res.profile_line, highlight=False)
    s = res.search
    how = (f"grid: {s.space:,} candidates, {s.evaluated:,} priced" if s.kind == "grid" else
           f"bayes: {s.trials} trials (best first reached at trial {s.best_trial + 1}), {s.evaluated:,} priced of "
           f"{s.space:,} candidates")
    out.print(how, highlight=False)
    out.print(_ranking(plans))
    out.print(_ranking([plans[0]] + [f for f in res.families if f.summary() != plans[0].summary()],
                       title="best layout of each algorithm variant (team C, placement)"))
    out.print(_explain(plans[0]))
    out.print(_breakdown(plans[0]))
    print_rank_work(plans[0])


def _write_plan(p: Plan, output: Optional[Path], quiet: bool = False) -> None:
    """Write the winner to ``output`` (if given) and say so (unless ``quiet``: --json prints the response only)."""
    if not output:
        return
    try:
        p.save(output)
    except PlanError as e:
        fail(e)
    if not quiet:
        out.print(f"wrote {output}")


@contextmanager
def _search_progress(kind: str) -> Iterator[Callable[[int, int], None]]:
    """A progress bar of the search on a terminal (rich draws on a terminal only); elsewhere no callback at all."""
    if not err.is_terminal:
        yield None
        return
    # rich's progress bar (~0.1 s): only a search on a terminal draws one
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


def _sensitivity_and_report(inputs, plans: list[Plan], families: list[Plan], sensitivity: bool,
                            report: Optional[Path], jobs: Optional[int], to=out) -> None:
    """`plan --sensitivity` and `plan --report` (cli/report.py) from the search's inputs and rows; the
    re-rankings in ``jobs`` processes (None: the usable cores); printed on ``to`` (stderr under --json, whose
    stdout is the JSON document alone)."""
    from sp_plan.cli.report import sensitivity_table, write_report  # noqa: PLC0415 - matplotlib: --report only
    from sp_plan.pipeline import report_plans  # noqa: PLC0415 - as in _planned
    from sp_plan.planner.sensitivity import sensitivity as rerank  # noqa: PLC0415 - as in _planned
    from sp_plan.workers import auto_jobs, rerankings  # noqa: PLC0415 - as in _planned

    try:
        sen = rerank(inputs.cluster, inputs.model, inputs.workload, plans[0], inputs.params,
                     each=rerankings(jobs or auto_jobs())) if sensitivity else None
        if sen is not None:
            to.print(sensitivity_table(sen))
        if report:
            rows, chosen, ranked = report_plans(plans, families)
            write_report(report, rows, inputs.cluster, chosen, inputs.profile, sen, [inputs.line], field="--report",
                         ranked=ranked)
            to.print(f"wrote {report}")
    except PlanError as e:
        fail(e)


_ESTIMATE_MASK = workload_mask_options(from_plan=True)


@app.command()
def estimate(
    path: Path = typer.Argument(..., help="a plan file (written by `sp-plan plan -o` or by hand)"),
    cluster: Optional[str] = typer.Option(None, "--cluster", help="preset name or cluster YAML file to price the plan on",
                                          show_default="the plan's, where it names a preset"),
    nodes: Optional[int] = typer.Option(None, "--nodes", min=1, help="node count for a preset",
                                        show_default="the plan's where --cluster is not given, else 1"),
    model: Optional[str] = typer.Option(None, "--model", help="model preset or file", show_default="the plan's"),
    seq_len: Optional[str] = typer.Option(None, "--seq-len", help="tokens per sequence", show_default="the plan's"),
    batch: Optional[int] = typer.Option(None, "--batch", min=1, max=MAX_BATCH, help="global batch", show_default="the plan's, else 1"),
    causal: Optional[bool] = typer.Option(None, "--causal/--no-causal", help="causal (decoder) or full attention",
                                          show_default="the plan's, else causal"),
    inference: bool = typer.Option(False, "--inference", help="forward only (prefill), no gradients or optimizer"),
    profile: Optional[str] = typer.Option(None, "--profile", help=PROFILE_HELP, show_default=PROFILE_DEFAULT),
    no_profile: bool = typer.Option(False, "--no-profile", help=NO_PROFILE_HELP),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP, show_default=STORE_DEFAULT),
    server: Optional[str] = typer.Option(None, "--server", help=SERVER_HELP, show_default="price here"),
    documents: Optional[str] = _ESTIMATE_MASK.documents,
    window: Optional[str] = _ESTIMATE_MASK.window,
    window_pattern: Optional[str] = _ESTIMATE_MASK.window_pattern,
    seed: Optional[int] = _ESTIMATE_MASK.seed,
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Price one plan on a cluster: step time, MFU, memory and the per-phase breakdown."""
    from sp_plan.cli.report import plan_preset  # noqa: PLC0415 - as load_plan
    from sp_plan.pipeline import EstimateRequest, run_estimate  # noqa: PLC0415 - as in _planned
    from sp_plan.profiles.plans import load_plan  # noqa: PLC0415 - numpy: `presets` and --help do without it

    try:
        p = load_plan(path)
        if model is None and p.model is None:
            raise PlanError("--model", f"{path} names no model", "pass --model NAME|FILE")
        if seq_len is None and p.workload is None:
            raise PlanError("--seq-len", f"{path} names no workload", "pass --seq-len N")
        w = plan_workload(p.workload, seq_len, batch, causal, inference, documents, window, window_pattern, seed)
        if not as_json:
            print_notes(w)
        profile_options(profile, no_profile)
        if cluster is None:  # the preset the plan names, as `report` reads it
            cluster, count = plan_preset(p, path)
            nodes = nodes or count
        req = _request(EstimateRequest, server, plan=p, cluster=cluster, nodes=nodes, model=model, workload=w,
                       use_profile=not no_profile, profile=profile)
        res = _served_estimate(server, req) if server else run_estimate(req, store)
    except PlanError as e:
        fail(e)
    print_json(res) if as_json else _print_estimate(res)


def _print_estimate(res) -> None:
    """`estimate`'s report on the terminal: the plan, the profile line, the step's figures and breakdown."""
    p, c, w, pred = res.plan, res.cluster, res.workload, res.plan.predicted
    out.print(f"[bold]{p.summary()}[/] on {c.name} ({c.world_size} ranks), {res.model.name}, {workload_words(w)}",
              highlight=False)
    print_mask(w)
    _print_answer_notes(res, w)
    out.print(res.profile_line, highlight=False)
    out.print(f"step {secs(pred.step_time_s)}, {pred.tokens_per_s:,.0f} tokens/s, {mfu_text(pred, w.causal)}, peak memory "
              f"{gib(pred.peak_memory_bytes)} of {gib(pred.memory_capacity_bytes)}"
              + ("" if pred.fits else "  [bold red]does not fit[/]"))
    out.print(_explain(p, "step"))
    out.print(_breakdown(p))
    print_rank_work(p.model_copy(update={"workload": w}))


def workload_words(w) -> str:
    """A workload in the words `estimate` and `show` head their output with: tokens x batch, mask, training."""
    return (f"{w.seq_len:,} tokens x {w.batch}, {'causal' if w.causal else 'full'}, "
            f"{'training' if w.training else 'inference'}")


#: rank lists `show` prints per dimension (the rest are elided)
SHOWN_GROUPS = 4


def _shown_groups(p) -> dict[str, list[list[int]]]:
    """The groups `show` lists: the mesh's (as `init` builds them), and each merged group its breakdown names (a
    gradient sync's ``ulyssesxringxdp``), so every group a row prices is listed under the row's name."""
    layout = p.layout()
    groups = layout.all_groups()
    named = {r.group for r in (p.predicted.breakdown if p.predicted else []) if r.group}
    for name in sorted(named - set(groups)):
        groups[name] = layout.groups(name)  # a merged name (layout.merged_name) reads back
    return groups


@app.command()
def show(path: Path = typer.Argument(..., help="a plan file written by `sp-plan plan -o` (or by hand)")) -> None:
    """Print a plan file: layout, the groups its mesh makes (derived from degrees and order) and predictions."""
    from sp_plan.profiles.plans import load_plan  # noqa: PLC0415 - numpy: `presets` and --help do without it

    try:
        p = load_plan(path)
    except PlanError as e:
        fail(e)
    out.print(f"[bold]{p.summary()}[/]  (world {p.world_size}, cluster {p.cluster or '-'} {p.cluster_fingerprint or ''})")
    if p.model is not None or p.workload is not None:
        out.print(", ".join([*([p.model.name] if p.model else []), *([workload_words(p.workload)] if p.workload else [])]),
                  highlight=False)
    t = Table(title="groups")
    t.add_column("dimension")
    t.add_column("degree", justify="right")
    t.add_column("rank lists")
    for name, gs in _shown_groups(p).items():
        if len(gs[0]) > 1:
            shown = " ".join(str(g) for g in gs[:SHOWN_GROUPS]) + (" ..." if len(gs) > SHOWN_GROUPS else "")
            t.add_row(name, str(len(gs[0])), shown)
    out.print(t)
    if p.predicted:
        pr = p.predicted
        out.print(f"step {secs(pr.step_time_s)}, {pr.tokens_per_s:,.0f} tokens/s, {mfu_text(pr, p.workload is None or p.workload.causal)}, "
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


class _Commands(MutableMapping):
    """The app's commands by name, in its order, each built by typer from its function when first looked up: a
    command line runs one command, and building the options of every command from its signature (~20 commands, ~25
    option lists) took ~0.02 s of each start. Listing them (`sp-plan --help`, a mistyped command's suggestions)
    builds them all."""

    def __init__(self, source: typer.Typer):
        self._source = source
        self._infos: dict[str, Any] = {(i.name or typer.main.get_command_name(i.callback.__name__)): i
                                       for i in source.registered_commands}
        self._infos.update({g.name: g for g in source.registered_groups})
        self._built: dict[str, Any] = {}

    def __getitem__(self, name: str):
        if name not in self._built:
            info = self._infos[name]
            one = copy.copy(self._source)  # the app's settings and callback, with this command alone
            one.registered_commands = [info] if info in self._source.registered_commands else []
            one.registered_groups = [] if one.registered_commands else [info]
            self._built[name] = typer.main.get_command(one).commands[name]
        return self._built[name]

    def __setitem__(self, name: str, command) -> None:
        self._infos.setdefault(name, None)
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        del self._infos[name]
        self._built.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._infos)

    def __len__(self) -> int:
        return len(self._infos)


class _LazyGroup(TyperGroup):
    """The `sp-plan` group main() runs: the app's, with its commands built on first use (``_Commands``)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.commands = _Commands(app)


def _command_line() -> typer.Typer:
    """The app as main() runs it: its callback and settings, a ``_LazyGroup`` for its commands (``app`` itself, which
    tests and the docs' generator read, keeps every command registered)."""
    line = copy.copy(app)
    line.registered_commands, line.registered_groups = [], []
    line.info = copy.copy(app.info)
    line.info.cls = _LazyGroup
    return line


startup.resume()  # the app is loaded: the collector as it was (see cli/startup.py)


def usage_line(e: Exception) -> str:
    """A usage error's one line: what click says of the value (a declared range or choice broken, less the validator's
    'Value error, ' prefix) and where the command's help is."""
    ctx = getattr(e, "ctx", None)
    where = f"; see '{ctx.command_path} --help'" if ctx is not None else ""
    said = " ".join(e.format_message().replace("Value error, ", "").split())  # a choice list comes one per line
    return f"{said.rstrip('.')}{where}"


def run_line(args: Optional[list[str]] = None) -> int:
    """Run a command line (``args``, else the process's) as the console runs it; its exit status. Bad input is one
    line on stderr and 2, never a traceback; the command line's own usage errors too (an unknown option, a value of
    the wrong type or out of its declared range or choices, a missing option), which typer would box."""
    try:
        named = {} if args is None else {"args": args, "prog_name": "sp-plan"}
        code = _command_line()(standalone_mode=False, **named)
    except PlanError as e:  # pragma: no cover - commands catch their own
        print_error(str(e))
        return 2
    except typer.Abort:
        err.print("aborted", highlight=False)
        return 130
    except typer.TyperException as e:  # click's exceptions (typer vendors click): usage errors and the like
        ctx = getattr(e, "ctx", None)
        if type(e).__name__ == "NoArgsIsHelpError" and ctx is not None:  # bare `sp-plan`: its help
            out.print(ctx.get_help(), highlight=False, markup=False)
            return 0
        line = usage_line(e)
        print_error(line)
        _json_error(ctx, sys.argv[1:] if args is None else args, line)
        return getattr(e, "exit_code", 2)
    return code if isinstance(code, int) else 0


#: the commands whose ``--json`` streams events (cli/progress.py), the last of them a result or an error
EVENT_COMMANDS = ("tune", "links")


def _json_error(ctx, argv: list[str], message: str) -> None:
    """A command that streams JSON events (``--json``) ends with its error event on stdout, a usage error too."""
    if ctx is not None and ctx.info_name in EVENT_COMMANDS and "--json" in argv:
        from sp_plan.cli.progress import JsonReporter

        JsonReporter(ctx.info_name).error(message)


def main() -> None:
    """Console entry point: ``run_line`` of the process's arguments, then exit with its status."""
    gc.freeze()  # the process is the command's: what loading the app built stays out of its collections
    code = run_line()
    if code == 0:
        exit_without_teardown(code)  # the command is done: its output flushed, its files written and closed
    sys.exit(code)


if __name__ == "__main__":
    main()
