"""Ranks sharing cores: uneven attention rounds cost their ranks' mean work (Params.solo_speedup, Compute.balance)."""
import numpy as np
import pytest

from sp_plan.planner import Plan, Workload
from sp_plan.planner.calibration import measured_params, solo_speedup
from sp_plan.planner.candidate import Candidate
from sp_plan.planner.estimate import Estimator, shared_cores
from sp_plan.planner.layout import causal_work, ring_balance, round_balance
from sp_plan.planner.params import Params
from sp_plan.planner.profile import KernelSample
from sp_plan.planner.schedules import attention_steps
from sp_plan.profiles import load_cluster, load_model

WORK = Workload(seq_len=1024, batch=1, causal=True, training=True)


def test_round_balance_of_a_contiguous_ring_by_hand():
    # round i: rank r holds rank r - i's K, V; ranks r >= i compute a whole earlier block, the others nothing
    assert round_balance("contiguous", 4, 1024, True) == (1.0, 0.75, 0.5, 0.25)
    # TokenRing: rank r holds rank r - i's Q against its own K, V: i ranks compute
    assert round_balance("contiguous", 4, 1024, True, q_travels=True) == (1.0, 0.25, 0.5, 0.75)
    assert round_balance("zigzag", 8, 1024, True) == (1.0,) * 8
    assert round_balance("contiguous", 8, 1024, False) == (1.0,) * 8


@pytest.mark.parametrize("layout", ["contiguous", "striped", "zigzag"])
@pytest.mark.parametrize("q_travels", [False, True])
def test_round_balance_closed_form_past_64_ranks_matches_the_blocks(layout, q_travels):
    P, S = 128, 128 * 64
    w, r = causal_work(layout, P, S), np.arange(P)
    want = []
    for i in range(P):
        x = w[(r - i) % P, r] if q_travels else w[r, (r - i) % P]
        want.append(x.mean() / x.max())
    assert np.allclose(round_balance(layout, P, S, True, q_travels), want, rtol=1e-12, atol=0)


def test_ring_balance_pools_the_rounds_by_hand():
    # contiguous, 4 ranks of c = 256 tokens: the busiest computes a diagonal d = (c + 1) / 2c, then 3 whole blocks;
    # the ranks' mean per round: d, 3/4, 1/2, 1/4 of a block; pooled: (d + 1.5) / (d + 3), the same every round
    d = 257 / 512
    assert ring_balance("contiguous", 4, 1024, True) == pytest.approx(((d + 1.5) / (d + 3),) * 4, rel=1e-12)
    assert ring_balance("contiguous", 4, 1024, True, q_travels=True) == pytest.approx(((d + 1.5) / (d + 3),) * 4)
    assert ring_balance("zigzag", 8, 1024, True) == (1.0,) * 8  # even rounds stay even
    assert ring_balance("contiguous", 8, 1024, False) == (1.0,) * 8


def test_shared_cores_by_hand():
    # s = 2: a round lasts max(mean / max, 1/2) of the busiest rank's time among busy peers
    assert shared_cores((0.75, 0.5, 0.25), 2.0) == pytest.approx((0.75 + 0.5 + 0.5) / 3)
    assert shared_cores((0.75, 0.5, 0.25), 1.0) == 1.0  # no sharing: the busiest rank sets the round


def test_contiguous_ring_is_priced_by_its_mean_work_where_ranks_share_cores():
    cl, m = load_cluster("cpu-local"), load_model("tiny-llama")
    steps = {}
    for s in (1.0, 1.5, 2.0, 64.0):
        est = Estimator(cl, m, WORK, params=Params(solo_speedup=s, round_overhead_s=1e-3))
        for alg in ("ring", "tokenring"):
            for lay in ("contiguous", "zigzag"):
                steps[s, alg, lay] = est(Plan(algorithm=alg, degrees={"ring": 4}, token_layout=lay)).step_time_s
    for alg in ("ring", "tokenring"):
        # zigzag's rounds are even: no change; contiguous gets cheaper with s until the ranks' mean work (pooled
        # 0.571 of the busiest's) binds, above 1/s = 0.5 at s = 2; never below zigzag's
        assert steps[1.0, alg, "zigzag"] == steps[2.0, alg, "zigzag"] == steps[64.0, alg, "zigzag"]
        assert steps[1.0, alg, "contiguous"] > steps[1.5, alg, "contiguous"] > steps[2.0, alg, "contiguous"]
        assert steps[2.0, alg, "contiguous"] == steps[64.0, alg, "contiguous"]
        # its blocks' work is never below zigzag's
        no_calls = {lay: Estimator(cl, m, WORK, params=Params(solo_speedup=64.0))(
            Plan(algorithm=alg, degrees={"ring": 4}, token_layout=lay)).step_time_s for lay in ("contiguous", "zigzag")}
        assert no_calls["contiguous"] >= no_calls["zigzag"] * 0.999
    # with a per-call overhead: a Ring round's fixed cost is paid by every rank (K, V reach all of them), so
    # contiguous costs what zigzag does; TokenRing's idle ranks get no Q either, so contiguous costs less
    assert steps[64.0, "ring", "contiguous"] == pytest.approx(steps[64.0, "ring", "zigzag"], rel=1e-3)
    assert steps[64.0, "tokenring", "contiguous"] < 0.99 * steps[64.0, "tokenring", "zigzag"]
    # the pooled balance rides on every attention phase of the ring; the kernels share it, the calls do not
    est = Estimator(cl, m, WORK, params=Params(solo_speedup=2.0, round_overhead_s=1e-3))
    c = est.shape(Candidate.from_plan(Plan(algorithm="ring", degrees={"ring": 4})))
    att = [p for st in attention_steps(c, False) for p in st.phases if getattr(p, "kind", "") == "attention"]
    d = 257 / 512
    assert len(att) == 3 and [b for p in att for b in p.balance] == pytest.approx([(d + 1.5) / (d + 3)] * 4)
    for p in att:
        kernel = Estimator(cl, m, WORK, params=Params()).compute_time(p)
        assert est.compute_time(p) == pytest.approx(kernel * (d + 1.5) / (d + 3) + 1e-3 * p.calls)
        assert est.calls(p) == p.calls


def _sample(seconds, alone, kind="attention_fwd", size=256):
    return KernelSample(kind=kind, size=size, heads=4, head_dim=16, causal=True, flops=4.0 * size * size * 4 * 16 / 2,
                        seconds=seconds, alone=alone)


def test_solo_speedup_from_kernel_timings():
    together = [_sample(t, False) for t in (2.0e-3, 2.1e-3, 1.9e-3, 2.0e-3)]
    alone = [_sample(t, True) for t in (1.0e-3, 1.1e-3, 0.9e-3, 1.0e-3)]
    assert solo_speedup(together + alone) == pytest.approx(2.0)
    assert solo_speedup(together) is None  # nothing timed alone
    assert solo_speedup(together + [_sample(3.0e-3, True)]) == 1.0  # slower alone: noise, never below 1
    # the kernel step's sweep (alone None: ranks not in step) is the reference only without synced timings
    sweep = [_sample(t, None) for t in (1.2e-3, 1.2e-3)]
    assert solo_speedup(sweep + alone) == pytest.approx(1.2)
    assert solo_speedup(sweep + together + alone) == pytest.approx(2.0)
    # the curves come from the kernels timed together only; the speedup lands in Params
    cl = load_cluster("cpu-local")
    p = measured_params(cl, "fp32", together + alone)
    assert p.solo_speedup == pytest.approx(2.0)
    eff = together[0].flops / (2.0e-3 * cl.device(0).peak_flops["fp32"])
    assert p.attention_fwd.points == ((256.0, pytest.approx(eff)),)


# ---------------------------------------------------------------- blocks under a causal mask

def test_ring_rounds_say_which_blocks_run_under_the_causal_mask():
    cl, m = load_cluster("cpu-local"), load_model("tiny-llama")
    est = Estimator(cl, m, WORK)

    def masked(alg, layout):
        c = est.shape(Candidate.from_plan(Plan(algorithm=alg, degrees={"ring": 4}, token_layout=layout)))
        return [(p.masked, p.fill) for st in attention_steps(c, False) for p in st.phases
                if getattr(p, "kind", "") == "attention"]

    # the diagonal round is masked; zigzag's and contiguous' other rounds are dense, striped's all shifted diagonals
    for alg in ("ring", "tokenring"):
        assert masked(alg, "contiguous")[0][0] and not any(m for m, _ in masked(alg, "contiguous")[1:])
        assert masked(alg, "zigzag")[0][0] and not any(m for m, _ in masked(alg, "zigzag")[1:])
        assert all(m for m, _ in masked(alg, "striped"))
    nc = Estimator(cl, m, Workload(seq_len=1024, causal=False))
    c = nc.shape(Candidate.from_plan(Plan(algorithm="ring", degrees={"ring": 4})))
    assert not any(p.masked for st in attention_steps(c, False) for p in st.phases if hasattr(p, "masked"))


def test_masked_blocks_read_their_own_curve():
    from sp_plan.planner.params import Curve
    cl, m = load_cluster("cpu-local"), load_model("tiny-llama")
    dense = Curve(points=((128.0, 0.4), (256.0, 0.4)))
    slow = Curve(points=((128.0, 0.1), (256.0, 0.1)))
    base = Params(attention_fwd=dense, attention_bwd=dense)
    split = base.model_copy(update={"attention_fwd_masked": slow, "attention_bwd_masked": slow})
    t = {}
    for name, p in (("base", base), ("split", split)):
        est = Estimator(cl, m, WORK, params=p)
        assert est.attention_efficiency(False, 256, 0.5, masked=True) == (0.1 if name == "split" else 0.4)
        for lay in ("zigzag", "striped"):
            t[name, lay] = est(Plan(algorithm="ring", degrees={"ring": 4}, token_layout=lay)).step_time_s
    # masked blocks at a quarter of the dense efficiency: striped (every round masked) slows more than zigzag
    assert t["split", "striped"] / t["base", "striped"] > t["split", "zigzag"] / t["base", "zigzag"] > 1.0


def test_kernel_curves_split_dense_and_masked_timings():
    from sp_plan.planner.calibration import kernel_curves
    peak = 1e12

    def s(causal, seconds, kind="attention_fwd"):
        f = 4.0 * 256 * 256 * 4 * 16 * (0.5 if causal else 1.0)
        return KernelSample(kind=kind, size=256, heads=4, head_dim=16, causal=causal, flops=f, seconds=seconds)
    curves = kernel_curves([s(True, 1e-3), s(False, 1e-3)], peak)
    assert set(curves) == {"attention_fwd", "attention_fwd_masked"}
    assert curves["attention_fwd_masked"].points[0][1] == pytest.approx(curves["attention_fwd"].points[0][1] / 2)
    assert set(kernel_curves([s(True, 1e-3)], peak)) == {"attention_fwd"}  # causal only (older profiles): as before


# ---- timing ranks together in one shared window
class _Clock:
    """Wall and interval time that only sleeps and calls move, so the window's arithmetic reads the same on any
    host (a real 0.1 s window breaks on one scheduler stall)."""

    def __init__(self, now: float):
        self.now = now

    def time(self) -> float:
        return self.now

    perf_counter = time

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_time_window_runs_from_start_until_stop_and_averages(monkeypatch):
    import torch

    from sp_plan.profiles.tune import timing

    clock = _Clock(1000.0)
    monkeypatch.setattr(timing, "time", clock)
    calls = []
    start = clock.now + 0.5  # binary fractions of a second: the clock's sums are exact
    per = timing.time_window(lambda: (calls.append(clock.now), clock.sleep(0.25)), torch.device("cpu"), start,
                             start + 2.0)
    assert calls[0] >= start  # waited for the window
    assert calls[-1] < start + 2.0 <= clock.now  # the last call began inside it and ran past its end
    assert len(calls) == 8 and per == 0.25  # eight calls of 0.25 s fill the 2 s window


def _alone_and_together(rank, world):
    import dataclasses

    from sp_plan.planner import ModelSpec
    from sp_plan.profiles.tune import run, settings

    m = ModelSpec(name="t", layers=2, hidden=64, heads=4, kv_heads=4, head_dim=16, vocab=0)
    quick = dataclasses.replace(settings.SETTINGS, together_min_s=0.05)
    got = run.measure_alone(m, 64, 4, __import__("torch").device("cpu"), __import__("torch").float32, True, 3,
                            settings=quick)
    return [(s.alone, s.causal, s.kind) for s in got]


def test_measure_alone_times_each_rank_alone_then_all_together():
    from harness.worlds import run_world

    for got in run_world(_alone_and_together, 2, timeout=60):
        assert sorted(got) == [(False, False, "attention_fwd"), (False, True, "attention_fwd"),
                               (True, False, "attention_fwd"), (True, True, "attention_fwd")]


def _agreed_windows(rank, world):
    from sp_plan.profiles.tune.kernels import shared_windows

    # rank 1's first calls are the slower of the second kernel, rank 0's of the first
    firsts = [0.02, 0.001] if rank == 0 else [0.001, 0.03]
    return shared_windows(firsts, calls=4, least=0.01)


def test_shared_windows_agree_one_start_and_the_slowest_ranks_lengths():
    from harness.worlds import run_world

    (s0, l0), (s1, l1) = run_world(_agreed_windows, 2, timeout=60)
    assert s0 == s1  # rank 0's clock: one start for every rank
    assert l0 == l1 == pytest.approx([0.08, 0.12])


# ---- a round's fixed cost follows its messages (Compute.trimmed)
def test_round_overhead_follows_the_work_only_where_messages_are_trimmed():
    from sp_plan.planner import Estimator, ModelSpec, Workload
    from sp_plan.planner.params import Params
    from sp_plan.planner.schedules import Compute
    from sp_plan.profiles import load_cluster

    m = ModelSpec(name="t", layers=2, hidden=64, heads=4, kv_heads=4, head_dim=16, vocab=0)
    est = Estimator(load_cluster("cpu-local"), m, Workload(seq_len=256),
                    params=Params(solo_speedup=4.0, round_overhead_s=1e-3))
    ring = Compute("attention fwd", 0.0, "attention", 64.0, balance=(0.5, 1.0), calls=2)
    token = ring._replace(trimmed=True)
    # share = mean(max(0.5, 1/4), max(1, 1/4)) = 0.75: TokenRing's calls follow it, Ring's are all paid
    assert est.calls(token) == pytest.approx(1.5) and est.calls(ring) == 2
    assert est.compute_time(token) == pytest.approx(1.5e-3) and est.compute_time(ring) == pytest.approx(2e-3)
    flops = ring._replace(flops=1e9)
    base = Estimator(load_cluster("cpu-local"), m, Workload(seq_len=256), params=Params(solo_speedup=4.0)).compute_time(flops)
    assert est.compute_time(flops) == pytest.approx(base + 2e-3)  # the kernel's time shared, the round's paid in full


def test_tokenring_marks_its_attention_trimmed_and_ring_does_not():
    from sp_plan.planner import ModelSpec, Workload
    from sp_plan.planner.algorithms import ALGORITHMS
    from sp_plan.planner.schedules import Compute, Shape

    m = ModelSpec(name="t", layers=2, hidden=64, heads=4, kv_heads=4, head_dim=16, vocab=0)
    w = Workload(seq_len=256)
    for algo, want in (("tokenring", True), ("ring", False)):
        c = Shape(m, w, 1, 1, 4, "contiguous", 1, 1, 1, algo, 1, None)
        att = [p for st in ALGORITHMS[algo].steps(c, False) for p in st.phases
               if isinstance(p, Compute) and p.kind == "attention"]
        assert att and all(p.trimmed is want for p in att), algo
