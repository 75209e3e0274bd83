"""A command pays only for what it uses: the modules a fresh `sp-plan` process imports, read from sys.modules."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sp_plan.profiles import load_cluster

#: runs the console entry point with the given arguments; as it exits, prints the imported modules and the commands
#: typer built (from their functions' signatures) as JSON
WRAPPER = """import json, sys
import typer.main
built, _build = [], typer.main.get_command_from_info
def _record(*args, **kw):
    command = _build(*args, **kw)
    built.append(command.name)
    return command
typer.main.get_command_from_info = _record
sys.argv = ["sp-plan", *sys.argv[1:]]
def report():
    pipeline = sys.modules.get("sp_plan.pipeline")
    unbuilt = [n for n in dir(pipeline) if getattr(getattr(pipeline, n), "__pydantic_complete__", None) is False]
    print("MODULES=" + json.dumps(sorted(sys.modules)), file=sys.stderr)
    print("BUILT=" + json.dumps(built), file=sys.stderr)
    print("UNBUILT=" + json.dumps(unbuilt), file=sys.stderr)
import atexit
atexit.register(report)  # the entry point ends the process itself: its exit handlers are the last code that runs
from sp_plan.cli.app import main
main()
"""
#: what no command below needs: the store, the fits, figures, torch, the service, optuna
HEAVY = ("sqlalchemy", "alembic", "scipy", "matplotlib", "torch", "fastapi", "optuna", "pandas")


REPORTS = ("MODULES=", "BUILT=", "UNBUILT=")


def run(*args: str, cwd=None) -> dict[str, list[str]]:
    """What `sp-plan ARGS` (it must exit 0) had done when it finished: the modules imported (MODULES), the commands
    typer built (BUILT) and the pipeline's models whose validators were never built (UNBUILT)."""
    r = subprocess.run([sys.executable, "-c", WRAPPER, *args], capture_output=True, text=True, timeout=300, cwd=cwd)
    rest = "\n".join(x for x in r.stderr.splitlines() if not x.startswith(REPORTS))
    assert "error" not in rest, r.stderr
    return {k: json.loads(v) for k, _, v in (x.partition("=") for x in r.stderr.splitlines() if x.startswith(REPORTS))}


def imported(*args: str, cwd=None) -> set[str]:
    """The modules `sp-plan ARGS` had imported when it finished (it must exit 0)."""
    return set(run(*args, cwd=cwd)["MODULES"])


def top(mods: set[str]) -> set[str]:
    return {m.split(".")[0] for m in mods}


def test_plan_without_a_profile_imports_no_store_and_no_scipy(tmp_path):
    """`--no-profile` prices with the presets' defaults: no SQLAlchemy (the store), no SciPy (the fits); the
    pipeline's estimate response and per-rank work models, which plan does not use, are never built."""
    did = run("plan", "--cluster", "dgx-h100", "--nodes", "2", "--model", "llama3-8b", "--seq-len", "128k",
              "--no-profile", "-o", str(tmp_path / "plan.yaml"))
    mods = set(did["MODULES"])
    assert "sp_plan.planner.search" in mods and (tmp_path / "plan.yaml").exists()  # it did plan
    assert not top(mods) & set(HEAVY), sorted(top(mods) & set(HEAVY))
    assert "networkx" not in mods  # the engine routes on cluster.LinkGraph
    assert did["BUILT"] == ["plan"]
    assert {"EstimateResponse", "RankWork"} <= set(did["UNBUILT"])
    assert "PlanRequest" not in did["UNBUILT"] and "sp_plan.planner.sensitivity" not in mods


def test_plan_reads_the_store_without_sqlalchemy(tmp_path, monkeypatch):
    """A store at its schema head is read with sqlite3 alone, whether it holds no profile of the topology or the one
    the plan then uses; none needs the fitting code. A store $SP_PLAN_STORE names and that is not there is said and
    not made (plan only reads it)."""
    monkeypatch.setenv("SP_PLAN_STORE", f"sqlite:///{tmp_path / 'store.db'}")
    args = ("plan", "--cluster", "dgx-h100", "--nodes", "2", "--model", "llama3-8b", "--seq-len", "128k")
    light = {"scipy", "matplotlib", "torch", "fastapi", "optuna"}
    missing = subprocess.run([sys.executable, "-c", WRAPPER, *args], capture_output=True, text=True, timeout=300)
    mods = top(json.loads(next(x for x in missing.stderr.splitlines() if x.startswith("MODULES="))[8:]))
    assert missing.returncode == 0 and "no store at" in " ".join(missing.stdout.split()), missing.stdout
    assert not (tmp_path / "store.db").exists() and not mods & ({"sqlalchemy", "alembic"} | light)
    from sp_plan.profiles.store import Store  # noqa: PLC0415
    from test_store import make_profile  # noqa: PLC0415

    Store().close()
    mods = top(imported(*args))
    assert "sqlalchemy" not in mods and "alembic" not in mods and not mods & light
    Store().save_profile(make_profile(load_cluster("dgx-h100", nodes=2).topology_fingerprint()))
    r = subprocess.run([sys.executable, "-c", WRAPPER, *args], capture_output=True, text=True, timeout=300)
    mods = top(json.loads(next(x for x in r.stderr.splitlines() if x.startswith("MODULES="))[8:]))
    assert r.returncode == 0 and "using profile" in r.stderr + r.stdout, r.stderr
    assert not mods & ({"sqlalchemy", "alembic"} | light)


@pytest.mark.parametrize("args,builds", [(["presets"], ["presets"]), (["--help"], None), (["--version"], []),
                                         (["plan", "--help"], ["plan"])])
def test_listing_and_help_load_no_engine(args, builds):
    """Presets, help and version read files and text: no cost engine, schedules, search, numpy or networkx (a
    cluster file is checked without a graph library). Typer builds the command that runs, not all of them; the
    help's listing builds each (None: every command)."""
    did = run(*args)
    mods, built = set(did["MODULES"]), did["BUILT"]
    assert not top(mods) & (set(HEAVY) | {"numpy", "networkx"})
    assert not {"sp_plan.planner.estimate", "sp_plan.planner.schedules", "sp_plan.planner.search",
                "rich.progress"} & mods
    if builds is None:
        assert {"presets", "plan", "estimate", "show", "discover", "tune", "serve", "links", "list"} <= set(built)
    else:
        assert built == builds


def test_the_help_lists_every_command_of_the_app_in_its_order():
    """The group `sp-plan` runs (its commands built on first use) lists what the app registers, in the same order,
    and resolves each: the same command, options and help as typer builds for the app itself."""
    import typer
    from typer.testing import CliRunner

    from sp_plan.cli.app import _command_line, app

    eager, lazy = typer.main.get_command(app), typer.main.get_command(_command_line())
    ctx = lazy.make_context("sp-plan", ["presets"])
    assert lazy.list_commands(ctx) == eager.list_commands(ctx)
    for name in eager.list_commands(ctx):
        a, b = eager.commands[name], lazy.get_command(ctx, name)
        assert (type(a), a.help, a.epilog, [p.name for p in a.params]) == \
               (type(b), b.help, b.epilog, [p.name for p in b.params]), name
    runner = CliRunner()
    assert runner.invoke(_command_line(), ["--help"]).output == runner.invoke(app, ["--help"]).output


def test_loading_the_cli_runs_no_collection():
    """The app's modules load with the cyclic collector paused (cli/startup.py), and it is back on after."""
    code = ("import gc, sys\nn = []\ngc.callbacks.append(lambda phase, info: n.append(info) if phase == 'start' "
            "else None)\nimport sp_plan.cli.app\nprint(len(n), gc.isenabled())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    counted, enabled = r.stdout.split()
    assert r.returncode == 0 and enabled == "True", r.stdout + r.stderr
    assert int(counted) <= 3, r.stdout  # the interpreter's and sp_plan's first imports may run a young one or two


def test_show_derives_groups_without_the_engine(tmp_path):
    """`show` prints the groups from degrees and order (planner/layout.py) and needs no search."""
    from sp_plan.planner import Plan

    Plan(algorithm="usp", degrees={"ulysses": 4, "ring": 2}, order=["ulysses", "ring"]).save(tmp_path / "p.yaml")
    mods = imported("show", str(tmp_path / "p.yaml"))
    assert not top(mods) & set(HEAVY) and not {"sp_plan.planner.search", "networkx"} & mods


def test_importing_sp_plan_and_its_planner_is_light():
    """The package and the planner package load their names on first use."""
    code = ("import sys, sp_plan, sp_plan.planner; print(sorted(m for m in ('networkx', 'numpy', 'sp_plan.planner.search', "
            "'sp_plan.planner.estimate', 'sp_plan.planner.usp', 'torch', 'scipy', 'sqlalchemy') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_the_subpackages_are_attributes_of_the_package():
    """`import sp_plan` then `sp_plan.runtime.init(...)`, as after `import sp_plan.runtime`: each subpackage loads on
    first use, and an unknown name is still an AttributeError."""
    code = ("import sp_plan; print(sp_plan.runtime.init.__name__, sp_plan.planner.Plan.__name__, "
            "sp_plan.profiles.load_cluster.__name__, hasattr(sp_plan, 'nosuch'))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["init", "Plan", "load_cluster", "False"], r.stdout + r.stderr


@pytest.mark.parametrize("nodes", [1, 2])
def test_routes_without_networkx_are_the_routes_networkx_finds(nodes):
    """The engine routes on cluster.LinkGraph so that planning needs no networkx: on every preset, each pair of
    endpoints gets the path networkx's Dijkstra returns (ties included), and local_graph is the same graph."""
    import networkx as nx

    from sp_plan.profiles import cluster_presets, preset_cluster

    pairs = 0
    for name in cluster_presets():
        for nt in preset_cluster(name, nodes).node_types.values():
            lg, g = nt.link_graph(), nt.local_graph()
            assert list(g.nodes(data=True)) == list(lg.nodes.items())
            assert all(list(g.succ[v].items()) == list(lg.succ[v].items()) for v in g.nodes)
            for a in g.nodes:
                for b in g.nodes:
                    want = nx.shortest_path(g, a, b, weight="weight") if nx.has_path(g, a, b) else None
                    got = lg.shortest_path(a, b) if b in lg.reachable(a) else None
                    assert got == want, (name, a, b)
                    pairs += 1
    assert pairs > 1000
