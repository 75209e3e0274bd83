"""Hand-edited plan files at the command line: a preset's name where the planner takes a definition is read in, and
every refusal is exit 2 with one ``error: FIELD: PROBLEM; FIX`` line naming the field a user edits."""
from __future__ import annotations

from pathlib import Path

import pytest

from sp_plan.cli.app import run_line
from sp_plan.pipeline import EstimateResponse
from sp_plan.planner import Plan
from sp_plan.planner.yamlio import yaml_dump, yaml_load
from sp_plan.profiles.documents import document_presets

#: a plan `sp-plan plan --cluster dgx-h100 --nodes 2 --model llama3-8b --seq-len 128k -o` wrote, with its groups
OLD = Path(__file__).parent / "fixtures" / "plans" / "usp-16-with-groups.yaml"
ON_ITS_CLUSTER = ["--cluster", "dgx-h100", "--nodes", "2", "--no-profile"]


def edited(tmp_path: Path, name: str, **fields) -> str:
    """The fixture's plan, less its groups and predictions, with ``fields`` replaced (None: dropped), as a file."""
    data = {k: v for k, v in yaml_load(OLD.read_text()).items() if k not in ("groups", "predicted")}
    data.update(fields)
    path = tmp_path / name
    path.write_text(yaml_dump({k: v for k, v in data.items() if v is not None}))
    return str(path)


def one_error(capsys, *args: str) -> str:
    """The one line a refused command line prints (it must exit 2, with no traceback)."""
    capsys.readouterr()
    assert run_line(list(args)) == 2
    e = capsys.readouterr().err
    lines = [ln for ln in e.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in e, e
    return lines[0]


def estimated(capsys, path: str) -> EstimateResponse:
    """`estimate PATH` on the plan's cluster, read from its --json answer."""
    capsys.readouterr()
    assert run_line(["estimate", path, *ON_ITS_CLUSTER, "--json"]) == 0, capsys.readouterr().err
    return EstimateResponse.model_validate_json(capsys.readouterr().out)


def test_a_named_distribution_in_a_plan_file_is_read_as_the_flag_reads_it(tmp_path, capsys):
    """``documents: magi-short`` is what ``--documents magi-short`` gives; ``nosuch`` lists the names."""
    work = yaml_load(OLD.read_text())["workload"]
    named = edited(tmp_path, "named.yaml", workload={**work, "documents": "magi-short"})
    assert run_line(["show", named]) == 0, capsys.readouterr().err
    capsys.readouterr()  # the same plan without documents, given them by the flag
    assert run_line(["estimate", edited(tmp_path, "flag.yaml"), *ON_ITS_CLUSTER, "--documents", "magi-short",
                     "--json"]) == 0
    flag = EstimateResponse.model_validate_json(capsys.readouterr().out)
    res = estimated(capsys, named)
    assert res.workload.documents == flag.workload.documents and res.workload.documents.name == "magi-short"
    assert res.plan.predicted.step_time_s == flag.plan.predicted.step_time_s

    capsys.readouterr()  # export reads it too: Megatron's packed-sequence flags, as for --documents (its Ulysses
    # alone runs packed documents as planned: the nearest plan)
    assert run_line(["export", named, "--to", "megatron", "--no-profile", "--nearest"]) == 0, capsys.readouterr().err
    assert "--reset-attention-mask" in capsys.readouterr().out

    unknown = edited(tmp_path, "nosuch.yaml", workload={**work, "documents": "nosuch"})
    for command in (["show", unknown], ["estimate", unknown, *ON_ITS_CLUSTER],
                    ["report", unknown, "-o", str(tmp_path / "r.html"), "--no-profile"],
                    ["export", unknown, "--to", "megatron"]):
        line = one_error(capsys, *command)
        assert line.startswith("error: workload.documents: unknown distribution 'nosuch'; use one of "), line
        assert all(name in line for name in document_presets()) and "load_documents" not in line, line


def test_a_model_preset_name_in_a_plan_file_is_the_preset(tmp_path, capsys):
    """``model: llama3-8b`` prices as the preset's fields written out; an unknown name lists the presets."""
    named = edited(tmp_path, "named.yaml", model="llama3-8b")
    assert run_line(["show", named]) == 0, capsys.readouterr().err
    res, full = estimated(capsys, named), estimated(capsys, edited(tmp_path, "full.yaml"))
    assert res.model == full.model and res.plan.predicted == full.plan.predicted

    unknown = edited(tmp_path, "nosuch.yaml", model="nosuch")
    for command in (["show", unknown], ["estimate", unknown, *ON_ITS_CLUSTER]):
        line = one_error(capsys, *command)
        assert line.startswith("error: plan.model: 'nosuch' is no model preset; write one of ["), line
        assert "'llama3-8b'" in line and "the model's fields" in line and "valid dictionary" not in line, line
    # a file's name is no preset: a plan is read wherever the command runs
    line = one_error(capsys, "show", edited(tmp_path, "file.yaml", model="my-model.yaml"))
    assert line.startswith("error: plan.model: 'my-model.yaml' is no model preset"), line


WALLFACER = {"algorithm": "wallfacer", "token_layout": "contiguous"}


def test_show_refuses_what_estimate_refuses_of_a_layout(tmp_path, capsys):
    """WallFacer's C^2 dividing the ring holds without a placement too: `show` and `estimate` say the same line."""
    bad = edited(tmp_path, "c2.yaml", **WALLFACER, degrees={"ring": 2, "team": 2, "dp": 8}, order=["ring", "dp"])
    lines = {one_error(capsys, "show", bad), one_error(capsys, "estimate", bad, *ON_ITS_CLUSTER)}
    assert lines == {"error: degrees.team: team 2 needs a ring divisible by C^2 = 4, not 2; choose C with C^2 "
                     "dividing the ring degree (C = 1 is Ring attention)"}, lines
    ulysses = edited(tmp_path, "u2.yaml", **WALLFACER, degrees={"ulysses": 2, "ring": 8, "team": 2},
                     order=["ulysses", "ring"])
    assert one_error(capsys, "show", ulysses).startswith("error: degrees.ulysses: wallfacer runs on a ring")
    for placement in (None, "p2p_intra"):  # C = 2 on a ring of 8: shown, with or without a placement
        good = edited(tmp_path, "good.yaml", **WALLFACER, degrees={"ring": 8, "team": 2, "dp": 2},
                      order=["ring", "dp"], placement=placement)
        capsys.readouterr()
        assert run_line(["show", good]) == 0, capsys.readouterr().err
        assert "wallfacer ring8 team2 dp2" in capsys.readouterr().out


@pytest.mark.parametrize("algorithm,degrees", [("ring", {"ring": 16}), ("usp", {"ulysses": 8, "ring": 2}),
                                               ("tokenring_ring", {"ring": 16, "team": 8})])
def test_a_placement_on_an_algorithm_that_reads_none_is_refused(tmp_path, capsys, algorithm, degrees):
    """Only WallFacer places its teams (eq. 8); TokenRing x Ring's teams are consecutive ring positions."""
    path = edited(tmp_path, "p.yaml", algorithm=algorithm, degrees=degrees, order=list(degrees),
                  token_layout="contiguous", placement="p2p_intra")
    for command in (["show", path], ["estimate", path, *ON_ITS_CLUSTER]):
        assert one_error(capsys, *command) == (f"error: placement: {algorithm} reads no placement; wallfacer alone "
                                               "places its teams; drop placement, or use algorithm wallfacer")


def test_groups_compare_as_sets_and_name_the_dimension_that_differs(tmp_path, capsys):
    """The same groups in another order load (a process group is its members); a wrong one names its dimension."""
    ring = yaml_load(OLD.read_text())["groups"]["ring"]  # [0, 8] [1, 9] ... [7, 15]

    def with_groups(name: str, **groups) -> str:
        data = yaml_load(OLD.read_text())
        data["groups"].update(groups)
        (tmp_path / name).write_text(yaml_dump(data))
        return str(tmp_path / name)

    reordered = with_groups("reordered.yaml", ring=[g[::-1] for g in ring[::-1]])
    assert run_line(["show", reordered]) == 0, capsys.readouterr().err
    assert Plan.load(reordered).groups == Plan.load(OLD).groups  # the layout's lists, in its order
    assert run_line(["show", str(OLD)]) == 0

    line = one_error(capsys, "show", with_groups("wrong.yaml", ring=[[9, 0], *ring[1:]]))
    assert line == ("error: groups.ring: [9, 0] is no ring group (degrees ulysses=8 x ring=2 and order [ulysses, "
                    "ring] make [0, 8] [1, 9] [2, 10] [3, 11] ...); drop groups (sp-plan derives them from degrees "
                    "and order), or fix groups.ring"), line
    twice = with_groups("twice.yaml", ring=[*ring[1:], [9, 1]], team=[[0, 1]])  # ring before team: ring is named
    assert one_error(capsys, "show", twice).startswith("error: groups.ring: [9, 1] is listed twice (")
    short = with_groups("short.yaml", ring=ring[1:])
    assert one_error(capsys, "show", short).startswith("error: groups.ring: [0, 8] is missing (")
    assert one_error(capsys, "show", with_groups("team.yaml", team=[[0, 1]])) == (
        "error: groups.team: the degrees and order make no team groups (they make ulysses, ring, sp); drop groups "
        "(sp-plan derives them from degrees and order)")


PROFILE = Path(__file__).parent / "fixtures" / "profile-dgx-h100.yaml"


@pytest.mark.parametrize("args, line", [
    (["show", str(PROFILE)], f"error: plan: {PROFILE} is a profile file, not a plan file; pass a plan file here, and "
                             "the profile file to --profile or `sp-plan profile import`"),
    (["plan", "--cluster", "dgx-h100", "--model", "tiny-gpt", "--seq-len", "4k", "--profile", str(OLD)],
     f"error: --profile: {OLD} is a plan file, not a profile file; pass a profile file here, and the plan file to "
     "`sp-plan show`, `estimate` or `export`"),
    (["plan", "--cluster", str(OLD), "--model", "tiny-gpt", "--seq-len", "4k"],
     f"error: --cluster: {OLD} is a plan file, not a cluster file; pass a cluster file here, and the plan file to "
     "`sp-plan show`, `estimate` or `export`"),
])
def test_a_file_of_another_kind_is_named_as_such(args, line, capsys):
    assert run_line(args) == 2
    assert capsys.readouterr().err.strip().splitlines() == [line]
