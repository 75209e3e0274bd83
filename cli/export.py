"""`sp-plan export`: a plan file into what Megatron-LM, torchtitan, DeepSpeed, yunchang, xDiT or accelerate read."""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Optional

import typer

from sp_plan.planner.errors import PlanError

if TYPE_CHECKING:
    from sp_plan.planner.plan import Plan


#: the exporters' names (``sp_plan.integrations.export.TARGETS``, whose import loads the planner: every command would
#: pay for it at start), the choices of ``--to``; tests/test_cli.py holds the two equal
TARGET_NAMES = ("megatron", "torchtitan", "deepspeed", "yunchang", "xdit", "accelerate")


def _cluster(p: Plan, path: Path, cluster: str | None, nodes: int | None):
    """The cluster to price the nearest plan on: --cluster, else the plan's preset at the plan's world size."""
    from sp_plan.profiles import load_cluster, preset_cluster

    if cluster is None:
        if not p.cluster:
            raise PlanError("--cluster", f"{path} names no cluster to search for the nearest plan",
                            "pass --cluster NAME|FILE (and --nodes for a preset)")
        m = re.fullmatch(r"(.+)x(\d+)", p.cluster)  # presets name their clusters NAMExNODES
        name = m.group(1) if m else p.cluster
        try:
            per_node = preset_cluster(name, 1).world_size
        except PlanError:
            raise PlanError("--cluster", f"{path} was made for cluster {p.cluster!r}, which is not a preset",
                            "pass --cluster FILE (the cluster file the plan was made with)") from None
        c = load_cluster(name, nodes or max(1, p.world_size // per_node))
        if p.cluster_fingerprint and c.fingerprint() != p.cluster_fingerprint:
            raise PlanError("--cluster", f"preset {p.cluster!r} at {c.num_nodes} node(s) is not the cluster {path} was "
                            f"made for (fingerprint {p.cluster_fingerprint})", "pass --cluster FILE and --nodes")
    else:
        c = load_cluster(cluster, nodes)
    p.check_world(c.world_size)
    return c


def export_cmd(
    path: Path = typer.Argument(..., help="a plan file (written by `sp-plan plan -o`)"),
    to: Literal[TARGET_NAMES] = typer.Option(..., "--to", help="the framework to write for"),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="write the export here",
                                          show_default="print it"),
    nearest_: bool = typer.Option(False, "--nearest", help="if the target cannot express the plan, export the nearest "
                                  "plan it can express instead"),
    cluster: Optional[str] = typer.Option(None, "--cluster", help="cluster to search the nearest plan on",
                                          show_default="the plan's preset"),
    nodes: Optional[int] = typer.Option(None, "--nodes", min=1, help="node count for a --cluster preset",
                                        show_default="the plan's world"),
    profile: Optional[str] = typer.Option(None, "--profile", help="calibration profile for the nearest plan's search",
                                          show_default="the cluster's newest stored profile"),
    no_profile: bool = typer.Option(False, "--no-profile", help="price the nearest plan with the presets' default "
                                    "model terms, without a profile"),
    store: Optional[str] = typer.Option(None, "--store", help="profile store URL",
                                        show_default="$SP_PLAN_STORE, else SQLite in the user data directory"),
) -> None:
    """Write what a framework reads for a plan; a plan it cannot express exits 2 naming the nearest one it can."""
    from sp_plan.cli.console import err, out
    from sp_plan.cli.options import fail, profile_options
    from sp_plan.integrations.export import target
    from sp_plan.integrations.export.nearest import nearest
    from sp_plan.profiles.resolve import resolve_params
    from sp_plan.planner.plan import Plan
    from sp_plan.planner.yamlio import atomic_write

    try:
        p = Plan.load(path)
        t = target(to)
        t.check_workload(p)
        problems = t.problems(p)
        note = None
        if problems:
            if p.model is None or p.workload is None:
                raise PlanError(problems[0][0], problems[0][1] + f" (and {path} names no model and "
                                "workload to search the nearest plan with)", "make the plan with `sp-plan plan -o`")
            c = _cluster(p, path, cluster, nodes)
            params, _, prof = resolve_params(c, profile_options(profile, no_profile), store)
            near = nearest(t, p, c, p.model, p.workload, params=params, profile=prof)
            line = f"{problems[0][1]}; nearest: {near.plan.summary()}, {near.change * 100:+.1f} % step time"
            if not nearest_:
                raise PlanError(problems[0][0], line, "pass --nearest to export it")
            p, note = near.plan, line
        text = t.export(p)
    except PlanError as e:
        fail(e)
    if note:
        err.print(f"exporting the nearest plan: {note}", highlight=False, soft_wrap=True)
    if output:
        try:
            atomic_write(output, text)
        except PlanError as e:
            fail(e)
        out.print(f"wrote {output} ({t.name})", highlight=False)
    else:
        print(text, end="")


def register(app: typer.Typer) -> None:
    """Add `export` to the main `sp-plan` app."""
    app.command("export")(export_cmd)
