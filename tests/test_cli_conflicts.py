"""Command lines whose flags cannot all take effect, and plan files that contradict themselves, are refused in one
line naming what to change: a flag the command would drop, or a file's value blamed on a flag, sends a user to fix
the wrong thing. ``--json`` output stays one JSON document whatever else the command prints."""
from __future__ import annotations

import json

import pytest

from sp_plan.cli.app import run_line
from sp_plan.planner.yamlio import yaml_load
from test_plan_file_errors import OLD, edited, one_error

SMALL = ["plan", "--cluster", "cpu-local", "--model", "tiny-llama", "--seq-len", "256", "--no-profile"]


def test_a_missing_choice_names_every_choice_on_one_line(capsys):
    line = one_error(capsys, "export", str(OLD))
    assert "--to" in line and "megatron" in line and "accelerate" in line


@pytest.mark.parametrize("extra,flag", [
    (["--storage", "sqlite:///study.db"], "--storage"),
    (["--trials", "5"], "--trials"),
])
def test_flags_a_plan_would_drop_are_refused_naming_the_flag(capsys, extra, flag):
    line = one_error(capsys, *SMALL, *extra)
    assert line.startswith(f"error: {flag}: "), line


def test_a_bayesian_search_takes_its_trials(capsys):
    capsys.readouterr()
    assert run_line([*SMALL, "--search", "bayes", "--trials", "20", "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["search"]["trials"] == 20


def test_plan_json_with_the_sensitivity_is_one_json_document(capsys):
    capsys.readouterr()
    assert run_line([*SMALL, "--json", "--sensitivity"]) == 0
    got = capsys.readouterr()
    assert json.loads(got.out)["plans"] and "bandwidth" in got.err.lower()  # the table went to stderr


def test_a_value_in_a_plan_file_is_named_where_it_sits_not_as_a_flag(tmp_path, capsys):
    work = yaml_load(OLD.read_text())["workload"]
    bad = edited(tmp_path, "seq0.yaml", workload={**work, "seq_len": 0})
    for command in (["show", bad], ["estimate", bad, "--no-profile"]):
        line = one_error(capsys, *command)
        assert line.startswith("error: workload.seq_len: ") and "seq0.yaml" in line, line


def test_degrees_that_do_not_fill_the_named_cluster_are_named(tmp_path, capsys):
    degrees = {**yaml_load(OLD.read_text())["degrees"], "ring": 4}  # 32 ranks; dgx-h100x2 has 16
    bad = edited(tmp_path, "wide.yaml", degrees=degrees)
    for command in (["estimate", bad, "--no-profile"], ["export", bad, "--to", "megatron", "--no-profile"]):
        line = one_error(capsys, *command)
        assert line.startswith("error: degrees: ") and "32 ranks" in line and "has 16" in line, line


def test_report_refuses_nodes_other_than_its_plans_cluster(tmp_path, capsys):
    line = one_error(capsys, "report", str(OLD), "--no-profile", "--nodes", "4", "-o", str(tmp_path / "r.html"))
    assert line.startswith("error: --nodes: ") and "2 node(s)" in line, line
    line = one_error(capsys, "report", str(OLD), "--top", "100000", "-o", str(tmp_path / "r.html"))
    assert "--top" in line and "1000" in line, line


@pytest.mark.parametrize("window", ["4", True, 0, 2.5])
def test_the_runtime_names_a_window_that_is_no_whole_number_of_tokens(window):
    """A window read from a config as "4" would compare unequal to 4, and True would run as a window of 1."""
    from sp_plan.planner.errors import PlanError
    from sp_plan.runtime.variants.ring import check_masks

    with pytest.raises(PlanError) as e:
        check_masks(None, window, None)
    assert e.value.field == "window" and repr(window) in e.value.problem
    assert check_masks(None, 4.0, None) == (None, 4)


def test_a_window_takes_the_suffixes_a_length_takes(capsys):
    capsys.readouterr()
    assert run_line([*SMALL, "--window", "1k", "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["workload"]["window"]["size"] == 1024
    assert "write a window like 4096 or 4k" in one_error(capsys, *SMALL, "--window", "abc")


@pytest.mark.parametrize("seq_len,fits", [("128k", True), ("1m", False)])
def test_an_estimate_that_does_not_fit_says_so_in_its_notes(capsys, seq_len, fits):
    """The notes are what a service's client reads: a plan over the device's memory is said there, with the sizes."""
    capsys.readouterr()
    assert run_line(["estimate", str(OLD), "--no-profile", "--seq-len", seq_len, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    said = [n for n in res["notes"] if "does not fit" in n]
    assert (not said) == fits and all("GiB a rank is over the device's" in n for n in said)


def test_a_bad_length_in_a_text_file_is_named_by_its_line(tmp_path, capsys):
    """A user opens the file at the line named: its comments and blank lines count, as in an editor."""
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("# lengths of the corpus\n\n100\n0\n")
    assert f"{lengths} line 4: length 0" in one_error(capsys, *SMALL, "--documents", str(lengths))
    table = tmp_path / "lengths.csv"
    table.write_text("length,source\n5,a\n,b\n")
    assert f"{table} row 2: an empty cell is not a whole number" in one_error(capsys, *SMALL, "--documents", str(table))


@pytest.mark.parametrize("pattern,global_layers", [("1:1", True), ("1000:1", False)])
def test_the_global_layers_imbalance_is_shown_only_where_some_layer_is_global(capsys, pattern, global_layers):
    """A pattern whose windowed run is longer than the model windows every layer: no global layer to report on."""
    capsys.readouterr()
    assert run_line([*SMALL, "--window", "64", "--window-pattern", pattern]) == 0, capsys.readouterr().err
    assert ("on the global ones" in capsys.readouterr().out) == global_layers
