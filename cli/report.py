"""`sp-plan report`: the HTML report of a plan (or of a fresh search), and the helpers `plan --report`,
`plan --sensitivity` share with it."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.table import Table

from sp_plan.cli.console import err, out
from sp_plan.cli.options import STORE_DEFAULT, fail, jobs_option, owns_collector, profile_options
from sp_plan.cli.workload import plan_workload, print_notes, print_rank_work, workload_mask_options
from sp_plan.planner.cluster import preset_nodes
from sp_plan.planner.errors import PlanError
from sp_plan.planner.model import MAX_BATCH, MAX_TOP
from sp_plan.planner.ranking import secs
from sp_plan.profiles import cluster_presets, load_cluster, load_model, preset_cluster

if TYPE_CHECKING:
    from sp_plan.planner.cluster import Cluster
    from sp_plan.planner.model import ModelSpec, Workload
    from sp_plan.planner.plan import Plan
    from sp_plan.planner.sensitivity import Sensitivity


def report_plans(plans: list[Plan], families: list[Plan], extra: Plan | None = None) -> tuple[list[Plan], int]:
    """The report's rows and the index of the plan it is about: ``sp_plan.pipeline.report_plans``."""
    from sp_plan.pipeline import report_plans as rows  # noqa: PLC0415 - the pipeline loads numpy; --help does not

    return rows(plans, families, extra)


def sensitivity_table(sen: Sensitivity) -> Table:
    """`plan --sensitivity`'s table: per changed input, does the winner hold and what it would lose."""
    n = sum(not s.holds for s in sen.scenarios)
    t = Table(title=f"sensitivity of {sen.winner.summary()}: "
                    + ("the winner holds under every change" if not n else f"the winner changes under {n} of "
                       f"{len(sen.scenarios)} changes"))
    for c in ("change", "winner", "winner's step under it", "winner loses"):  # a new winner's layout wraps: the
        right = c in ("winner's step under it", "winner loses")            # figures beside it keep their width
        t.add_column(c, justify="right" if right else "left", no_wrap=c != "winner")
    for s in sen.scenarios:
        verdict = "holds" if s.holds else f"changes to {s.winner.summary()} ({secs(s.winner.predicted.step_time_s)})"
        t.add_row(s.what, verdict, f"{secs(s.old_winner_s)} ({s.old_winner_s / s.base_s - 1:+.1%})",
                  "-" if s.holds else f"{s.loss:.1%}")
    return t


def write_report(path: Path, plans: list[Plan], cluster: Cluster, chosen: int = 0, profile=None,
                 sensitivity: Sensitivity | None = None, notes: list[str] | None = None, field: str = "--output",
                 ranked: int | None = None) -> None:
    """Render the report and write it atomically (an unwritable path is a PlanError naming ``--report``/``-o``)."""
    from sp_plan.integrations.report import render_report  # noqa: PLC0415 - matplotlib: only a report loads it
    from sp_plan.planner.yamlio import atomic_write  # noqa: PLC0415 - beside render_report, which needs the planner

    from sp_plan.workers import usable_cores  # noqa: PLC0415

    html = render_report(plans, cluster, profile=profile, sensitivity=sensitivity, chosen=chosen, notes=notes,
                         jobs=usable_cores(), ranked=ranked)
    atomic_write(path, html, field)  # an unwritable path is a PlanError naming ``field``


def plan_preset(plan: Plan, path: Path) -> tuple[str, int]:
    """(preset, nodes) of the cluster a plan file was made for: the preset it names (``plan.cluster``, as `plan`
    writes it) with as many nodes as the plan's world fills (``plan.world_size``)."""
    name = plan.cluster or ""
    preset, count = preset_nodes(name)  # ``preset_name`` read back: dgx-h100x2 is 2 dgx-h100 nodes
    if preset in cluster_presets():
        per_node = preset_cluster(preset, 1).devices_per_node
        nodes = max(1, plan.world_size // per_node)
        if name == preset or (count == nodes and plan.world_size % per_node == 0):
            return preset, nodes
        check_plan_world(plan, path)
    raise PlanError("--cluster", f"{path} names cluster {name or '(none)'!r}, which is not a preset",
                    "pass --cluster NAME|FILE (and --nodes) for the cluster the plan was made for")


def check_plan_world(plan: Plan, path: Path) -> None:
    """A plan file whose degrees make another world than the preset cluster it names (``dgx-h100x2``: 16 ranks)
    holds, refused naming the degrees; a cluster that is no preset's name is not checked here."""
    preset, count = preset_nodes(plan.cluster or "")
    if preset not in cluster_presets():
        return
    ranks = count * preset_cluster(preset, 1).devices_per_node
    if ranks != plan.world_size:
        raise PlanError("degrees", f"{path}'s degrees make {plan.world_size} ranks, and the cluster it names, "
                        f"{plan.cluster!r}, has {ranks}", "fix the plan's degrees, or pass --cluster NAME|FILE (and "
                        "--nodes) for a cluster of that many ranks")


def plan_cluster(plan: Plan, path: Path, nodes: Optional[int] = None) -> Cluster:
    """The preset cluster a plan file was made for (``plan_preset``; ``nodes`` of it where given), checked against
    the plan's fingerprint."""
    preset, count = plan_preset(plan, path)
    name = plan.cluster or ""
    if nodes is not None and nodes != count:
        raise PlanError("--nodes", f"{path} was made for {name!r}, {count} node(s) of {preset}, and --nodes asks "
                        f"for {nodes}", f"drop --nodes (the plan's cluster is used), or pass --cluster {preset} with it")
    c = load_cluster(preset, count)
    if plan.cluster_fingerprint and plan.cluster_fingerprint != c.fingerprint():
        raise PlanError("--cluster", f"{path} was made for a cluster {name!r} with fingerprint "
                        f"{plan.cluster_fingerprint}, not the preset's {c.fingerprint()}",
                        "pass --cluster FILE with the cluster the plan was made for")
    return c


_REPORT_MASK = workload_mask_options(from_plan=True)


def report_cmd(
    path: Optional[Path] = typer.Argument(None, help="a plan file (its cluster, model and workload are used); "
                                          "or leave it out and pass --cluster, --model and --seq-len"),
    output: Path = typer.Option(..., "-o", "--output", help="the HTML file to write"),
    cluster: Optional[str] = typer.Option(None, "--cluster", help="preset name or cluster YAML file",
                                          show_default="the preset the plan file names"),
    nodes: Optional[int] = typer.Option(None, "--nodes", min=1, help="node count for a preset",
                                        show_default="a plan file's where --cluster is not given, else 1"),
    model: Optional[str] = typer.Option(None, "--model", help="model preset or file", show_default="the plan's"),
    seq_len: Optional[str] = typer.Option(None, "--seq-len", help="tokens per sequence", show_default="the plan's"),
    batch: Optional[int] = typer.Option(None, "--batch", min=1, max=MAX_BATCH, help="global batch", show_default="the plan's, else 1"),
    causal: Optional[bool] = typer.Option(None, "--causal/--no-causal", help="causal (decoder) or full attention",
                                          show_default="the plan's, else causal"),
    inference: bool = typer.Option(False, "--inference", help="forward only (prefill)"),
    top: int = typer.Option(8, "--top", min=1, max=MAX_TOP, help="how many ranked layouts to show (plus the best of each algorithm variant)"),
    sensitivity: bool = typer.Option(True, "--sensitivity/--no-sensitivity",
                                     help="re-rank with each link class halved and doubled and compute at 80 %"),
    profile: Optional[str] = typer.Option(None, "--profile", help="calibration profile: a stored id or a file",
                                          show_default="the cluster's newest stored profile"),
    no_profile: bool = typer.Option(False, "--no-profile", help="price with the presets' default model terms, "
                                    "without a profile"),
    store: Optional[str] = typer.Option(None, "--store", help="profile store URL", show_default=STORE_DEFAULT),
    documents: Optional[str] = _REPORT_MASK.documents,
    window: Optional[str] = _REPORT_MASK.window,
    window_pattern: Optional[str] = _REPORT_MASK.window_pattern,
    seed: Optional[int] = _REPORT_MASK.seed,
    jobs: Optional[int] = jobs_option(),
) -> None:
    """Write one self-contained HTML page with figures: ranked layouts, memory, predicted against measured, the
    cluster graph with the plan's groups, and its sensitivity."""
    from sp_plan.pipeline import report  # noqa: PLC0415 - as in report_plans
    from sp_plan.workers import auto_jobs  # noqa: PLC0415 - as the pipeline

    try:
        given, c, m, w = _report_inputs(path, cluster, nodes, model, seq_len, batch, causal, inference, documents,
                                        window, window_pattern, seed)
        spec = profile_options(profile, no_profile)
        with err.status("ranking every layout" + (", then again under each changed input" if sensitivity else "")):
            rep = report(c, m, w, given, top, sensitivity, spec, store, jobs=jobs or auto_jobs())
        write_report(output, rep.rows, c, rep.chosen, rep.profile, rep.sensitivity, [rep.line], ranked=rep.ranked)
    except PlanError as e:
        fail(e)
    shown = rep.rows[rep.chosen]
    out.print(rep.line, highlight=False)
    where = f"#{rep.chosen + 1}" if rep.ranked is None or rep.chosen < rep.ranked else "below the top"
    out.print(f"{shown.summary()}: {where} of the {len(rep.rows)} layouts shown, "
              f"step {secs(shown.predicted.step_time_s)}", highlight=False)
    print_rank_work(shown)
    if rep.sensitivity is not None:
        out.print(sensitivity_table(rep.sensitivity))
    out.print(f"wrote {output}")


def _report_inputs(path: Optional[Path], cluster: Optional[str], nodes: Optional[int], model: Optional[str],
                   seq_len: Optional[str], batch: Optional[int], causal: Optional[bool], inference: bool,
                   documents: Optional[str], window: Optional[int], window_pattern: Optional[str],
                   seed: Optional[int]) -> tuple[Optional[Plan], Cluster, ModelSpec, Workload]:
    """The plan file (if any), cluster, model and workload a report is about: the flags, else the plan file's."""
    from sp_plan.profiles.plans import load_plan  # noqa: PLC0415 - as in report_plans

    given = load_plan(path) if path else None
    if given is None and (cluster is None or model is None or seq_len is None):
        raise PlanError("plan", "no plan file and not all of --cluster, --model, --seq-len",
                        "pass a plan file, or --cluster NAME --model NAME --seq-len N")
    c = load_cluster(cluster, nodes) if cluster else plan_cluster(given, path, nodes)
    if model is None and given.model is None:
        raise PlanError("--model", f"{path} names no model", "pass --model NAME|FILE")
    base = given.workload if given else None
    if seq_len is None and base is None:
        raise PlanError("--seq-len", f"{path} names no workload", "pass --seq-len N")
    w = plan_workload(base, seq_len, batch, causal, inference, documents, window, window_pattern, seed)
    print_notes(w)
    return given, c, load_model(model) if model else given.model, w


def register(app: typer.Typer) -> None:
    """Add `report` to the main app, run with the collector paused around its searches (options.owns_collector)."""
    app.command("report")(owns_collector(report_cmd))
