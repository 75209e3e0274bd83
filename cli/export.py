"""`sp-plan export`: a plan file into what Megatron-LM, torchtitan, DeepSpeed, yunchang, xDiT or accelerate read."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Literal, Optional

import typer

from sp_plan.planner.errors import PlanError

if TYPE_CHECKING:
    from sp_plan.planner.plan import Plan


#: the exporters' names (``sp_plan.integrations.export.TARGETS``, whose import loads the planner: every command would
#: pay for it at start), the choices of ``--to``; tests/test_cli.py holds the two equal
TARGET_NAMES = ("megatron", "torchtitan", "deepspeed", "yunchang", "xdit", "accelerate")


def _cluster(p: Plan, path: Path, cluster: str | None, nodes: int | None):
    """The cluster the export is for: --cluster (at --nodes), else the plan's preset at --nodes or at the plan's
    world; a world other than the plan's is refused naming the flag."""
    from sp_plan.profiles import load_cluster, preset_cluster

    if cluster is None:
        node = _plan_preset(p, path, "for --nodes" if nodes else "to search the nearest plan on")
        per_node = preset_cluster(node, 1).world_size
        c = preset_cluster(node, nodes or max(1, p.world_size // per_node))
        _check_world(p, c, "nodes" if nodes else "cluster", lambda n: preset_cluster(node, n))
        if p.cluster_fingerprint and c.fingerprint() != p.cluster_fingerprint:
            raise PlanError("--cluster", f"preset {node!r} at {c.num_nodes} node(s) is not the cluster {path} was "
                            f"made for (fingerprint {p.cluster_fingerprint})", "pass --cluster FILE and --nodes")
        return c
    c = load_cluster(cluster, nodes)
    _check_world(p, c, "cluster", lambda n: load_cluster(cluster, n))
    return c


def _plan_preset(p: Plan, path: Path, use: str) -> str:
    """The node type of the preset cluster the plan names (``preset_nodes``); PlanError where it names none."""
    from sp_plan.planner.cluster import preset_nodes
    from sp_plan.profiles import preset_cluster

    if not p.cluster:
        raise PlanError("--cluster", f"{path} names no cluster {use}",
                        "pass --cluster NAME|FILE (and --nodes for a preset)")
    node, _ = preset_nodes(p.cluster)
    try:
        preset_cluster(node, 1)
    except PlanError:
        raise PlanError("--cluster", f"{path} was made for cluster {p.cluster!r}, which is not a preset",
                        "pass --cluster FILE (the cluster file the plan was made with)") from None
    return node


def _check_world(p: Plan, c, field: str, at_nodes: Callable[[int], object]) -> None:
    """PlanError on ``field`` (the flag that chose ``c``) where ``c`` has other than the plan's ranks; the fix names
    the --nodes at which ``at_nodes`` (the same cluster at n nodes) has them, where one does."""
    if c.world_size == p.world_size:
        return
    n = _nodes_for(p.world_size, c, at_nodes)
    fix = (f"pass --nodes {n} ({n} x {c.nodes[0]}: {p.world_size} ranks)" if n else
           f"pass a --cluster of {p.world_size} devices")
    raise PlanError(field, f"the plan needs {p.world_size} ranks ({p.degree_text()}), {c.name} has {c.world_size}",
                    f"{fix}, or plan again for {c.name}")


def _nodes_for(world: int, c, at_nodes: Callable[[int], object]) -> int | None:
    """The node count at which ``c``'s nodes hold ``world`` ranks, where ``at_nodes`` builds it (a preset, a preset's
    spec file; a full cluster file has its own nodes); None where none does."""
    per_node, rest = divmod(c.world_size, c.num_nodes)
    if rest or world % per_node:
        return None
    try:
        return world // per_node if at_nodes(world // per_node).world_size == world else None
    except PlanError:
        return None


def export_cmd(
    path: Path = typer.Argument(..., help="a plan file (written by `sp-plan plan -o`)"),
    to: Literal[TARGET_NAMES] = typer.Option(..., "--to", help="the framework to write for"),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="write the export here (-: print it)",
                                          show_default="print it"),
    nearest_: bool = typer.Option(False, "--nearest", help="if the target cannot express the plan, export the nearest "
                                  "plan it can express instead"),
    cluster: Optional[str] = typer.Option(None, "--cluster", help="cluster the export is for, its world the plan's; "
                                          "the nearest plan is searched on it", show_default="the plan's preset"),
    nodes: Optional[int] = typer.Option(None, "--nodes", min=1, help="node count of the --cluster preset (or of the "
                                        "plan's)", show_default="the plan's world"),
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
    from sp_plan.cli.report import check_plan_world
    from sp_plan.integrations.export import target
    from sp_plan.planner.yamlio import atomic_write
    from sp_plan.profiles.plans import load_plan

    try:
        p = load_plan(path)
        t = target(to)
        t.check_workload(p)
        if cluster is None and nodes is None:  # the plan's own cluster: its degrees must fill it
            check_plan_world(p, path)
        # a given --cluster or --nodes is resolved and its world checked whether or not a nearest plan needs it
        c = _cluster(p, path, cluster, nodes) if cluster is not None or nodes is not None else None
        p, note = _expressible(t, p, path, c, nearest_, profile_options(profile, no_profile), store)
        text = t.export(p)
    except PlanError as e:
        fail(e)
    if note:
        err.print(note, highlight=False, soft_wrap=True)
    if output and str(output) != "-":  # '-' is standard output, as for most tools
        try:
            atomic_write(output, text)
        except PlanError as e:
            fail(e)
        out.print(f"wrote {output} ({t.name})", highlight=False)
    else:
        print(text, end="")


def _expressible(t, p: Plan, path: Path, c, nearest_: bool, profile, store: str | None) -> tuple[Plan, str | None]:
    """(the plan to export, the line naming the nearest plan where it replaces ``p``): ``p`` where ``t`` expresses it,
    else the nearest plan on ``c`` (None: the plan's preset) with --nearest, else PlanError naming it."""
    from sp_plan.integrations.export.nearest import nearest, same_plan_in_another_order
    from sp_plan.planner.plan import order_text
    from sp_plan.profiles.resolve import resolve_params

    problems = t.problems(p)
    if not problems:
        return p, None
    if p.model is None or p.workload is None:
        raise PlanError(problems[0][0], problems[0][1] + f" (and {path} names no model and "
                        "workload to search the nearest plan with)", "make the plan with `sp-plan plan -o`")
    c = c or _cluster(p, path, None, None)
    params, _, prof = resolve_params(c, profile, store)
    same = same_plan_in_another_order(t, p, c, params)
    if same is not None:  # what `plan` shows as "same: order ...": the one the target places
        return same, (f"exporting the same plan in mesh order {order_text(same.order, same.degrees)}, which {t.name} "
                      f"places and sp-plan prices alike ({problems[0][1]})")
    near = nearest(t, p, c, p.model, p.workload, params=params, profile=prof)
    line = f"{problems[0][1]}; nearest: {near.plan.summary()}, {near.change * 100:+.1f} % step time"
    if not nearest_:
        raise PlanError(problems[0][0], line, "pass --nearest to export it")
    return near.plan, f"exporting the nearest plan: {line}"


def register(app: typer.Typer) -> None:
    """Add `export` to the main `sp-plan` app."""
    app.command("export")(export_cmd)
