"""`sp-plan report`: the HTML report of a plan (or of a fresh search), and the helpers `plan --report`,
`plan --sensitivity` share with it."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from typing import TYPE_CHECKING

import typer
from rich.table import Table

from sp_plan.cli.workload import plan_workload, print_notes, print_rank_work, workload_mask_options
from sp_plan.planner.errors import PlanError

if TYPE_CHECKING:
    from sp_plan.planner.cluster import Cluster
    from sp_plan.planner.plan import Plan
    from sp_plan.planner.sensitivity import Sensitivity


def _secs(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.3f} s"


def report_plans(plans: list[Plan], families: list[Plan], extra: Plan | None = None) -> tuple[list[Plan], int]:
    """The report's rows: the top plans, the best of every other algorithm variant and ``extra`` (a plan file's
    plan), each once, fastest first; and the index of the plan the report is about (``extra``, else the winner)."""
    rows, seen = [], set()
    for p in [*plans, *families, *([extra] if extra else [])]:
        if p.summary() not in seen:
            seen.add(p.summary())
            rows.append(p)
    rows.sort(key=lambda p: p.predicted.step_time_s)
    about = (extra or plans[0]).summary()
    return rows, next(i for i, p in enumerate(rows) if p.summary() == about)


def sensitivity_table(sen: Sensitivity) -> Table:
    """`plan --sensitivity`'s table: per changed input, does the winner hold and what it would lose."""
    n = sum(not s.holds for s in sen.scenarios)
    t = Table(title=f"sensitivity of {sen.winner.summary()}: "
                    + ("the winner holds under every change" if not n else f"the winner changes under {n} of "
                       f"{len(sen.scenarios)} changes"))
    for c in ("change", "winner", "winner's step under it", "winner loses"):
        right = c in ("winner's step under it", "winner loses")
        t.add_column(c, justify="right" if right else "left", no_wrap=not right)
    for s in sen.scenarios:
        verdict = "holds" if s.holds else f"changes to {s.winner.summary()} ({_secs(s.winner.predicted.step_time_s)})"
        t.add_row(s.what, verdict, f"{_secs(s.old_winner_s)} ({s.old_winner_s / s.base_s - 1:+.1%})",
                  "-" if s.holds else f"{s.loss:.1%}")
    return t


def write_report(path: Path, plans: list[Plan], cluster: Cluster, chosen: int = 0, profile=None,
                 sensitivity: Sensitivity | None = None, notes: list[str] | None = None, field: str = "--output") -> None:
    """Render the report and write it atomically (an unwritable path is a PlanError naming ``--report``/``-o``)."""
    from sp_plan.integrations.report import render_report
    from sp_plan.planner.yamlio import atomic_write

    html = render_report(plans, cluster, profile=profile, sensitivity=sensitivity, chosen=chosen, notes=notes)
    atomic_write(path, html, field)  # an unwritable path is a PlanError naming ``field``


def plan_cluster(plan: Plan, path: Path) -> Cluster:
    """The cluster a plan file names: a preset ``NAME`` or ``NAMExN`` (as `plan` writes it), checked against the
    plan's fingerprint."""
    from sp_plan.profiles import cluster_presets, load_cluster

    name = plan.cluster or ""
    m = re.fullmatch(r"(.+)x(\d+)", name)
    preset, nodes = (m.group(1), int(m.group(2))) if m and m.group(1) in cluster_presets() else (name, 1)
    if preset not in cluster_presets():
        raise PlanError("--cluster", f"{path} names cluster {name or '(none)'!r}, which is not a preset",
                        "pass --cluster NAME|FILE (and --nodes) for the cluster the plan was made for")
    c = load_cluster(preset, nodes)
    if plan.cluster_fingerprint and plan.cluster_fingerprint != c.fingerprint():
        raise PlanError("--cluster", f"{path} was made for a cluster {name!r} with fingerprint {plan.cluster_fingerprint}, "
                        f"not the preset's {c.fingerprint()}", "pass --cluster FILE with the cluster the plan was made for")
    return c


_REPORT_MASK = workload_mask_options(from_plan=True)


def report_cmd(
    path: Optional[Path] = typer.Argument(None, help="a plan file (its cluster, model and workload are used); "
                                          "or leave it out and pass --cluster, --model and --seq-len"),
    output: Path = typer.Option(..., "-o", "--output", help="the HTML file to write"),
    cluster: Optional[str] = typer.Option(None, "--cluster", help="preset name or cluster YAML file",
                                          show_default="the preset the plan file names"),
    nodes: Optional[int] = typer.Option(None, "--nodes", help="node count for a preset", show_default="1"),
    model: Optional[str] = typer.Option(None, "--model", help="model preset or file", show_default="the plan's"),
    seq_len: Optional[str] = typer.Option(None, "--seq-len", help="tokens per sequence", show_default="the plan's"),
    batch: Optional[int] = typer.Option(None, "--batch", help="global batch", show_default="the plan's, else 1"),
    causal: Optional[bool] = typer.Option(None, "--causal/--no-causal", help="causal (decoder) or full attention",
                                          show_default="the plan's, else causal"),
    inference: bool = typer.Option(False, "--inference", help="forward only (prefill)"),
    top: int = typer.Option(8, "--top", help="how many ranked layouts to show (plus the best of each algorithm variant)"),
    sensitivity: bool = typer.Option(True, "--sensitivity/--no-sensitivity",
                                     help="re-rank with each link class halved and doubled and compute at 80 %"),
    profile: Optional[str] = typer.Option(None, "--profile", help="calibration profile: a stored id or a file",
                                          show_default="the cluster's newest stored profile"),
    no_profile: bool = typer.Option(False, "--no-profile", help="price with the presets' default model terms, "
                                    "without a profile"),
    store: Optional[str] = typer.Option(None, "--store", help="profile store URL",
                                        show_default="$SP_PLAN_STORE, else SQLite in the user data directory"),
    documents: Optional[str] = _REPORT_MASK.documents,
    window: Optional[int] = _REPORT_MASK.window,
    window_pattern: Optional[str] = _REPORT_MASK.window_pattern,
    seed: Optional[int] = _REPORT_MASK.seed,
) -> None:
    """Write one self-contained HTML page with figures: ranked layouts, memory, predicted against measured, the
    cluster graph with the plan's groups, and its sensitivity."""
    from sp_plan.cli.app import _profile_options, err, fail, out
    from sp_plan.planner.calibration import resolve_params
    from sp_plan.planner.plan import Plan
    from sp_plan.planner.search import finish, finish_each, grid_search, no_plan_error, profile_tag
    from sp_plan.planner.sensitivity import sensitivity as rerank
    from sp_plan.profiles import load_cluster, load_model

    try:
        if top < 1:
            raise PlanError("--top", f"must be at least 1, got {top}", "pass --top 1 or more")
        given = Plan.load(path) if path else None
        if given is None and (cluster is None or model is None or seq_len is None):
            raise PlanError("plan", "no plan file and not all of --cluster, --model, --seq-len",
                            "pass a plan file, or --cluster NAME --model NAME --seq-len N")
        c = load_cluster(cluster, nodes) if cluster else plan_cluster(given, path)
        if model is None and given.model is None:
            raise PlanError("--model", f"{path} names no model", "pass --model NAME|FILE")
        m = load_model(model) if model else given.model
        base = given.workload if given else None
        if seq_len is None and base is None:
            raise PlanError("--seq-len", f"{path} names no workload", "pass --seq-len N")
        w = plan_workload(base, seq_len, batch, causal, inference, documents, window, window_pattern, seed)
        print_notes(w)
        params, line, prof = resolve_params(c, _profile_options(profile, no_profile), store)
        with err.status("ranking every layout"):
            res = grid_search(c, m, w, keep=top, params=params)
            res.profile, res.profile_line = profile_tag(prof), line
            if not res.ranked:
                raise no_plan_error(c, w, res)
            plans, families = finish(res, c, m, w, top), finish_each(res, c, m, w)
        extra = None
        if given is not None:
            extra = given.model_copy(update={"model": m, "workload": w, "predicted": res.estimator(given),
                                             "profile": profile_tag(prof), "cluster": c.name,
                                             "cluster_fingerprint": c.fingerprint()})
        rows, chosen = report_plans(plans, families, extra)
        sen = None
        if sensitivity:
            with err.status("sensitivity: ranking again under each changed input"):
                sen = rerank(c, m, w, plans[0], params)
        write_report(output, rows, c, chosen, prof, sen, [line])
    except PlanError as e:
        fail(e)
    out.print(line, highlight=False)
    out.print(f"{rows[chosen].summary()}: #{chosen + 1} of the {len(rows)} layouts shown, "
              f"step {_secs(rows[chosen].predicted.step_time_s)}", highlight=False)
    print_rank_work(rows[chosen])
    if sen is not None:
        out.print(sensitivity_table(sen))
    out.print(f"wrote {output}")


def register(app: typer.Typer) -> None:
    app.command("report")(report_cmd)
