"""benchmarks/bench_masks.py: its quick mode on 2 gloo ranks, and the counts it reports against hand-made cases."""
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_masks.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_masks", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses resolve their annotations there
    spec.loader.exec_module(mod)
    return mod


def test_needed_keys_are_the_seen_keys_a_rank_does_not_hold(bench):
    cu = (0, 4, 10)
    # queries 5 and 6 see keys 4..6 of their document; 2 sees 0..2 of its own
    assert bench.needed_keys(np.array([2, 5, 6]), cu, 10) == 3  # 0, 1, 4
    assert bench.needed_keys(np.arange(10), cu, 10) == 0


def test_imbalance_of_a_contiguous_ring_and_ulysses(bench):
    S, cu = 64, (0, 64)
    ring = bench.Candidate("ring", 1, 2, "contiguous")
    # first ring round: both diagonals (528 entries each); second: rank 1 sees all of rank 0's keys (1024), rank 0 none
    assert bench.imbalance(ring, S, cu) == pytest.approx((528 + 1024) / (528 + 1024 / 2), rel=1e-12)
    assert bench.imbalance(bench.Candidate("ulysses", 2, 1, "contiguous"), S, cu) == 1.0


def test_quick_mode_runs_and_counts(bench, capsys):
    rows = bench.main(["--quick", "--world", "2"])
    out = capsys.readouterr().out
    batches = {r["batch"] for r in rows}
    assert batches == {"megatron-dcp:2048", "single:512"}
    packed = [r for r in rows if r["batch"] != "single:512"]
    assert {r["candidate"] for r in packed} == {c.label for c in bench.candidates(2)}
    for r in packed:
        assert r["median_s"] > 0 and r["blocks"] > 0 and r["imbalance"] >= 1.0
        assert r["bytes"] >= r["bound"] > 0, r["candidate"]  # no layout moves less than its queries need
        assert r["predicted_s"] > 0
    single = [r for r in rows if r["batch"] == "single:512"]
    for none, one in zip(single[::2], single[1::2]):
        assert (none["blocks"], none["bytes"]) == (one["blocks"], one["bytes"]), one["candidate"]
    assert "Spearman" in out and "top-1 regret" in out and "one document against none" in out
