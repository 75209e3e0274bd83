"""benchmarks/bench_masks.py: its quick mode on 2 gloo ranks, the counts it reports against hand-made cases, which
candidates it times, and the tuned profile it ranks with."""
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "bench_masks.py"
LOCAL8 = ROOT / "benchmarks" / "truths" / "local8" / "local8"
CAPPED8 = ROOT / "benchmarks" / "truths" / "capped8"


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


def test_zero_kernels_stand_in_for_the_block_kernels_and_the_real_ones_come_back(bench):
    import torch

    from sp_plan.runtime import kernels
    from sp_plan.runtime.variants import ring

    real = ring.block_attention
    q = torch.randn(1, 4, 2, 8)
    bench.zero_kernels()
    try:
        out, lse = ring.block_attention(q, q, q, causal_offset=0)
        assert kernels.block_attention is ring.block_attention is not real
        assert out.shape == q.shape and lse.shape == (1, 2, 4) and not out.any()
    finally:
        bench.zero_kernels(False)
    assert ring.block_attention is real and kernels.block_attention is real
    assert ring.block_attention(q, q, q, causal_offset=0)[0].abs().sum() > 0


def _row(label, blocks, imbalance, preset, tuned=None):
    predicted = {"preset": preset} | ({} if tuned is None else {"tuned": tuned})
    return dict(candidate=label, blocks=blocks, imbalance=imbalance, predicted=predicted)


def test_key_times_the_baseline_and_each_algorithms_fewest_blocks_least_imbalance_and_priced_best(bench):
    rows = [_row("ring contiguous", 30, 2.0, 9.0, 5.0), _row("ring zigzag", 128, 1.001, 4.0, 6.0),
            _row("ring striped", 128, 1.0005, 4.1, 7.0), _row("ring balanced", 128, 1.02, 4.2, 4.5),
            _row("allgather contiguous", 30, 1.9, 8.0, 9.0), _row("allgather zigzag", 128, 1.001, 3.0, 3.0),
            _row("allgather striped", 128, 1.002, 3.5, 3.5), _row("ulysses contiguous", 500, 1.0, 2.0, 8.0)]
    pricings = [bench.Pricing("preset", None), bench.Pricing("tuned", None)]
    assert bench.chosen("key", rows, pricings) == {
        "ring contiguous", "ring striped", "ring zigzag", "ring balanced",  # baseline, least imbalanced, priced best
        "allgather contiguous", "allgather zigzag", "ulysses contiguous"}
    assert bench.chosen("none", rows, pricings) == set()
    assert bench.chosen("ring zigzag, ulysses contiguous", rows, pricings) == {"ring zigzag", "ulysses contiguous"}
    with pytest.raises(SystemExit) as e:
        bench.chosen("ring zigzag,ring sideways", rows, pricings)
    assert e.value.code == 2


def test_batch_specs_take_a_per_batch_choice_and_refuse_bad_entries(bench, capsys):
    assert bench.batch_specs("magi-short:16384,magi-short:32768:key", "all") == [
        ("magi-short", 16384, "all"), ("magi-short", 32768, "key")]
    for bad in ("magi-short", "magi-short:16k", "magi-short:0", "magi-short:1024:some"):
        with pytest.raises(SystemExit) as e:
            bench.batch_specs(bad, "all")
        assert e.value.code == 2
        assert "--batches" in capsys.readouterr().err


def test_the_kept_tuned_profile_prices_on_its_own_cluster_and_a_mismatch_exits_2(bench, capsys):
    profile = str(LOCAL8 / "profile.yaml.gz")
    tuned = bench.tuned_pricing(profile, None, 8)  # gzipped, its cluster.yaml beside it
    assert tuned.profile.params.solo_speedup > 1  # a profile that knows the ranks share cores, not the defaults
    work = bench.workload("megatron-dcp", 2048, 0)
    c = bench.Candidate("ring", 1, 8, "zigzag")
    preset = bench.Pricing("preset", bench.preset_cluster(8))
    assert bench.predicted(c, work, 16, tuned) != pytest.approx(bench.predicted(c, work, 16, preset), rel=0.05)
    with pytest.raises(SystemExit) as e:
        bench.tuned_pricing(profile, None, 4)  # tuned on 8 ranks
    assert e.value.code == 2 and "8 ranks" in capsys.readouterr().err
    cpu_local = str(ROOT / "profiles" / "clusters" / "cpu-local.yaml")
    with pytest.raises(SystemExit) as e:
        bench.tuned_pricing(profile, cpu_local, 4)  # not the topology it was tuned on: not applied
    assert e.value.code == 2 and "not applied" in capsys.readouterr().err


def test_quick_mode_runs_and_counts(bench, capsys):
    rows = bench.main(["--quick", "--world", "2", "--candidates", "key"])
    out = capsys.readouterr().out
    assert {r["batch"] for r in rows} == {"megatron-dcp:2048", "single:512"}
    packed = [r for r in rows if r["batch"] != "single:512"]
    assert {r["candidate"] for r in packed} == {c.label for c in bench.candidates(2)}
    for r in packed:  # counted on zero kernels, every candidate
        assert 0 < r["blocks"] <= r["tiles"] and r["imbalance"] >= 1.0
        assert r["bytes"] >= r["bound"] > 0, r["candidate"]  # no layout moves less than its queries need
        assert r["predicted"]["cpu-local (uncalibrated)"] > 0
    timed = {r["candidate"] for r in packed if "median_s" in r}
    pick = min(packed, key=lambda r: r["predicted"]["cpu-local (uncalibrated)"])["candidate"]
    assert {"ring contiguous", pick} <= timed < {r["candidate"] for r in packed}
    # the timed world counted the same blocks and bytes as the zero-kernel one (main raises otherwise)
    assert all(r["median_s"] > 0 and r["cpu_s"] > 0 for r in packed if "median_s" in r)
    for r in (r for r in packed if "median_s" in r):  # the busiest rank's CPU lies between the mean rank's and all
        assert r["cpu_s"] / 2 <= r["busiest_cpu_s"] <= r["cpu_s"], r["candidate"]
        assert 1.0 <= r["cpu_max_mean"] <= 2.0 and len(r["rank_cpu_s"][0]) == 2
    single = [r for r in rows if r["batch"] == "single:512"]
    assert all("median_s" in r for r in single)
    for none, one in zip(single[::2], single[1::2]):
        assert (none["blocks"], none["bytes"]) == (one["blocks"], one["bytes"]), one["candidate"]
    assert "Spearman" in out and "top-1 regret" in out and "one document against none" in out
    assert "busiest rank's cpu s: " in out and "contiguous ring" in out.split("busiest rank's cpu s: ")[1]
    assert "on the busiest rank's cpu s: cpu-local (uncalibrated)'s pick " in out


def test_cpu_figures_are_medians_of_the_sum_the_busiest_rank_and_its_share(bench):
    # three repeats of two ranks: sums 4, 4, 6; busiest 3, 2, 5; busiest over mean 1.5, 1.0, 5/3
    got = bench.cpu_figures([[1.0, 3.0], [2.0, 2.0], [1.0, 5.0]])
    assert (got["cpu_s"], got["busiest_cpu_s"]) == (4.0, 3.0)
    assert got["cpu_max_mean"] == pytest.approx(1.5)


def test_the_busiest_line_sets_the_least_busiest_candidate_against_the_contiguous_ring(bench):
    ring = dict(candidate="ring contiguous", imbalance=2.5, cpu_max_mean=1.8, busiest_cpu_s=3.0)
    zigzag = dict(candidate="ring zigzag", imbalance=1.001, cpu_max_mean=1.02, busiest_cpu_s=2.0)
    line = bench.busiest_line([ring, zigzag], ring)
    assert line.startswith("busiest rank's cpu s: ring zigzag (imbalance 1.001, cpu max/mean 1.020) 2.00 s")
    assert "contiguous ring 3.00 s: 1.50x" in line
    assert bench.busiest_line([zigzag], None).endswith("contiguous ring not timed")


def test_a_pricing_is_judged_on_the_busiest_rank_as_on_the_wall_time(bench):
    """``ranking`` over ``busiest_cpu_s``: the pick's regret against the least busiest rank, not the fastest wall."""
    rows = [dict(candidate="a", predicted={"p": 1.0}, median_s=2.0, busiest_cpu_s=1.0),
            dict(candidate="b", predicted={"p": 2.0}, median_s=1.0, busiest_cpu_s=0.8),
            dict(candidate="c", predicted={"p": 3.0}, median_s=1.5, busiest_cpu_s=1.6)]
    rho, regret, pick = bench.ranking(rows, "p", "busiest_cpu_s")
    assert pick == "a" and regret == pytest.approx(0.25) and rho == pytest.approx(0.5)
    assert bench.ranking(rows, "p")[1] == pytest.approx(1.0)  # on the wall: a's 2.0 s against b's 1.0 s


@pytest.mark.parametrize("share", ["1.5", "0", "0.1"])
def test_a_rank_cpu_that_is_no_share_of_a_core_exits_2_with_one_line(bench, share, capsys):
    with pytest.raises(SystemExit) as e:
        bench.parse_args(["--rank-cpu", share])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("error: --rank-cpu: ")


@pytest.mark.parametrize("name", ["profile.yaml.gz", "profile-1k.yaml.gz"])
def test_the_capped_profiles_price_on_the_cluster_discovered_under_the_same_caps(bench, name):
    """Profiles tuned on ranks capped at a quarter of a core: each applies to the cluster file beside it and prices
    otherwise than the preset (the page ranks with them)."""
    tuned = bench.tuned_pricing(str(CAPPED8 / name), None, 8)
    work = bench.workload("magi-short", 2048, 0)
    c = bench.Candidate("ulysses", 8, 1, "contiguous")
    preset = bench.Pricing("preset", bench.preset_cluster(8))
    assert bench.predicted(c, work, 16, tuned) != pytest.approx(bench.predicted(c, work, 16, preset), rel=0.05)
