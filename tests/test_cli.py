"""The CLI as a user runs it: exit codes and one-line errors from a fresh process; what a command answers read from
its ``--json`` (the response model the service answers with), run in this process."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sp_plan.cli.app import app, run_line
from sp_plan.cli.export import TARGET_NAMES
from sp_plan.integrations.export import TARGETS
from sp_plan.pipeline import EstimateResponse, PlanResponse
from sp_plan.planner import Plan

SP = [sys.executable, "-m", "sp_plan.cli.app"]
ONE_LAYER = str(Path(__file__).parent / "fixtures" / "models" / "one-layer.yaml")
TWO_NODES = ["plan", "--cluster", "dgx-h100", "--nodes", "2", "--model", "llama3-8b", "--seq-len", "128k"]
runner = CliRunner()


def run(*args, cwd=None):
    return subprocess.run(SP + list(args), capture_output=True, text=True, cwd=cwd, timeout=120)


def answer(model, *args):
    """The command's ``--json`` answer, read as its response model ``model`` (run in this process)."""
    r = runner.invoke(app, [*map(str, args), "--json"])
    assert r.exit_code == 0, r.output
    return model.model_validate_json(r.stdout)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """The grid's answer for 16 H100s, llama3-8b at 128k, planned once for the module, and the plan file it wrote."""
    path = tmp_path_factory.mktemp("two-nodes") / "a.yaml"
    return answer(PlanResponse, *TWO_NODES, "-o", path), path


def test_plan_writes_a_plan_that_loads_back_equal_and_is_deterministic(tmp_path, two_nodes):
    res, path = two_nodes
    a = Plan.load(path)
    assert a == res.winner == res.plans[0]  # the file holds the answer's winner
    r = run(*TWO_NODES, "-o", str(tmp_path / "b.json"))  # another process, the other file format
    assert r.returncode == 0, r.stderr
    assert Plan.load(tmp_path / "b.json") == a
    assert a.world_size == 16 and a.cluster_fingerprint == res.cluster.fingerprint
    assert not a.groups  # the file holds the mesh, not its groups
    assert a.with_groups().groups["sp"] == a.layout().groups("sp") and "groups" not in path.read_text()
    # Plan.load reads back what save wrote, equal
    a.save(tmp_path / "c.yaml")
    assert Plan.load(tmp_path / "c.yaml") == a
    show = runner.invoke(app, ["show", str(path)])
    assert show.exit_code == 0 and "groups" in show.stdout, show.output


def test_presets_lists_clusters_and_models():
    r = run("presets")
    assert r.returncode == 0
    for name in ("dgx-h100", "a100-16-eth100", "ascend-910b-8", "llama3-70b", "llama-30b"):
        assert name in r.stdout


@pytest.mark.parametrize("args,needle", [
    (["plan", "--cluster", "dgx-h999", "--model", "llama3-8b", "--seq-len", "128k"], "cluster: unknown preset 'dgx-h999'"),
    (["plan", "--cluster", "dgx-h100", "--model", "llama9", "--seq-len", "128k"], "model: unknown preset 'llama9'"),
    (["plan", "--cluster", "dgx-h100", "--nodes", "0", "--model", "llama3-8b", "--seq-len", "128k"], "Invalid value for '--nodes'"),
    (["plan", "--cluster", "dgx-h100", "--model", "llama3-8b", "--seq-len", "12x"], "--seq-len: cannot read '12x'"),
    (["plan", "--cluster", "dgx-h100", "--model", ONE_LAYER, "--seq-len", "1001"], "--seq-len: no layout of 8 ranks can split 1001 tokens"),
    # a message with what reads as rich markup (gloo's "[/__w/.../pair.cc:553]") is printed as it is
    (["plan", "--cluster", "[/nope]", "--model", "llama3-8b", "--seq-len", "8k"], "cluster: unknown preset '[/nope]'"),
])
def test_bad_input_exits_2_with_one_line(args, needle):
    r = run(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert needle in r.stderr
    assert "Traceback" not in r.stderr
    assert len([l for l in r.stderr.splitlines() if l.strip()]) == 1


PLAN_8K = ["plan", "--cluster", "dgx-h100", "--model", "llama3-8b", "--seq-len", "8k"]
TUNE_512 = ["tune", "--cluster", "cpu-local", "--model", "tiny-llama", "--seq-len", "512"]


@pytest.mark.parametrize("args,flag,says", [
    ([*PLAN_8K, "--top", "0"], "--top", "1"),
    ([*PLAN_8K, "--batch", "-1"], "--batch", "1"),
    ([*PLAN_8K, "--trials", "0"], "--trials", "1"),
    ([*PLAN_8K, "--seed", "-1"], "--seed", "0"),
    ([*PLAN_8K, "--search", "anneal"], "--search", "'grid', 'bayes'"),
    (["estimate", "p.yaml", "--cluster", "dgx-h100", "--batch", "0"], "--batch", "1"),
    (["report", "-o", "r.html", "--top", "0"], "--top", "1"),
    (["export", "p.yaml", "--to", "nemo"], "--to", ", ".join(map(repr, TARGETS))),
    (["export", "p.yaml", "--to", "megatron", "--nodes", "0"], "--nodes", "1"),
    (["profile", "list", "--nodes", "0"], "--nodes", "1"),
    (["serve", "--port", "70000"], "--port", "65535"),
    (["serve", "--workers", "0"], "--workers", "1"),
    (["serve", "--max-body", "0"], "--max-body", "1"),
    ([*TUNE_512, "--pool", "0"], "--pool", "1"),
    ([*TUNE_512, "--warmup", "-1"], "--warmup", "0"),
    ([*TUNE_512, "--kernel-timing", "both"], "--kernel-timing", "'auto', 'each', 'shared'"),
])
def test_declared_ranges_and_choices_answer_one_line(capsys, args, flag, says):
    """A flag outside its declared range or choices: exit 2, one line naming the flag and what it takes."""
    assert run_line(args) == 2
    e = capsys.readouterr().err
    lines = [ln for ln in e.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in e, e
    assert lines[0].startswith(f"error: Invalid value for '{flag}': "), lines
    said = lines[0].split(": ", 2)[2].split("; see")[0]  # what is wrong with the value, less the help's pointer
    assert says in said, lines


def test_help_shows_the_declared_ranges_and_choices():
    h = runner.invoke(app, ["plan", "--help"], terminal_width=200)
    assert h.exit_code == 0 and "x>=1" in h.stdout and "grid|bayes" in h.stdout, h.stdout
    s = runner.invoke(app, ["serve", "--help"], terminal_width=200)
    assert "1<=x<=65535" in s.stdout, s.stdout


def test_export_choices_are_the_exporters():
    assert TARGET_NAMES == tuple(TARGETS)


def test_heads_not_divisible_and_seq_not_divisible_name_the_field(tmp_path):
    m = tmp_path / "m.yaml"
    m.write_text("name: odd\nlayers: 2\nhidden: 96\nheads: 3\nvocab: 0\n")
    # 3 heads: no ulysses degree > 1 divides them on 8 GPUs; ring still works, so the plans split heads by 1 or 3
    res = answer(PlanResponse, "plan", "--cluster", "dgx-h100", "--model", m, "--seq-len", "4k")
    assert res.plans and all(p.degrees.get("ulysses", 1) in (1, 3) for p in res.plans)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nlayers: 2\nhidden: 100\nheads: 3\n")
    r = run("plan", "--cluster", "dgx-h100", "--model", str(bad), "--seq-len", "4k")
    assert r.returncode == 2 and "model.head_dim: hidden 100 is not divisible by heads 3" in r.stderr


def test_malformed_yaml_and_wrong_plan_file(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("node_types: {a: [1, 2\n")
    r = run("plan", "--cluster", str(bad), "--model", "llama3-8b", "--seq-len", "8k")
    assert r.returncode == 2 and "is not valid YAML" in r.stderr and "Traceback" not in r.stderr
    p = tmp_path / "p.yaml"
    p.write_text("algorithm: ring\ndegrees: {ring: 4, ulysses: 2}\norder: [ring, ulysses]\n")
    r = run("show", str(p))
    assert r.returncode == 2 and "degrees.ulysses: algorithm ring needs ulysses 1" in r.stderr


def test_inference_and_no_causal_flags():
    res = answer(PlanResponse, "plan", "--cluster", "l20-8-pcie", "--model", "llama2-7b", "--seq-len", "32k",
                 "--inference", "--no-causal", "--top", "3")
    assert (res.workload.training, res.workload.causal) == (False, False)
    assert len(res.plans) >= 3 and all(p.workload == res.workload for p in res.plans)
    phases = {c.name for p in res.plans for c in p.predicted.breakdown}
    assert phases and not any("bwd" in name for name in phases)  # inference: no backward pass is priced


def test_estimate_refuses_a_plan_for_another_cluster(tmp_path):
    from sp_plan.pipeline import estimate, plan
    from sp_plan.planner import PlanError, Workload
    from sp_plan.profiles import load_cluster, load_model

    m, w = load_model("llama2-7b"), Workload(seq_len="16k")
    p = plan(load_cluster("dgx-h100"), m, w, top_k=1)[0]
    with pytest.raises(PlanError, match="cluster_fingerprint: the plan was made for cluster dgx-h100"):
        estimate(p, load_cluster("dgx-a100"), m, w)
    # without the fingerprint it is a what-if on the other cluster
    q = p.model_copy(update={"cluster_fingerprint": None})
    assert estimate(q, load_cluster("dgx-a100"), m, w).step_time_s > p.predicted.step_time_s


def test_bayes_search_from_the_cli(two_nodes):
    res = answer(PlanResponse, *TWO_NODES, "--search", "bayes", "--trials", "80", "--seed", "1")
    assert (res.search.kind, res.search.trials) == ("bayes", 80) and 0 <= res.search.best_trial < 80
    grid = two_nodes[0]
    assert grid.search.kind == "grid"
    assert res.winner.predicted.step_time_s == pytest.approx(grid.winner.predicted.step_time_s, rel=0.01)
    bad = run("plan", "--cluster", "dgx-h100", "--model", "llama3-8b", "--seq-len", "64k", "--search", "anneal")
    assert bad.returncode == 2 and "Invalid value for '--search': 'anneal'" in bad.stderr and "'bayes'" in bad.stderr


def test_estimate_prices_a_hand_written_plan_and_refuses_another_world(tmp_path):
    p = tmp_path / "mine.yaml"
    Plan(algorithm="usp", degrees={"ulysses": 4, "ring": 2}, order=["ulysses", "ring"], token_layout="zigzag",
         zero_stage=3).save(p)
    res = answer(EstimateResponse, "estimate", p, "--cluster", "dgx-h100", "--model", "llama3-8b", "--seq-len", "64k")
    mine = res.plan
    split = {dim: d for dim, d in mine.degrees.items() if d > 1}
    assert (mine.algorithm, split, mine.token_layout, mine.zero_stage) == ("usp", {"ulysses": 4, "ring": 2}, "zigzag", 3)
    assert res.cluster.world_size == 8 and res.workload.seq_len == 65536 and res.model.name == "llama3-8b"
    assert 0 < mine.predicted.mfu < 1 and {c.kind for c in mine.predicted.breakdown} >= {"compute", "communication"}
    r = run("estimate", str(p), "--cluster", "dgx-h100", "--nodes", "2", "--model", "llama3-8b", "--seq-len", "64k")
    assert r.returncode == 2 and "degrees: the plan uses 8 ranks but the cluster has 16" in r.stderr
    r = run("estimate", str(p), "--cluster", "dgx-h100")
    assert r.returncode == 2 and "--model" in r.stderr
    r = run("estimate", str(p), "--model", "llama3-8b", "--seq-len", "64k")  # a hand-written plan names no cluster
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--cluster" in r.stderr and "not a preset" in r.stderr


def test_estimate_prices_a_plan_on_the_preset_its_cluster_name_spells(tmp_path):
    """Without --cluster, `estimate` reads the plan's cluster as `plan` named it (dgx-h100x2: two dgx-h100 nodes),
    as it reads the model and workload; the same prediction as with the flags spelled out."""
    out = tmp_path / "p.yaml"
    assert runner.invoke(app, [*TWO_NODES, "--no-profile", "-o", str(out)]).exit_code == 0
    implied = answer(EstimateResponse, "estimate", out, "--no-profile")
    spelled = answer(EstimateResponse, "estimate", out, "--cluster", "dgx-h100", "--nodes", "2", "--no-profile")
    assert implied.cluster.name == "dgx-h100x2" and implied.cluster.world_size == 16
    assert implied.plan.predicted.step_time_s == spelled.plan.predicted.step_time_s


@pytest.mark.parametrize("args", [["plan", "--cluster", "cpu-local", "--model", "tiny-gpt", "--seq-len", "1k",
                                   "--batch", "abc"], ["plan", "--bogus"], ["plan"], ["nosuchcmd"],
                                  ["estimate", "--cluster", "cpu-local"]])
def test_command_line_usage_errors_are_one_line_and_exit_2(args):
    """The console entry point (main): typer's own usage errors -- a value of the wrong type, an unknown option or
    command, a missing option or argument -- are one `error:` line and exit 2, like every other bad input."""
    r = subprocess.run([sys.executable, "-m", "sp_plan.cli.app", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--help" in lines[0], r.stderr


def test_a_usage_error_of_a_command_streaming_json_events_ends_with_its_error_event(capsys):
    """`tune --json` with a flag out of its declared range: click refuses it before the command runs, and the event
    stream a log reader follows still ends with an error event (stdout), beside the one error line (stderr)."""
    from sp_plan.cli.app import run_line

    assert run_line(["tune", "--cluster", "cpu-local", "--model", "tiny-llama", "--seq-len", "512", "--budget", "0",
                     "--json"]) == 2
    got = capsys.readouterr()
    (line,) = got.out.splitlines()
    ev = json.loads(line)
    assert ev["event"] == "error" and "--budget" in ev["message"] and "--budget" in got.err
    assert run_line(["plan", "--cluster", "dgx-h100", "--model", "llama3-8b", "--seq-len", "8k", "--top", "0",
                     "--json"]) == 2
    assert capsys.readouterr().out == ""  # plan --json prints an answer, not events


def test_table_data_cells_print_as_they_are():
    """A data cell that reads as rich markup (``text_row``) prints as it is, bracketed words and all."""
    import io

    from rich.console import Console
    from rich.table import Table

    from sp_plan.cli.console import text_row

    t = Table()
    t.add_column("phase")
    text_row(t, "[bold]ring[/] send [3]")
    c = Console(file=io.StringIO(), width=80)
    c.print(t)
    assert "[bold]ring[/] send [3]" in c.file.getvalue()


def test_bayes_trials_that_sample_no_valid_layout_name_the_trials_not_the_length():
    """One trial that samples no valid degrees says so and names --trials; the length, which a grid search splits,
    is not blamed."""
    r = run("plan", "--cluster", "cpu-local", "--model", "tiny-gpt", "--seq-len", "4k", "--no-profile",
            "--search", "bayes", "--trials", "1")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith("error: --trials: no valid layout of 4 ranks in 1 trial(s)"), r.stderr
    assert "seq_len" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert run("plan", "--cluster", "cpu-local", "--model", "tiny-gpt", "--seq-len", "4k", "--no-profile").returncode == 0


def test_a_batch_or_a_layer_count_beyond_any_model_is_refused_at_once(tmp_path):
    """--batch over 2^30 sequences and a model of more than 10,000 layers: one line each, before any search (the
    search walks the batch's divisors and the layers' stage split)."""
    import yaml

    from sp_plan.profiles import load_model

    r = run("plan", "--cluster", "cpu-local", "--model", "tiny-gpt", "--seq-len", "4k", "--no-profile",
            "--batch", str(10**18))
    assert r.returncode == 2 and "--batch" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    m = load_model("tiny-gpt").model_dump(mode="json") | {"layers": 10_000_019}
    (tmp_path / "deep.yaml").write_text(yaml.safe_dump(m))
    r = run("plan", "--cluster", "cpu-local", "--model", str(tmp_path / "deep.yaml"), "--seq-len", "4k", "--no-profile")
    assert r.returncode == 2 and r.stderr.startswith("error: model.layers:"), r.stderr


def test_a_plan_for_more_nodes_of_the_same_preset_asks_for_its_node_count():
    """Priced on one node of the preset it was made for on two, a plan's error says --nodes 2; on another preset it
    says to plan again."""
    from sp_plan.pipeline import estimate, plan
    from sp_plan.planner import PlanError, Workload
    from sp_plan.profiles import load_model, preset_cluster

    m, w = load_model("llama2-7b"), Workload(seq_len="16k")
    p = plan(preset_cluster("dgx-h100", 2), m, w, top_k=1, profile=False)[0]
    with pytest.raises(PlanError) as e:
        estimate(p, preset_cluster("dgx-h100", 1), m, w, profile=False)
    assert e.value.fix.startswith("pass --nodes 2")
    with pytest.raises(PlanError) as e:
        estimate(p, preset_cluster("dgx-a100", 2), m, w, profile=False)
    assert e.value.fix.startswith("plan again")
