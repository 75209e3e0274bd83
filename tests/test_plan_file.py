"""The plan file stores the mesh, not its expansion: no groups written, any size; older files with groups still load."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sp_plan.planner import Plan, PlanError
from sp_plan.planner import yamlio
from sp_plan.pipeline import estimate
from sp_plan.service.planning import PlanRequest, run_plan
from sp_plan.planner.model import Workload
from sp_plan.profiles import load_model, preset_cluster

OLD = Path(__file__).parent / "fixtures" / "plans" / "usp-16-with-groups.yaml"


def test_a_131072_gpu_plan_file_holds_no_groups_and_stays_small(tmp_path):
    """At 131,072 ranks the expansion was ~655,000 integers (5 MB, most of the command's time); the mesh is a few
    lines, and every group follows from it (Plan.with_groups, `init`, `show`)."""
    cluster, model = preset_cluster("dgx-h100", 16384), load_model("llama3-70b")
    work = Workload(seq_len=1 << 20, batch=16)
    # the layout `sp-plan plan` picks for these inputs (docs/benchmarks/search.md), priced as it prices it
    layout = Plan(algorithm="usp", degrees={"tp": 8, "ulysses": 8, "ring": 128, "dp": 16}, token_layout="zigzag",
                  order=["tp", "dp", "ring", "ulysses"], zero_stage=1)
    winner = layout.model_copy(update={"model": model, "workload": work, "cluster": cluster.name,
                                       "cluster_fingerprint": cluster.fingerprint(),
                                       "predicted": estimate(layout, cluster, model, work, profile=False)})
    for path in (tmp_path / "plan.yaml", tmp_path / "plan.json"):
        winner.save(path)
        text = path.read_text()
        assert "groups" not in yamlio.yaml_load(text) and path.stat().st_size <= 50_000
        back = Plan.load(path)
        assert back == winner and back.world_size == 131072 and not back.groups
    full = back.with_groups()
    assert full.groups == back.layout().all_groups() and len(full.groups["sp"][0]) == back.sp


def test_a_file_with_groups_loads_and_its_groups_are_checked(tmp_path):
    """Files written before carry every group's rank lists: they load, their lists must match the layout, and
    saving the plan again writes the mesh only."""
    p = Plan.load(OLD)
    assert p.world_size == 16 and p.groups == p.layout().all_groups()
    p.save(tmp_path / "again.yaml")
    assert "groups" not in (tmp_path / "again.yaml").read_text()
    assert Plan.load(tmp_path / "again.yaml") == p.model_copy(update={"groups": {}})

    data = yamlio.yaml_load(OLD.read_text())
    data["groups"]["ring"][0] = [0, 9]  # a rank list the degrees and order do not make
    (tmp_path / "bad.yaml").write_text(yamlio.yaml_dump(data))
    with pytest.raises(PlanError) as e:
        Plan.load(tmp_path / "bad.yaml")
    assert e.value.field == "groups.ring" and "[0, 9] is no ring group" in e.value.problem


def test_plans_returned_to_callers_carry_no_groups_until_asked():
    """`POST /v1/plan`, `sp_plan.plan()` and the CLI return plans as the file holds them."""
    res = run_plan(PlanRequest(cluster="dgx-h100", nodes=2, model="llama3-8b", workload={"seq_len": "128k"},
                               use_profile=False, top=2))
    assert all(not p.groups for p in res.plans) and res.winner == res.plans[0]
    assert "groups" not in res.model_dump(mode="json")["winner"]
    assert res.winner.with_groups().groups["ulysses"] == res.winner.layout().groups("ulysses")


def test_the_c_emitter_writes_what_the_python_one_did():
    """libyaml's emitter (where PyYAML has it) writes the same text, and the Python loader reads it back as it was."""
    class PyDumper(yaml.SafeDumper):
        pass

    PyDumper.add_implicit_resolver("tag:yaml.org,2002:float", yamlio.FLOAT_RE, list("-+0123456789."))
    data = yamlio.yaml_load(OLD.read_text())
    data["profile"] = "123e4567"  # reads as a float unless quoted
    text = yamlio.yaml_dump(data)
    assert text == yaml.dump(data, Dumper=PyDumper, sort_keys=False, default_flow_style=None, width=120)
    assert yamlio.yaml_load(text) == data
    if hasattr(yaml, "CSafeDumper"):
        assert issubclass(yamlio._Dumper, yaml.CSafeDumper)


def test_reading_keeps_the_nesting_guard(tmp_path):
    """The Python loader refuses a document nested deeper than MAX_DEPTH (the C parser would not)."""
    path = tmp_path / "deep.yaml"
    path.write_text("a: " + "[" * (yamlio.MAX_DEPTH + 5) + "]" * (yamlio.MAX_DEPTH + 5) + "\n")
    with pytest.raises(PlanError) as e:
        Plan.load(path)
    assert "nesting deeper than" in e.value.problem


def test_libyaml_reads_every_file_as_the_python_loader_does():
    """Files are read on libyaml where PyYAML has it (presets read ~8x faster); every preset and fixture reads the
    same as through the Python loader, and text libyaml refuses falls back to it (its error message too)."""
    root = Path(__file__).parent.parent
    paths = sorted((root / "profiles").rglob("*.yaml")) + sorted((root / "tests" / "fixtures").rglob("*.yaml"))
    assert len(paths) > 20
    for path in paths:
        text = path.read_text()
        assert yamlio.yaml_load(text) == yaml.load(text, Loader=yamlio._Loader), path  # noqa: S506
    with pytest.raises(yaml.YAMLError) as e:
        yamlio.yaml_load("a: [1, 2\nb: 3\n")
    with pytest.raises(yaml.YAMLError) as py:
        yaml.load("a: [1, 2\nb: 3\n", Loader=yamlio._Loader)  # noqa: S506
    assert str(e.value) == str(py.value)


def test_allgather_with_ulysses_is_the_hybrid_and_ring_with_ulysses_is_refused(tmp_path):
    """All-gather x Ulysses is algorithm allgather with ulysses > 1; ring with ulysses still points at usp."""
    p = Plan(algorithm="allgather", degrees={"ulysses": 2, "ring": 4}, token_layout="zigzag")
    p.save(tmp_path / "hybrid.yaml")
    assert Plan.load(tmp_path / "hybrid.yaml") == p and p.sp == 8
    with pytest.raises(PlanError, match="degrees.ulysses.*ring needs ulysses 1"):
        Plan(algorithm="ring", degrees={"ulysses": 2, "ring": 4})


def test_a_plan_files_model_name_is_the_preset_whatever_files_the_command_runs_beside(tmp_path, monkeypatch):
    from sp_plan.profiles import load_model
    from sp_plan.profiles.plans import named_model

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny-llama").write_text("name: tiny-llama\nlayers: 99\nhidden: 256\nheads: 4\nffn_hidden: 512\n"
                                         "vocab: 1000\n")
    assert named_model("tiny-llama").layers == load_model("tiny-llama", files=False).layers != 99


def test_a_newer_plan_file_is_refused_for_its_version_before_its_names_are_read(tmp_path):
    """A name this sp-plan does not know may be a newer one's preset: the version is what to report."""
    from sp_plan.planner.errors import PlanError
    from sp_plan.profiles.plans import load_plan

    (tmp_path / "plan.yaml").write_text("schema_version: 99\nmodel: no-such-model\nalgorithm: ring\n")
    with pytest.raises(PlanError) as e:
        load_plan(tmp_path / "plan.yaml")
    assert e.value.field == "plan.schema_version" and "newer than this sp-plan" in e.value.problem
