"""The command line's contract with its user: each flag reaches the search, the service request or the store it
names (none dropped, none swapped), a refused command line exits 2 naming the flag to change, files land where
``-o`` says, ``--json`` keeps stdout one JSON document, and `profile` commands pick profiles by topology, newest
first."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import sp_plan.cli.app as cli_app
from sp_plan.cli.app import app, run_line
from sp_plan.planner.errors import PlanError
from sp_plan.planner.profile import Profile
from sp_plan.profiles.plans import load_plan

HERE = Path(__file__).parent
PLAN16 = HERE / "fixtures" / "plans" / "usp-16-with-groups.yaml"
PROFILE = HERE / "fixtures" / "profile-dgx-h100.yaml"
SMALL = ["plan", "--cluster", "cpu-local", "--model", "tiny-llama", "--seq-len", "256", "--no-profile"]
runner = CliRunner()


def cli(*args):
    """The command line run in-process; the result with stdout and stderr apart."""
    return runner.invoke(app, [str(a) for a in args])


def refused(r) -> str:
    """The one stderr line of a refused command line (exit 2, no traceback)."""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (r.exit_code, r.output)
    assert "Traceback" not in r.output
    return lines[0]


class Asked(Exception):
    """What a fake service was asked."""


@pytest.fixture
def served(monkeypatch):
    """`--server`'s client replaced by one that records each request and refuses it."""
    seen = []

    class Fake:
        def plan(self, req):
            seen.append(req)
            raise PlanError("top", "recorded", "none")

        estimate = plan

    monkeypatch.setattr(cli_app, "_client", lambda server: Fake())
    return seen


@pytest.fixture
def store(tmp_path, monkeypatch):
    """An empty store's URL, and $SP_PLAN_STORE unset."""
    monkeypatch.delenv("SP_PLAN_STORE", raising=False)
    return f"sqlite:///{tmp_path}/store.db"


def test_plan_writes_the_winner_it_ranks_first(tmp_path):
    """`plan -o` writes the ranking's first layout, not another row."""
    out = tmp_path / "best.yaml"
    r = cli(*SMALL, "--top", "3", "--json", "-o", out)
    assert r.exit_code == 0, r.output
    assert load_plan(out).summary() == load_plan_summary(json.loads(r.stdout)["plans"][0])


def load_plan_summary(row: dict) -> str:
    """A JSON plan row's summary line, as a plan file's."""
    from sp_plan.planner.plan import Plan

    return Plan.model_validate(row).summary()


def test_plan_json_with_an_output_file_is_one_json_document(tmp_path):
    """`plan --json -o FILE` prints the JSON document alone (no 'wrote FILE' on stdout)."""
    r = cli(*SMALL, "--json", "-o", tmp_path / "best.yaml")
    assert r.exit_code == 0 and json.loads(r.stdout)["plans"], r.output


def test_plan_json_with_workload_notes_is_one_json_document():
    """`plan --json` keeps the workload's notes off stdout."""
    r = cli(*SMALL, "--window", "4096", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["plans"], r.output


@pytest.mark.parametrize("extra,flag", [
    (["--sensitivity"], "--sensitivity"),
    (["--report", "r.html"], "--report"),
    (["--jobs", "2"], "--jobs"),
])
def test_plan_flags_a_server_cannot_take_are_refused_naming_them(served, tmp_path, extra, flag):
    """`plan --server` with a flag that needs the search here names that flag and sends nothing."""
    extra = [str(tmp_path / e) if e.endswith(".html") else e for e in extra]
    line = refused(cli(*SMALL, "--server", "http://127.0.0.1:9", *extra))
    assert line.startswith(f"error: {flag}: "), line
    assert served == []


def test_plan_server_gets_the_flags_and_an_inline_cluster_file(served, tmp_path):
    """`plan --server` sends --top, --seed, --no-profile and a cluster file's contents (not its path)."""
    from sp_plan.profiles import load_cluster

    cfile = tmp_path / "c.yaml"
    load_cluster("cpu-local", 1).save(cfile)
    cli("plan", "--cluster", cfile, "--model", "tiny-llama", "--seq-len", "256", "--no-profile", "--top", "3",
        "--server", "http://127.0.0.1:9")
    (req,) = served
    assert req.top == 3 and req.use_profile is False and req.nodes is None and not isinstance(req.cluster, str)


def test_plan_server_refuses_a_profile_file(served, tmp_path):
    """`plan --server --profile FILE` names --profile: a local file cannot be sent."""
    line = refused(cli(*SMALL[:-1], "--profile", PROFILE, "--server", "http://127.0.0.1:9"))
    assert line.startswith("error: --profile: ") and served == []


def test_plan_report_to_an_unwritable_path_names_report(tmp_path):
    """`plan --report` into a missing folder names --report, not -o."""
    (tmp_path / "file").write_text("")
    line = refused(cli(*SMALL, "--report", tmp_path / "file" / "r.html"))
    assert line.startswith("error: --report: "), line


def test_plan_passes_jobs_to_the_search(monkeypatch):
    """`plan --jobs N` runs the grid in N processes."""
    import sp_plan.pipeline

    seen = {}

    def search(req, inputs, **kw):
        seen.update(kw)
        raise PlanError("--jobs", "recorded", "none")

    monkeypatch.setattr(sp_plan.pipeline, "search", search)
    cli(*SMALL, "--jobs", "3")
    assert seen["jobs"] == 3


def test_plan_documents_seed_reaches_the_workload():
    """`plan --documents D --seed N` draws the packs with seed N (recorded in the answer)."""
    r = cli(*SMALL, "--documents", "magi-short", "--seed", "7", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["workload"]["seed"] == 7


def test_estimate_nodes_other_than_the_plans_cluster_is_refused():
    """`estimate PLAN --nodes N` prices at N nodes of the plan's preset, refusing a world the plan does not fill."""
    r = cli("estimate", PLAN16, "--nodes", "1", "--no-profile")
    assert r.exit_code == 2 and "16" in r.stderr, r.output


def test_estimate_store_is_the_one_given(store, tmp_path, monkeypatch):
    """`estimate --store URL` prices with that store's profiles, not $SP_PLAN_STORE's."""
    monkeypatch.setenv("SP_PLAN_STORE", f"sqlite:///{tmp_path}/env.db")
    pid = cli("profile", "import", PROFILE).stdout.strip()
    other = cli("profile", "import", PROFILE, "--store", store).stdout.strip()
    assert cli("profile", "delete", other, "--store", store).exit_code == 0
    r = cli("estimate", PLAN16, "--store", store, "--json")
    assert r.exit_code == 0 and pid not in r.stdout, r.output


def test_estimate_server_errors_name_the_plan_files_field(monkeypatch):
    """A service's error on `plan.X` is named `X` (the plan file's field) by `estimate --server`."""
    class Fake:
        def estimate(self, req):
            raise PlanError("plan.cluster_fingerprint", "not this cluster", "fix it")

    monkeypatch.setattr(cli_app, "_client", lambda server: Fake())
    line = refused(cli("estimate", PLAN16, "--server", "http://127.0.0.1:9"))
    assert "cluster_fingerprint" in line and "plan.cluster_fingerprint" not in line, line


def test_usage_errors_exit_2_in_one_line(capsys):
    """An unknown option exits 2 with one line; bare `sp-plan` prints help and exits 0."""
    assert run_line(["plan", "--bogus"]) == 2
    assert len([ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]) == 1
    assert run_line([]) == 0


def test_an_event_command_ends_its_json_with_the_usage_error(capsys):
    """`tune --json` with a bad option ends stdout with an error event; without --json stdout stays empty."""
    assert run_line(["tune", "--json", "--bogus"]) == 2
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["event"] == "error"
    assert run_line(["tune", "--bogus"]) == 2
    assert capsys.readouterr().out == ""


def test_export_dash_prints_and_writes_no_file(tmp_path, monkeypatch):
    """`export -o -` prints the export on stdout and writes no file named '-'."""
    monkeypatch.chdir(tmp_path)
    r = cli("export", PLAN16, "--to", "megatron", "-o", "-", "--no-profile")
    assert r.exit_code == 0 and r.stdout.strip() and not (tmp_path / "-").exists(), r.output


def test_export_nodes_names_nodes():
    """`export --nodes N` at a world other than the plan's names --nodes."""
    line = refused(cli("export", PLAN16, "--to", "megatron", "--nodes", "1", "--no-profile"))
    assert line.startswith("error: --nodes: "), line


def test_profile_list_is_newest_first(store, tmp_path):
    """`profile list` shows the newest profile above the older one."""
    old = Profile.load(PROFILE).model_copy(update={"created_at": "2021-01-01T00:00:00Z"})
    new = Profile.load(PROFILE).model_copy(update={"created_at": "2022-01-01T00:00:00Z", "loo_error_after": 0.5})
    for name, p in (("old.yaml", old), ("new.yaml", new)):
        p.save(tmp_path / name)
    ids = [cli("profile", "import", tmp_path / n, "--store", store).stdout.strip() for n in ("old.yaml", "new.yaml")]
    assert all(len(i) == 12 for i in ids), ids
    listing = cli("profile", "list", "--store", store).stdout
    assert listing.index(ids[1]) < listing.index(ids[0])


def test_profile_show_says_before_then_after(store):
    """`profile show` prints the leave-one-out error before fitting, then after."""
    pid = cli("profile", "import", PROFILE, "--store", store).stdout.strip()
    p = Profile.load(PROFILE)
    text = " ".join(cli("profile", "show", pid, "--store", store).stdout.split())
    assert f"{p.loo_error_before:.1%} before -> {p.loo_error_after:.1%} after" in text


def test_profile_reads_do_not_create_a_store(tmp_path, monkeypatch):
    """`profile list|show` of a missing SQLite file exits 2 and does not create it."""
    monkeypatch.delenv("SP_PLAN_STORE", raising=False)
    url = f"sqlite:///{tmp_path}/typo.db"
    refused(cli("profile", "list", "--store", url))
    assert not (tmp_path / "typo.db").exists()


def test_profile_import_makes_a_new_store(tmp_path, monkeypatch):
    """`profile import --store URL` of a new SQLite file creates the store."""
    monkeypatch.delenv("SP_PLAN_STORE", raising=False)
    r = cli("profile", "import", PROFILE, "--store", f"sqlite:///{tmp_path}/new.db")
    assert r.exit_code == 0 and len(r.stdout.strip()) == 12, r.output


def plan_file(tmp_path: Path, name: str, **fields) -> Path:
    """The 16-rank fixture plan without its groups and predictions, ``fields`` replaced (None: dropped)."""
    from sp_plan.planner.yamlio import yaml_dump, yaml_load

    data = {k: v for k, v in yaml_load(PLAN16.read_text()).items() if k not in ("groups", "predicted")}
    data.update(fields)
    path = tmp_path / name
    path.write_text(yaml_dump({k: v for k, v in data.items() if v is not None}))
    return path


def test_estimate_of_a_plan_without_a_workload_names_seq_len(tmp_path):
    """`estimate` of a plan file with no workload asks for --seq-len, not --model."""
    line = refused(cli("estimate", plan_file(tmp_path, "bare.yaml", workload=None), "--no-profile"))
    assert line.startswith("error: --seq-len: "), line


@pytest.fixture
def reported(monkeypatch):
    """`report`'s pipeline call replaced by one that records its arguments and refuses."""
    import sp_plan.pipeline

    seen = []

    def report(*args, **kw):
        seen.append((args, kw))
        raise PlanError("--top", "recorded", "none")

    monkeypatch.setattr(sp_plan.pipeline, "report", report)
    return seen


def test_report_defaults_to_eight_rows_with_the_sensitivity(reported, tmp_path):
    """`report` without --top and --no-sensitivity shows 8 rows and re-ranks under each change."""
    cli("report", "--cluster", "cpu-local", "--model", "tiny-llama", "--seq-len", "256", "--no-profile",
        "-o", tmp_path / "r.html")
    (args, kw), = reported
    c, m, w, given, top, sensitivity, spec, store = args
    assert (top, sensitivity, spec) == (8, True, False)


def test_report_passes_its_flags_to_the_pipeline(reported, tmp_path):
    """`report` hands on --nodes, --model (over the plan file's), --store and --jobs."""
    cli("report", PLAN16, "--cluster", "dgx-h100", "--nodes", "2", "--model", "llama3-70b", "--store",
        "sqlite:///x.db", "--jobs", "3", "-o", tmp_path / "r.html")
    (args, kw), = reported
    c, m, w, given, top, sensitivity, spec, store = args
    assert (c.world_size, m.name, store, kw["jobs"]) == (16, "llama3-70b", "sqlite:///x.db", 3)


def test_export_refuses_a_plan_made_for_another_cluster_fingerprint(tmp_path):
    """`export --nodes N` of a plan whose fingerprint is not its named preset's names --cluster."""
    bad = plan_file(tmp_path, "other.yaml", cluster_fingerprint="0123456789abcdef")
    line = refused(cli("export", bad, "--to", "megatron", "--nodes", "2", "--no-profile"))
    assert line.startswith("error: --cluster: "), line


@pytest.fixture
def ring_plan(tmp_path) -> Path:
    """A cpu-local plan DeepSpeed cannot express (all-gather K/V)."""
    out = tmp_path / "ring.yaml"
    r = cli("plan", "--cluster", "cpu-local", "--model", "tiny-llama", "--seq-len", "4096", "--batch", "2",
            "--no-profile", "--jobs", "1", "-o", out)
    assert r.exit_code == 0, r.output
    return out


def test_export_replaces_a_plan_only_with_nearest(ring_plan):
    """`export` of a plan the target cannot express exits 2 naming the nearest plan unless --nearest is given."""
    line = refused(cli("export", ring_plan, "--to", "deepspeed", "--no-profile"))
    assert "nearest" in line and "--nearest" in line, line


def test_export_nearest_search_takes_the_profile_flags(ring_plan, monkeypatch):
    """`export --nearest` searches with --no-profile and --store as given."""
    import sp_plan.profiles.resolve

    seen = []

    def resolve_params(c, profile, store):
        seen.append((profile, store))
        raise PlanError("--profile", "recorded", "none")

    monkeypatch.setattr(sp_plan.profiles.resolve, "resolve_params", resolve_params)
    cli("export", ring_plan, "--to", "deepspeed", "--nearest", "--no-profile", "--store", "sqlite:///x.db")
    assert seen == [(False, "sqlite:///x.db")]


def test_estimate_no_profile_ignores_the_stored_profile(tmp_path, monkeypatch):
    """`estimate --no-profile` prices without the store's profile for the plan's cluster."""
    monkeypatch.setenv("SP_PLAN_STORE", f"sqlite:///{tmp_path}/env.db")
    pid = cli("profile", "import", PROFILE).stdout.strip()
    assert pid in cli("estimate", PLAN16, "--json").stdout
    r = cli("estimate", PLAN16, "--no-profile", "--json")
    assert r.exit_code == 0 and pid not in r.stdout, r.output


@pytest.mark.multiprocess
def test_report_says_where_its_plan_ranks(tmp_path):
    """`report` of a fresh search says its plan is #1 of the rows shown and writes the page where -o says."""
    out = tmp_path / "r.html"
    r = cli("report", "--cluster", "cpu-local", "--model", "tiny-llama", "--seq-len", "256", "--no-profile",
            "--no-sensitivity", "--jobs", "1", "-o", out)
    assert r.exit_code == 0 and ": #1 of the " in r.stdout and out.stat().st_size > 0, r.output


def test_report_refuses_a_plan_made_for_another_cluster_fingerprint(reported, tmp_path):
    """`report PLAN` whose fingerprint is not its named preset's names --cluster before any search."""
    bad = plan_file(tmp_path, "other.yaml", cluster_fingerprint="0123456789abcdef")
    line = refused(cli("report", bad, "--no-profile", "-o", tmp_path / "r.html"))
    assert line.startswith("error: --cluster: ") and reported == [], line


def test_sensitivity_title_counts_the_changes_that_move_the_winner():
    """The sensitivity table's title counts the changes under which the winner changes."""
    from types import SimpleNamespace as NS

    from sp_plan.cli.report import sensitivity_table

    w = NS(summary=lambda: "ring ring4", predicted=NS(step_time_s=1.0))
    held = NS(holds=True, what="a", winner=w, old_winner_s=1.0, base_s=1.0, loss=0.0)
    moved = NS(holds=False, what="b", winner=w, old_winner_s=1.2, base_s=1.0, loss=0.1)
    assert "changes under 1 of 3 changes" in str(sensitivity_table(NS(winner=w, scenarios=[held, held, moved])).title)


def test_report_highlights_the_given_plan_not_the_winner(tmp_path, monkeypatch):
    """`report PLAN` of a plan that is not the winner marks that plan's row in the page."""
    import sp_plan.cli.report
    from sp_plan.planner.plan import Plan

    r = cli(*SMALL, "--top", "3", "--json")
    given = Plan.model_validate(json.loads(r.stdout)["plans"][2])
    given.save(tmp_path / "third.yaml")
    seen = {}
    monkeypatch.setattr(sp_plan.cli.report, "write_report",
                        lambda path, rows, c, chosen, *a, **kw: seen.update(rows=rows, chosen=chosen))
    r = cli("report", tmp_path / "third.yaml", "--no-profile", "--no-sensitivity", "--jobs", "1", "-o", tmp_path / "r.html")
    assert r.exit_code == 0, r.output
    assert seen["chosen"] != 0 and seen["rows"][seen["chosen"]].summary() == given.summary()
