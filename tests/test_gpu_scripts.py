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


def test_bench_overlap_balances_the_copy_and_prints_its_verdict():
    out = _run("benchmarks/bench_overlap.py", "--seq", "64", *TOY, "--repeats", "1", "--rounds", "3")
    assert "overlapped / max(compute, transfer)" in out
