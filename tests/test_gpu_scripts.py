"""The GPU run's scripts at toy sizes on the CPU: what they check and print is logic, and a broken script costs a
GPU session its device time (benchmarks/gpu/run.sh runs them there)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
TOY = ["--heads", "4", "--kv-heads", "2", "--head-dim", "16"]


def _run(relpath: str, *args: str, timeout: float = 240) -> str:
    res = subprocess.run([sys.executable, str(ROOT / relpath), *args], capture_output=True, text=True,
                         timeout=timeout, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return res.stdout


def test_exactness_script_checks_every_backend_case_and_world1_algorithm(tmp_path):
    out = _run("benchmarks/gpu/exactness.py", "--n", "48", *TOY, "--json", str(tmp_path / "e.json"))
    for case in ("full", "causal", "gqa causal", "offset +n/4", "offset -n/4", "document mask", "window n/8"):
        assert f" {case} " in out
    for alg in ("ring", "ulysses", "usp", "wallfacer", "tokenring", "tokenring_ring", "allgather"):
        assert f"world 1 {alg} " in out
    assert "every check met its target" in out


def test_bench_gpu_prints_the_ratio_against_sdpa_and_world1(tmp_path):
    out = _run("benchmarks/bench_gpu.py", "--seqs", "64", *TOY, "--repeats", "1", "--max-math-seq", "64",
               "--json", str(tmp_path / "b.json"))
    assert "best / sdpa" in out and "ctx.attention" in out and "attention_fwd" in out
    import json

    (row,) = json.loads((tmp_path / "b.json").read_text())["world1"]  # the readings that tell where a ratio lies
    assert {"ours", "sdpa", "ours_run", "sdpa_run", "sdpa_bshd", "sdpa_held", "host_ours", "host_sdpa"} <= set(row)
    assert row["backend"] and all(row[k] > 0 for k in ("ours", "sdpa", "ours_run", "sdpa_bshd", "host_ours"))


def test_host_costs_times_the_four_calls():
    out = _run("benchmarks/gpu/host_costs.py", "--calls", "20", "--rounds", "1")
    for name in ("ctx.attention", "local_attention", "sdpa, transposes in the call", "sdpa "):
        assert name in out
    assert out.count(" us a call") == 4


def test_refit_reprices_a_kept_tune_under_todays_fit(tmp_path):
    """The kept world-1 tune (one candidate, no ring): today's fit sets the compute efficiency, and both the stored
    and the refitted profile price the two checked workloads."""
    import shutil

    kept = shutil.copytree(ROOT / "benchmarks" / "gpu" / "results" / "refit-7fc5b5b", tmp_path / "kept")
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu/refit.py"), "--store", "sqlite:///store.db",
                          "--cluster", "cluster.yaml", "--plan", "tuned.yaml", "--checks", "tune_check.json"],
                         capture_output=True, text=True, timeout=240, cwd=kept)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "round overhead 20.92 ms per attention call" in res.stdout  # what the store holds
    assert "refit:      compute efficiency in a step" in res.stdout
    assert res.stdout.count(" tokens: measured ") == 2 and res.stdout.count("; refit ") == 2


def test_bench_overlap_balances_the_copy_and_prints_its_verdict():
    out = _run("benchmarks/bench_overlap.py", "--seq", "64", *TOY, "--repeats", "1", "--rounds", "3")
    assert "overlapped / max(compute, transfer)" in out
