"""Packed documents and sliding windows at the front door: the CLI as a user runs it (fresh processes for its printed
lines and one-line errors; its ``--json`` answers read in this process), the plan file, `show` and reports, the Python
API and the service, all through the one application pipeline."""
from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from sp_plan.cli.app import app
from sp_plan.pipeline import EstimateResponse, PlanResponse
from sp_plan.planner.model import Histogram, Workload
from sp_plan.planner.plan import Plan
from sp_plan.profiles import load_cluster, load_model
from sp_plan.service.planning import PlanRequest, mask_fields, rank_work, request_key, resolve, with_masks
from sp_plan.service.planning import plan as api_plan

SP = [sys.executable, "-m", "sp_plan.cli.app"]
PLAN = ["plan", "--cluster", "dgx-h100", "--model", "llama3-8b", "--seq-len", "16k", "--no-profile", "--top", "2"]
LENGTHS = [37, 512, 1900, 3000, 250, 7000, 64, 1024, 4444, 129] * 5
MASK = ["--window", "2048", "--window-pattern", "5:1", "--seed", "7"]
runner = CliRunner()


def run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(SP + list(args), capture_output=True, text=True, timeout=180, cwd=cwd)


def answer(model, *args):
    """The command's ``--json`` answer, read as its response model ``model`` (run in this process)."""
    r = runner.invoke(app, [*map(str, args), "--json"])
    assert r.exit_code == 0, r.output
    return model.model_validate_json(r.stdout)


@pytest.fixture(scope="module")
def lengths_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("lengths") / "lengths.txt"
    p.write_text("".join(f"{x}\n" for x in LENGTHS))
    return p


@pytest.fixture(scope="module")
def masked(lengths_file, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """`sp-plan plan` over the lengths file with a 5:1 window, planned once for the module: the finished process and
    the plan file it wrote."""
    out = tmp_path_factory.mktemp("masked") / "plan.yaml"
    return run(*PLAN, "--documents", str(lengths_file), *MASK, "-o", str(out)), out


def test_plan_records_a_file_as_its_histogram_and_estimate_and_show_read_it_back(lengths_file, masked):
    r, out = masked
    assert r.returncode == 0, r.stderr
    assert "mask: documents lengths.txt (seed 7), window 2048 on 5:1 layers\n" in r.stdout
    assert "per-rank work" in r.stdout
    text = out.read_text()
    docs = yaml.safe_load(text)["workload"]["documents"]
    assert docs["kind"] == "histogram" and docs["source"] == "lengths.txt" and "lengths" not in docs
    assert docs["sha256"] == hashlib.sha256(lengths_file.read_bytes()).hexdigest()
    p = Plan.load(out)
    assert p.workload.window.size == 2048 and p.workload.window.pattern == "5:1" and p.workload.seed == 7

    est = answer(EstimateResponse, "estimate", out, "--cluster", "dgx-h100", "--no-profile")
    assert est.workload == p.workload and est.plan.workload == p.workload  # the histogram, window and seed read back
    assert est.plan.predicted.step_time_s == pytest.approx(p.predicted.step_time_s, rel=1e-9)
    show = runner.invoke(app, ["show", str(out)])
    assert show.exit_code == 0, show.output
    assert "score entries (windowed layers)" in show.stdout and "imbalance (busiest rank / mean)" in show.stdout


def test_the_python_api_estimate_keeps_the_plan_files_documents_and_window_as_the_cli_does(masked):
    """A workload that sets no documents, window or seed takes the plan file's (the CLI's flags do the same), and a
    model or workload left out is the plan's."""
    import sp_plan  # noqa: PLC0415 - the API as a user imports it

    _, out = masked
    cli = answer(EstimateResponse, "estimate", out, "--cluster", "dgx-h100", "--no-profile").plan.predicted
    for workload in ({"seq_len": 16384}, Workload(seq_len=16384), None):
        pred = sp_plan.estimate(str(out), "dgx-h100", "llama3-8b", workload, profile=False)
        assert pred.step_time_s == pytest.approx(cli.step_time_s, rel=1e-9)
    assert sp_plan.estimate(str(out), "dgx-h100", profile=False).step_time_s == pytest.approx(cli.step_time_s, rel=1e-9)
    unmasked = sp_plan.estimate(str(out), "dgx-h100", "llama3-8b", Workload(seq_len=16384, documents=None, window=None),
                                profile=False)
    assert unmasked.step_time_s != pytest.approx(cli.step_time_s, rel=1e-3)  # set to None: no mask, as asked


def test_show_heads_with_model_and_workload_and_lists_every_group_its_breakdown_names(masked):
    _, out = masked
    p = Plan.load(out)
    r = run("show", str(out))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1] == "llama3-8b, 16,384 tokens x 1, causal, training"
    table = r.stdout[r.stdout.index("groups"):r.stdout.index("breakdown of")]
    listed = {line.split("│")[1].strip() for line in table.splitlines() if line.count("│") == 4}
    named = {row.group for row in p.predicted.breakdown if row.group}
    assert named and named <= listed, (named, listed)


def test_show_prints_each_ring_rank_of_a_packed_ring_plan(tmp_path):
    p = tmp_path / "ring.yaml"
    p.write_text("algorithm: ring\ndegrees: {ring: 4}\ntoken_layout: contiguous\n"
                 "workload: {seq_len: 8192, documents: [100, 300, 5000, 2000], seed: 3}\n")
    r = run("show", str(p))
    assert r.returncode == 0, r.stderr
    rw = rank_work(Plan.load(p))
    assert rw.tokens == [2048] * 4 and sum(rw.pairs) > 0
    table = r.stdout[r.stdout.index("per-rank work (contiguous)"):]
    rows = [line.split("│")[1:4] for line in table.splitlines() if line.count("│") == 4]
    assert [[c.strip() for c in row] for row in rows] == [[str(i), "2,048", f"{x:,}"] for i, x in enumerate(rw.pairs)]
    assert f"imbalance (busiest rank / mean) {rw.imbalance:.3f}" in r.stdout and rw.imbalance > 1.05


def test_old_plan_files_load_and_show_no_rank_table(tmp_path):
    p = tmp_path / "old.yaml"
    p.write_text("algorithm: ring\ndegrees: {ring: 8}\ntoken_layout: zigzag\n"
                 "workload: {seq_len: 65536, batch: 1, causal: true, training: true}\n")
    r = run("show", str(p))
    assert r.returncode == 0 and "per-rank work" not in r.stdout, r.stderr
    assert rank_work(Plan.load(p)) is None


def test_a_window_covering_the_sequence_is_full_attention_with_a_note():
    r = run(*PLAN, "--window", "100000")
    assert r.returncode == 0, r.stderr
    assert "note: window 100000 covers the 16384-token sequence: full attention" in r.stdout


def test_answers_carry_the_workloads_notes(tmp_path):
    """--json answers (as the service and the Python API return them) say what the CLI's note says, and the plan of
    a covering window is the plan of none."""
    covered, plain = answer(PlanResponse, *PLAN, "--window", "100000"), answer(PlanResponse, *PLAN)
    assert covered.notes == ["window 100000 covers the 16384-token sequence: full attention on its layers"]
    assert plain.notes == [] and covered.winner.summary() == plain.winner.summary()
    assert covered.winner.predicted.step_time_s == plain.winner.predicted.step_time_s
    f = tmp_path / "plan.yaml"
    f.write_text("algorithm: ulysses\ndegrees: {ulysses: 8}\n")
    docs = answer(EstimateResponse, "estimate", str(f), "--cluster", "dgx-h100", "--model", "llama3-8b", "--seq-len",
                  "16k", "--documents", "megatron-dcp", "--window", "8192", "--no-profile")
    assert docs.notes[0] == "window 8192 covers every document (at most 8192 tokens): full attention on its layers"
    assert docs.notes[1:] == ([] if docs.plan.predicted.fits else [next(n for n in docs.notes if "does not fit" in n)])


@pytest.mark.parametrize("args,needle", [
    (["--documents", "no-such-distribution"], "--documents: unknown distribution 'no-such-distribution'"),
    (["--documents", "missing.txt"], "--documents: cannot read missing.txt"),
    (["--documents", "empty.txt"], "--documents: empty.txt holds no lengths"),
    (["--documents", "zero.txt"], "--documents: zero.txt line 2: length 0; lengths must be at least 1 token"),
    (["--window", "0"], "--window: must be at least 1, got 0"),
    (["--window", str(2**70)], "--window: 1,180,591,620,717,411,303,424 tokens is more than any sequence"),
    (["--window-pattern", "5:1"], "--window-pattern: a layer pattern needs a window size"),
    (["--window", "64", "--window-pattern", "5-1"], "--window-pattern: cannot read '5-1'"),
    (["--documents", "data/lengths"], "--documents: cannot read data/lengths"),  # a path, with no suffix
])
def test_bad_mask_input_exits_2_with_one_line_naming_the_flag(tmp_path, args, needle):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "zero.txt").write_text("12\n0\n")
    r = run(*PLAN, *args, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert len([line for line in r.stderr.splitlines() if line.strip()]) == 1


def test_estimate_seed_without_documents_names_the_flag(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("algorithm: ring\ndegrees: {ring: 8}\nworkload: {seq_len: 16384}\n")
    r = run("estimate", str(p), "--cluster", "dgx-h100", "--model", "llama3-8b", "--no-profile", "--seed", "3")
    assert r.returncode == 2 and r.stderr.startswith("error: --seed: seeds the packs drawn from documents"), r.stderr


def test_python_api_takes_a_name_a_path_or_a_list_like_the_cli(lengths_file, masked):
    c, m, w = load_cluster("dgx-h100", 1), load_model("llama3-8b"), Workload(seq_len=16384)
    by_file = with_masks(w, documents=str(lengths_file), window=2048, window_pattern="5:1", seed=7)
    assert by_file.documents == with_masks(w, documents=lengths_file).documents  # a str path or a Path
    assert isinstance(by_file.documents, Histogram) and by_file.documents.source == "lengths.txt"
    assert with_masks(w, documents="magi-short").documents.name == "magi-short"
    assert with_masks(w, documents=LENGTHS).documents.lengths == tuple(LENGTHS)
    r, cli_file = masked  # the same request from the command line
    assert r.returncode == 0, r.stderr
    best = api_plan(c, m, w, top_k=1, profile=False, documents=lengths_file, window=2048, window_pattern="5:1",
                    seed=7)[0]
    assert best == Plan.load(cli_file)


def test_requests_take_masks_inline_and_the_cache_key_tells_them_apart():
    base = {"cluster": "dgx-h100", "model": "llama3-8b", "workload": {"seq_len": "16k"}}
    keys = set()
    for extra in ({}, {"documents": "magi-short"}, {"documents": "magi-short", "seed": 1},
                  {"documents": [100, 2000, 700]}, {"documents": {"kind": "histogram", "edges": [1, 10, 100],
                                                                  "weights": [1, 3]}},
                  {"window": 512}, {"window": 512, "window_pattern": "5:1"}):
        req = PlanRequest.model_validate({**base, "workload": {**base["workload"], **extra}})
        keys.add(request_key(req, _inputs(req)))
    assert len(keys) == 7


def _inputs(req):
    """The resolved inputs of a request, priced without a profile."""
    return resolve(req.model_copy(update={"use_profile": False}))


def test_mask_fields_keep_what_is_not_given():
    base = Workload(seq_len=4096, documents=[10, 20], window=64, seed=2)
    assert mask_fields(base=base) == {"documents": base.documents, "window": base.window, "seed": 2}
    assert mask_fields(window=32, base=base)["window"] == {"size": 32, "pattern": None}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`sp-plan serve` on SQLite in a subprocess (tests/test_serve.py's Server)."""
    from test_serve import module_server

    yield from module_server(tmp_path_factory, "serve-masks")


def test_server_plans_masks_sent_inline_as_the_cli_does_here(server, tmp_path, lengths_file):
    import httpx

    mask = ["--documents", str(lengths_file), "--window", "1024", "--seed", "5"]
    here = answer(PlanResponse, *PLAN, *mask, "-o", tmp_path / "local.yaml").winner
    remote = run(*PLAN[:-3], "--top", "2", *mask, "--server", server.url, "-o", str(tmp_path / "remote.yaml"))
    assert remote.returncode == 0, remote.stderr
    there = Plan.load(tmp_path / "remote.yaml")
    assert there.workload == here.workload and there.workload.documents.sha256 and there.summary() == here.summary()
    assert "per-rank work" in remote.stdout  # the table a local plan prints, from the server's answer too
    est = ["estimate", tmp_path / "local.yaml", "--cluster", "dgx-h100", "--no-profile", "--window", "512"]
    est_here, est_there = answer(EstimateResponse, *est), answer(EstimateResponse, *est, "--server", server.url)
    assert est_there == est_here and est_here.workload.window.size == 512

    # one search: that the seed is part of the answer's id (the cache key) is request_key's, tested above
    body = {"cluster": "dgx-h100", "model": "llama3-8b", "use_profile": False, "top": 1,
            "workload": {"seq_len": "16k", "documents": "megatron-dcp", "window": 1024, "window_pattern": "5:1"}}
    a = httpx.post(f"{server.url}/v1/plan", json=body, timeout=120)
    assert a.status_code == 200, a.text
    w = a.json()["winner"]["workload"]
    assert w["documents"]["name"] == "megatron-dcp" and w["seed"] == 0
    assert w["window"] == {"size": 1024, "pattern": "5:1"}
    est = httpx.post(f"{server.url}/v1/estimate", json={"plan": a.json()["winner"], "cluster": "dgx-h100",
                                                       "use_profile": False,
                                                       "workload": {"seq_len": "16k", "documents": [300, 9000, 42]}})
    assert est.status_code == 200 and est.json()["workload"]["documents"]["lengths"] == [300, 9000, 42], est.text


@pytest.mark.parametrize("workload,field", [
    ({"documents": "no-such"}, "workload.documents"),
    ({"documents": "/etc/passwd"}, "workload.documents"),  # a name only: the service reads no files
    ({"documents": [100, 0]}, "workload.documents[1]"),
    ({"documents": []}, "workload.documents"),
    ({"documents": {"kind": "histogram", "edges": [5, 1], "weights": [1]}}, "workload.documents.edges"),
    ({"window": 0}, "workload.window"),
    ({"window_pattern": "5:1"}, "workload.window_pattern"),
    ({"window": 64, "window_pattern": "five"}, "workload.window_pattern"),
    ({"seed": 3}, "workload.seed"),
    ({"documents": [2**70]}, "workload.documents"),  # beyond any sequence: refused before int64 arithmetic
    ({"documents": {"kind": "lognormal", "mean": 1e308, "sigma": 5, "min": 1, "max": 2**62}}, "workload.documents"),
])
def test_service_refuses_bad_masks_with_a_4xx_naming_the_field(server, workload, field):
    import httpx

    body = {"cluster": "dgx-h100", "model": "llama3-8b", "workload": {"seq_len": "16k", **workload}}
    r = httpx.post(f"{server.url}/v1/plan", json=body, timeout=60)
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["error"]["field"] == field and r.json()["error"]["fix"], r.json()


def test_report_shows_the_plans_per_rank_work(tmp_path):
    p = tmp_path / "ring.yaml"
    p.write_text("algorithm: ring\ndegrees: {ring: 8}\ntoken_layout: zigzag\ncluster: dgx-h100\n"
                 "workload: {seq_len: 16384, documents: {kind: lognormal, mean: 1024, sigma: 1.5, min: 128, "
                 "max: 8192}}\n")
    r = run("report", str(p), "--model", "llama3-8b", "--no-profile", "--no-sensitivity", "--top", "2",
            "--window", "4096", "-o", str(tmp_path / "r.html"))
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "r.html").read_text()
    rw = rank_work(Plan.load(p).model_copy(update={"workload": with_masks(Plan.load(p).workload, window=4096)}))
    assert "<table id=rank-work>" in page and f"<b>{rw.imbalance:.3f}</b>" in page
    assert all(f"<td class=num>{x:,}</td>" in page for x in rw.pairs) and "window 4096" in page
    assert f"imbalance (busiest rank / mean) {rw.imbalance:.3f}" in r.stdout


def test_a_full_causal_mfu_above_the_peak_says_why(tmp_path):
    """A narrow window at a long sequence leaves most of full causal attention's FLOPs uncomputed: the paper's count
    then passes 100 %, and `estimate` says why beside it; a count under the peak reads as before."""
    from sp_plan.planner.plan import Prediction
    from sp_plan.planner.ranking import mfu_text

    p = Plan(algorithm="ulysses", degrees={"ulysses": 8, "dp": 8}, order=["ulysses", "dp"], model=load_model("llama3-8b"),
             workload=Workload(seq_len="1m", batch=8, window=256))
    p.save(tmp_path / "plan.yaml")
    r = run("estimate", str(tmp_path / "plan.yaml"), "--cluster", "dgx-h100", "--nodes", "8")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if "counting full causal attention" in x)
    shown = float(line.split("(")[1].split("%")[0])
    assert shown > 100 and "counting full causal attention: above the peak, as the mask skips most of those FLOPs)" in line
    below = Prediction(step_time_s=1.0, tokens_per_s=1.0, mfu=0.2, mfu_causal=0.25, peak_memory_bytes=0.0)
    assert mfu_text(below) == "MFU 20.0% (25.0% counting full causal attention)"
    assert mfu_text(below, causal=False) == "MFU 20.0% (25.0% counting full attention)"  # no causal halving counted


def test_a_bidirectional_window_reads_each_way():
    """Without causality a window of W lets a query see W - 1 keys on each side: the mask line says so."""
    r = run("plan", "--cluster", "dgx-h100", "--nodes", "2", "--model", "llama3-8b", "--seq-len", "32k", "--no-causal",
            "--window", "1024", "--no-profile")
    assert r.returncode == 0, r.stderr
    assert "mask: window 1024 each way\n" in r.stdout
    causal = run("plan", "--cluster", "dgx-h100", "--nodes", "2", "--model", "llama3-8b", "--seq-len", "32k",
                 "--window", "1024", "--no-profile")
    assert "mask: window 1024\n" in causal.stdout
