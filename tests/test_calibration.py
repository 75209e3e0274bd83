"""Calibration: the engine reads Params, and fit() recovers physical parameters from measurements."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sp_plan.pipeline import estimate, plan
from sp_plan.planner import Candidate, Estimator, ModelSpec, PlanError, Workload
from sp_plan.planner import plan as pure_plan
from sp_plan.planner.calibration import comm_fits, fit, kernel_curves, measured_params
from sp_plan.planner.engine import GroupShape, LinkEngine
from sp_plan.planner.params import CommFit, Curve, Params
from sp_plan.planner.profile import KernelSample, MeasuredCandidate, Profile
from sp_plan.planner.schedules import Comm, Compute, Step
from sp_plan.planner.search import grid_search
from sp_plan.profiles import load_cluster, load_model
from sp_plan.profiles.resolve import resolve_params

FIX = Path(__file__).parent / "fixtures" / "calibration"
GIB = 2.0 ** 30
TRUTH = Params(overlap=0.6, round_overhead_s=2e-3, compute_efficiency=0.8, activation_factor=1.3,
               memory_overhead_bytes=GIB)


# ---- Params() is the uncalibrated engine, bit for bit
def test_neutral_params_give_bit_identical_predictions_to_the_uncalibrated_engine():
    """Every candidate of three small grids (time, memory, full predictions) equals the snapshot taken
    from the engine before it read Params (tests/fixtures/calibration/snapshot.py, run on main)."""
    sys.path.insert(0, str(FIX))
    try:
        from snapshot import snapshot
    finally:
        sys.path.remove(str(FIX))
    golden = json.loads((FIX / "params_identity.json").read_text())
    now = json.loads(json.dumps(snapshot()))
    assert now.keys() == golden.keys()
    for case in golden:  # every candidate of the snapshot, bit for bit; the search may price new ones beside them
        rows = {r[0]: r for r in now[case]}
        assert len(golden[case]) > 10 and len(rows) >= len(golden[case]), case
        for b in golden[case]:
            assert rows.get(b[0]) == b, (case, b[0])


# ---- kernel curves
def test_kernel_curves_reproduce_the_efficiencies_median_over_repeats_and_heads():
    peak = 1e12
    eff = {"attention_fwd": {512: 0.3, 2048: 0.55, 8192: 0.62},
           "attention_bwd": {512: 0.2, 2048: 0.4, 8192: 1.4},  # > 1 kept (CPU presets have placeholder peaks)
           "matmul": {1024: 0.5, 16384: 0.75}}
    samples = []
    for kind, pts in eff.items():
        for size, e in pts.items():
            for heads, noise in ((8, 1.0), (16, 1.02), (32, 0.5)):  # median over heads and repeats: the middle one
                flops = 4.0 * size * size * heads * 64 if kind != "matmul" else 2.0 * size * 4096 * 4096
                samples.append(KernelSample(kind, size, heads, 64, False, flops, flops / (peak * e * noise)))
    samples.append(KernelSample("matmul", 1024, 1, 1, False, 1.0, 0.0))  # a failed timing is ignored
    curves = kernel_curves(samples[::-1], peak)
    assert set(curves) == set(eff)
    for kind, pts in eff.items():
        assert [x for x, _ in curves[kind].points] == sorted(pts)
        for size, e in pts.items():
            assert curves[kind].at(size) == pytest.approx(e, rel=1e-12)
    assert curves["attention_bwd"].at(8192) > 1
    with pytest.raises(PlanError):
        kernel_curves(samples, 0.0)


# ---- the engine with Params, by hand
def _tiny():
    cl = load_cluster("cpu-local", 1)  # 4 CPU ranks on a host switch: shm 5 GB/s each way, 20 us per hop
    m = ModelSpec(name="t", layers=2, hidden=256, heads=4, ffn_hidden=512, vocab=1000, dtype="fp32")
    return cl, m, Workload(seq_len=4096, batch=1)


def test_one_ring_step_matches_a_hand_computation():
    cl, m, w = _tiny()
    F, block, nbytes, k = 3e9, 1024.0, 8e6, 3
    steps = [Step((Compute("attention fwd", F, "attention", block), Comm("ring p2p fwd", "shift", ("ring",), nbytes)),
                  k, overlap=True)]
    degrees = {"dp": 1, "pp": 1, "tp": 1, "ulysses": 1, "ring": 4, "team": 1}
    peak = 5e10  # cpu-local fp32
    # uncalibrated: saturating curve 0.5 x b / (b + 64); link: the rank's shm hop, 2 hops of 20 us
    c0 = F / (peak * 0.5 * block / (block + 64))
    m0 = nbytes / 5e9 + 2 * 20e-6
    est0 = Estimator(cl, m, w)
    assert est0.price(steps, est0.orders(degrees, [("ring",)])).seconds[0] == pytest.approx(k * max(c0, m0), rel=1e-12)
    p = Params(attention_fwd=Curve(points=((512, 0.2), (2048, 0.4))), overlap=0.25, round_overhead_s=1e-3,
               comm={"p2p/intra": CommFit(alpha_s=5e-5, efficiency=0.5)})
    c1 = F / (peak * 0.3) + 1e-3  # log-linear: 1024 is halfway between 512 and 2048
    m1 = nbytes / 5e9 / 0.5 + 2 * 20e-6 + 5e-5
    est1 = Estimator(cl, m, w, params=p)
    got = est1.price(steps, est1.orders(degrees, [("ring",)])).seconds[0]
    assert got == pytest.approx(k * (max(c1, m1) + 0.75 * min(c1, m1)), rel=1e-12)
    # a backward block reads the backward curve (unset here: the device curve)
    bwd = Compute("attention bwd", F, "attention", block)
    assert est1.compute_time(bwd) == pytest.approx(c0 + 1e-3, rel=1e-12)
    # GEMMs read the matmul curve at their rows
    gemm = Compute("linear fwd", 1e9, rows=2048)
    assert Estimator(cl, m, w, params=Params(matmul=Curve(points=((1024, 0.2), (4096, 0.6))))).compute_time(gemm) \
        == pytest.approx(1e9 / (peak * 0.4), rel=1e-12)


def test_params_move_predictions_the_expected_way():
    cl, m, w = load_cluster("dgx-h100", 1), load_model("gpt-3b"), Workload(seq_len=32768, batch=2)
    ring = Candidate("ring", ring=8, order=("ring",), token_layout="zigzag")
    uly = Candidate("ulysses", ulysses=8, order=("ulysses",))
    base = Estimator(cl, m, w)

    def t(params, cand):
        return Estimator(cl, m, w, params=params).evaluate(cand).step_time_s

    for cand in (ring, uly):
        assert t(Params(round_overhead_s=1e-3), cand) > base.evaluate(cand).step_time_s
        assert t(Params(attention_fwd=Curve(points=((1, 0.1),)), attention_bwd=Curve(points=((1, 0.1),))), cand) \
            > base.evaluate(cand).step_time_s
    assert t(Params(overlap=0.0), ring) > base.evaluate(ring).step_time_s
    assert t(Params(overlap=0.0), uly) == base.evaluate(uly).step_time_s  # no double-buffered round
    slow_a2a = Params(comm={"all_to_all/intra": CommFit(efficiency=0.5)})
    rows = {r.name: r.seconds for r in Estimator(cl, m, w, params=slow_a2a).predict(uly).breakdown}
    rows0 = {r.name: r.seconds for r in base.predict(uly).breakdown}
    lat = LinkEngine(cl).cost("all_to_all", GroupShape(((8, 1),), 8)).latency
    n_calls = m.layers * 2  # one forward all-to-all of q,k,v per layer and micro-batch (batch 2, dp 1)
    assert rows["ulysses a2a q,k,v"] - n_calls * lat == pytest.approx(2 * (rows0["ulysses a2a q,k,v"] - n_calls * lat))
    # inter-node fits do not touch an intra-node phase
    assert t(Params(comm={"all_to_all/inter": CommFit(efficiency=0.1)}), uly) == base.evaluate(uly).step_time_s


def test_memory_params_scale_activations_add_an_overhead_row_and_agree_with_fitting():
    cl, m, w = load_cluster("dgx-h100", 1), load_model("gpt-3b"), Workload(seq_len=32768, batch=2)
    cand = Candidate("ring", ring=8, order=("ring",), token_layout="zigzag", checkpointing="full")
    m0 = Estimator(cl, m, w).memory(cand)
    est = Estimator(cl, m, w, params=Params(activation_factor=1.5, memory_overhead_bytes=3 * GIB))
    m1 = est.memory(cand)
    assert m1["framework overhead"] == 3 * GIB and "framework overhead" not in m0
    assert m1["activations"] == pytest.approx(1.5 * m0["activations"]) and m1["weights"] == m0["weights"]
    assert sum(m1.values()) > sum(m0.values())
    pols = [(z, ck, 1) for z in (0, 1, 2, 3) for ck in ("none", "attention_boundary", "full")]
    for params in (Params(), Params(activation_factor=1.5, memory_overhead_bytes=3 * GIB),
                   Params(memory_overhead_bytes=40 * GIB)):
        e = Estimator(cl, m, w, params=params)
        fit_ = e.fitting(cand, pols)
        direct = [p for p in pols if e.fits(cand.with_memory(*p))]
        assert fit_ == direct
    assert len(Estimator(cl, m, w, params=Params(memory_overhead_bytes=40 * GIB)).fitting(cand, pols)) < \
        len(Estimator(cl, m, w).fitting(cand, pols))


# ---- fitting
def _measured(cl, m, w, params, cands, time_noise=None):
    """"Measurements": the engine's predictions under known params (the synthetic truth)."""
    est = Estimator(cl, m, w, params=params)
    out = []
    for i, c in enumerate(cands):
        ev = est.evaluate(c)
        p = c.to_plan(model=m, workload=w)
        t = ev.step_time_s * (time_noise[i] if time_noise else 1.0)
        out.append(MeasuredCandidate(summary=p.summary(), plan=p.model_dump(mode="json"), measured_s=t,
                                     measured_memory=ev.peak_memory_bytes))
    return out


CANDS = [Candidate("ring", ring=8, order=("ring",), token_layout="zigzag"),
         Candidate("ulysses", ulysses=8, order=("ulysses",)),
         Candidate("usp", ulysses=2, ring=4, order=("ulysses", "ring"), token_layout="zigzag", checkpointing="full"),
         Candidate("ring", dp=2, ring=4, order=("ring", "dp"), token_layout="zigzag", zero_stage=1,
                   checkpointing="attention_boundary")]


def test_calibration_recovers_known_parameters_from_synthetic_measurements():
    cl, m, w = load_cluster("dgx-h100", 1), load_model("gpt-3b"), Workload(seq_len=32768, batch=2)
    meas = _measured(cl, m, w, TRUTH, CANDS)
    meas.append(MeasuredCandidate(summary="oom", plan=meas[0].plan, status="oom", reason="CUDA out of memory"))
    r = fit(cl, Params(), meas)
    p = r.params
    assert p.overlap == pytest.approx(0.6, rel=0.02)
    assert p.round_overhead_s == pytest.approx(2e-3, rel=0.02)
    assert p.compute_efficiency == pytest.approx(0.8, rel=0.02)
    assert p.activation_factor == pytest.approx(1.3, rel=0.02)
    assert p.memory_overhead_bytes == pytest.approx(GIB, rel=0.02)
    assert any(f.startswith("compute efficiency in a step 0.80") for f in r.fitted)
    # 4 candidates for overlap, round overhead and compute efficiency: none to spare for the layer overhead
    assert p.layer_overhead_s == 0.0 and not any(f.startswith("layer overhead") for f in r.fitted)
    assert any(n.startswith("layer overhead not fitted: 4 timed candidates for 4 time parameters") for n in r.notes)
    assert len(r.fitted) == 5 and r.fitted[0].startswith("overlap 0.60 (from 4 candidates")
    # leave-one-out fits 3 time parameters to 3 candidates, with noise-free data exactly
    assert r.loo_error_before > 0.2 and r.loo_error_after < 0.03
    assert r.memory_error_before > 0.01 and r.memory_error_after < 0.01
    assert r.predicted_after[-1] == (None, None) and r.candidates[-1].status == "oom"
    for mc, (t, mem) in zip(r.candidates[:4], r.predicted_after[:4]):
        assert t == pytest.approx(mc.measured_s, rel=1e-3) and mem == pytest.approx(mc.measured_memory, rel=1e-3)
        assert mc.predicted_after_s == t and mc.predicted_before_s < mc.measured_s


def test_a_held_round_overhead_keeps_its_measured_value_and_the_rest_is_recovered():
    cl, m, w = load_cluster("dgx-h100", 1), load_model("gpt-3b"), Workload(seq_len=32768, batch=2)
    meas = _measured(cl, m, w, TRUTH, CANDS)
    # the probe read 2 ms (TRUTH's): held, the other time parameters are recovered around it
    r = fit(cl, Params(round_overhead_s=2e-3), meas, hold=frozenset({"round_overhead_s"}))
    assert r.params.round_overhead_s == 2e-3 and not any(f.startswith("round overhead") for f in r.fitted)
    assert r.params.overlap == pytest.approx(0.6, rel=0.02)
    assert r.params.compute_efficiency == pytest.approx(0.8, rel=0.02)
    # one parameter fewer: 4 candidates now leave one to spare for the layer overhead (none in TRUTH: ~0)
    assert any(f.startswith("layer overhead") for f in r.fitted) and r.params.layer_overhead_s < 1e-5
    # a wrong held value is kept too (the fit does not overrule a measurement), and the residual shows it
    off = fit(cl, Params(round_overhead_s=20e-3), meas, hold=frozenset({"round_overhead_s"}))
    assert off.params.round_overhead_s == 20e-3 and off.loo_error_after > r.loo_error_after


def test_leave_one_out_error_is_honest_under_noise():
    """With noisy measurements the fit is not exact: the LOO error stays above zero but below the uncalibrated
    one. (Overlap moves these steps by only ~6% between 0 and 1, so the noise here is 1%.)"""
    cl, m, w = load_cluster("dgx-h100", 1), load_model("gpt-3b"), Workload(seq_len=32768, batch=2)
    meas = _measured(cl, m, w, TRUTH, CANDS, time_noise=[1.01, 0.99, 1.005, 0.995])
    r = fit(cl, Params(), meas)
    assert 0.001 < r.loo_error_after < r.loo_error_before / 10
    assert 0.3 < r.params.overlap < 0.9
    assert r.params.round_overhead_s == pytest.approx(2e-3, rel=0.1)


def test_a_peak_below_the_modelled_parts_fits_no_negative_overhead():
    """Measured peaks 30 % under the model (one candidate, then all): the overhead stays >= 0 (a negative constant
    would price a small plan below zero bytes) and every prediction keeps a positive peak."""
    cl, m, w = load_cluster("dgx-h100", 1), load_model("gpt-3b"), Workload(seq_len=32768, batch=2)
    for cands in (CANDS[1:2], CANDS):
        meas = [mc.model_copy(update={"measured_memory": mc.measured_memory * 0.7})
                for mc in _measured(cl, m, w, Params(), cands)]
        r = fit(cl, Params(), meas)
        assert 0.0 <= r.params.memory_overhead_bytes < 1.0  # bytes
        est = Estimator(cl, m, w, params=r.params)
        assert all(est.evaluate(c).peak_memory_bytes > 0 for c in CANDS)
    with pytest.raises(ValueError, match="memory_overhead_bytes"):
        Params(memory_overhead_bytes=-1.0)


def test_one_candidate_fits_only_what_it_identifies():
    cl, m, w = load_cluster("dgx-h100", 1), load_model("gpt-3b"), Workload(seq_len=32768, batch=2)
    meas = _measured(cl, m, w, Params(memory_overhead_bytes=2 * GIB, compute_efficiency=0.7), CANDS[1:2])
    r = fit(cl, Params(), meas)
    # ulysses has no double-buffered round: overlap stays; one memory point: overhead only
    assert r.params.overlap == 1.0 and r.params.activation_factor == 1.0
    assert r.params.memory_overhead_bytes == pytest.approx(2 * GIB, rel=1e-6)
    assert any("overlap not fitted" in n for n in r.notes) and any("activation factor not fitted" in n for n in r.notes)
    # no ring: its one block call a layer is not told from the compute, so the compute efficiency takes the residual
    assert r.params.round_overhead_s == 0.0 and r.params.compute_efficiency == pytest.approx(0.7, rel=0.02)
    assert any(n.startswith("round overhead not fitted: no measured candidate runs a ring") for n in r.notes)
    assert r.fitted[0] == "compute efficiency in a step 0.70 of the timed kernels (from 1 candidate)"
    # one candidate, two free parameters: the fit is pulled toward neutral instead of running off
    meas = _measured(cl, m, w, TRUTH, CANDS[:1])
    r = fit(cl, Params(), meas)
    assert "regularized" in r.fitted[0]
    assert r.predicted_after[0][0] == pytest.approx(meas[0].measured_s, rel=0.05)


def test_fit_refuses_a_plan_without_its_model():
    cl = load_cluster("dgx-h100", 1)
    bad = MeasuredCandidate(summary="x", plan=Candidate("ring", ring=8, order=("ring",)).to_plan().model_dump(mode="json"),
                            measured_s=1.0)
    with pytest.raises(PlanError) as e:
        fit(cl, Params(), [bad])
    assert e.value.field == "candidates[0].plan"


# ---- link fits
def test_comm_fits_recover_known_efficiencies_from_link_samples():
    """cpu-local x2: shm 5 GB/s per rank each way (20 us per hop), one 1.25 GB/s NIC per node shared by 4 ranks."""
    cl = load_cluster("cpu-local", 2)
    links = {"classes": {
        "intra:shm": {"pair": [0, 1], "ops": {
            "p2p": {"group_size": 2, "alpha_s": 1e-4, "busbw": 4e9},  # model 5e9 -> 0.8; latency 2 hops = 40 us
            "all_to_all": {"group_size": 4, "alpha_s": 2e-4, "busbw": 2.5e9}}},  # model 5e9 -> 0.5
        "inter:ethernet": {"pair": [0, 4], "ops": {
            "p2p": {"group_size": 2, "alpha_s": 3e-4, "busbw": 1e9},  # model 1.25e9 -> 0.8; latency 2 x 80 us
            # 4 rails share the node's NIC: model busbw 1.25e9 / 4
            "all_gather": {"group_size": 2, "alpha_s": 3e-4, "busbw": 0.25e9}}}}}
    f = comm_fits(cl, links)
    assert set(f) == {"p2p/intra", "all_to_all/intra", "p2p/inter", "all_gather/inter"}
    assert f["p2p/intra"].efficiency == pytest.approx(0.8) and f["p2p/intra"].alpha_s == pytest.approx(6e-5)
    assert f["all_to_all/intra"].efficiency == pytest.approx(0.5)
    assert f["p2p/inter"].efficiency == pytest.approx(0.8) and f["p2p/inter"].alpha_s == pytest.approx(1.4e-4)
    assert f["all_gather/inter"].efficiency == pytest.approx(0.8)
    # the engine with these fits reproduces the measured alpha-beta line of a collective
    eng = LinkEngine(cl)
    cost = eng.cost("all_to_all", GroupShape(((4, 1),), 8))
    nbytes = 64e6
    assert cost.link_class == "intra"
    assert cost.time(nbytes, f["all_to_all/intra"]) == pytest.approx(2e-4 + nbytes * 0.75 / 2.5e9)
    rail = eng.cost("all_gather", GroupShape(((2, 4),), 8))
    assert rail.link_class == "inter"
    assert rail.time(nbytes, f["all_gather/inter"]) == pytest.approx(3e-4 + nbytes * 0.5 / 0.25e9)
    # measured_params puts them into Params (merged with a base's)
    p = measured_params(cl, "fp32", links=links)
    assert p.comm_fit("shift", "inter") == f["p2p/inter"] and p.comm_fit("shift_back", "intra") == f["p2p/intra"]


def test_a_multi_step_collective_and_a_two_way_pair_fit_per_step():
    """cpu-local x2 as above: a ring all-gather of 4 ranks takes 3 steps of one 20 us hop each way (path latency
    40 us a step), so 200 us measured is 66.7 us a step, 26.7 us beyond the path; its busbw against the link's 5 GB/s
    is the efficiency. A pair sending both ways at once pays one path's latency, not the two directions' sum."""
    links = {"classes": {
        "intra:shm": {"pair": [0, 1], "ops": {"p2p_bidir": {"group_size": 2, "alpha_s": 1e-4, "busbw": 4e9},
                                               "all_gather": {"group_size": 4, "alpha_s": 2e-4, "busbw": 2.5e9}}},
        "inter:ethernet": {"pair": [0, 4], "ops": {"p2p_bidir": {"group_size": 2, "alpha_s": 3e-4, "busbw": 1e9}}}}}
    f = comm_fits(load_cluster("cpu-local", 2), links)
    assert f["all_gather/intra"].alpha_s == pytest.approx(2e-4 / 3 - 4e-5)
    assert f["all_gather/intra"].efficiency == pytest.approx(0.5)
    assert f["p2p_bidir/intra"].alpha_s == pytest.approx(6e-5) and f["p2p_bidir/intra"].efficiency == pytest.approx(0.8)
    assert f["p2p_bidir/inter"].alpha_s == pytest.approx(1.4e-4) and f["p2p_bidir/inter"].efficiency == pytest.approx(0.8)


class _MemoryParts:
    """A pricer whose candidates hold ``rest`` bytes besides ``act`` bytes of activations (calibration._Pricer)."""

    def __init__(self, rest, act):
        self.parts = (np.array(rest, dtype=float), np.array(act, dtype=float))

    def memory_parts(self, base, cases):
        return self.parts


def test_two_candidates_of_different_activations_fit_the_factor_and_the_overhead():
    from types import SimpleNamespace

    from sp_plan.planner.calibration import _fit_memory

    rest, act = [4 * GIB, 6 * GIB], [10 * GIB, 20 * GIB]
    cases = [SimpleNamespace(memory=r + 1.3 * a + GIB) for r, a in zip(rest, act)]
    p, words, _ = _fit_memory(_MemoryParts(rest, act), Params(), cases)
    assert p.activation_factor == pytest.approx(1.3) and p.memory_overhead_bytes == pytest.approx(GIB)
    assert words == ["activation factor 1.300 (from 2 candidates)", "memory overhead 1.00 GiB (from 2 candidates)"]


def test_the_overhead_alone_fits_each_peak_relative_to_itself():
    """Equal activations: only the overhead is fitted, minimising sum((m - r - k a - o) / m)^2 over the peaks m,
    so o = sum(d / m^2) / sum(1 / m^2) of the residuals d (3.09 GiB here; the absolute fit would read 5.5 GiB)."""
    from types import SimpleNamespace

    from sp_plan.planner.calibration import _fit_memory

    cases = [SimpleNamespace(memory=20 * GIB), SimpleNamespace(memory=11 * GIB)]
    p, _, notes = _fit_memory(_MemoryParts([0.0, 0.0], [10 * GIB, 10 * GIB]), Params(activation_factor=1.0), cases)
    want = (10 / 20 ** 2 + 1 / 11 ** 2) / (1 / 20 ** 2 + 1 / 11 ** 2) * GIB
    assert p.memory_overhead_bytes == pytest.approx(want) and "activation factor not fitted" in notes[0]


# ---- profiles on plan / estimate
def test_plan_with_a_profile_differs_from_no_profile_and_records_it(tmp_path):
    cl, m = load_cluster("cpu-local", 1), ModelSpec(name="t", layers=2, hidden=256, heads=4, ffn_hidden=512,
                                                     vocab=1000, dtype="fp32")
    w = Workload(seq_len=4096, batch=2)
    prof = Profile(id="3f2a9c", cluster_fingerprint=cl.topology_fingerprint(), created_at="2026-11-23",
                   params=Params(round_overhead_s=5e-3, overlap=0.5, memory_overhead_bytes=GIB))
    off = plan(cl, m, w, top_k=2, profile=False)
    on = plan(cl, m, w, top_k=2, profile=prof)
    assert on[0].profile == "3f2a9c" and off[0].profile is None
    assert on[0].predicted.step_time_s > off[0].predicted.step_time_s
    assert on[0].predicted.memory["framework overhead"] == GIB
    path = tmp_path / "p.yaml"
    prof.model_copy(update={"id": None}).save(path)
    params, line, used = resolve_params(cl, str(path))
    assert params == prof.params and used is not None and line.startswith("using")
    pl = off[0]
    calibrated = estimate(pl, cl, m, w, profile=prof)
    assert calibrated == Estimator(cl, m, w, params=prof.params)(pl)
    assert calibrated.step_time_s > estimate(pl, cl, m, w, profile=False).step_time_s
    assert estimate(pl, cl, m, w, profile=False) == pl.predicted
    res = grid_search(cl, m, w, params=prof.params)
    assert res.ranked[0][0] == pytest.approx(on[0].predicted.step_time_s)
    # the pipeline looked the profile up; the planner prices with what it is given
    assert [p.summary() for p in pure_plan(cl, m, w, top_k=2, profile=prof)] == [p.summary() for p in on]
    assert pure_plan(cl, m, w, top_k=2, params=prof.params)[0].predicted == on[0].predicted
    # a profile of another cluster is not applied, and says so
    other = prof.model_copy(update={"cluster_fingerprint": "0" * 16})
    params, line, used = resolve_params(cl, other)
    assert params == Params() and used is None and line.startswith("not using")


def test_plan_and_estimate_look_profiles_up_in_the_store_they_are_given(tmp_path, monkeypatch):
    from sp_plan.profiles.store import Store

    monkeypatch.delenv("SP_PLAN_STORE", raising=False)
    cl, m = load_cluster("cpu-local", 1), ModelSpec(name="t", layers=2, hidden=256, heads=4, ffn_hidden=512,
                                                     vocab=1000, dtype="fp32")
    w = Workload(seq_len=4096, batch=2)
    url = f"sqlite:///{tmp_path / 'team.db'}"
    st = Store(url)
    pid = st.save_profile(Profile(cluster_fingerprint=cl.topology_fingerprint(), created_at="2026-11-24",
                                  params=Params(round_overhead_s=5e-3, overlap=0.5)))
    for store in (st, url):  # a Store or its URL
        assert plan(cl, m, w, top_k=1, store=store)[0].profile == pid  # None: the cluster's newest profile there
        pl = plan(cl, m, w, top_k=1, profile=pid, store=store)[0]
        assert pl.profile == pid
        assert estimate(pl, cl, m, w, profile=pid, store=store) == pl.predicted
    with pytest.raises(PlanError) as e:  # not in the default store, which is not this one
        plan(cl, m, w, top_k=1, profile=pid, store=f"sqlite:///{tmp_path / 'other.db'}")
    assert e.value.field == "profile" and "other.db" in e.value.problem


def test_import_sp_plan_is_light_and_exports_the_api():
    code = ("import sys, sp_plan; assert 'torch' not in sys.modules, 'import sp_plan pulled torch in'\n"
            "from sp_plan import plan, estimate, Plan, Workload, load_cluster, load_model, Store, init\n"
            "from sp_plan.pipeline import plan as p2, estimate as e2\n"
            "assert plan is p2 and estimate is e2 and set(sp_plan.__all__) <= set(dir(sp_plan))\n"
            "c, m = load_cluster('dgx-h100'), load_model('llama3-8b')\n"
            "print(sp_plan.plan(c, m, sp_plan.Workload(seq_len=32768), top_k=1, profile=False)[0].summary())\n"
            "try:\n    sp_plan.nonesuch\nexcept AttributeError as e:\n    print('no', e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] and "nonesuch" in lines[1]


def test_cli_plan_and_estimate_apply_a_profile_file_and_say_so(tmp_path):
    cl = load_cluster("cpu-local", 1)
    prof = Profile(id="abc123", cluster_fingerprint=cl.topology_fingerprint(), created_at="2026-11-23",
                   params=Params(round_overhead_s=5e-3))
    pf = tmp_path / "profile.yaml"
    prof.save(pf)
    one = str(Path(__file__).parent.parent / "tests" / "fixtures" / "models" / "one-layer.yaml")
    sp = [sys.executable, "-m", "sp_plan.cli.app"]
    args = ["plan", "--cluster", "cpu-local", "--model", one, "--seq-len", "8k", "--top", "2"]
    r = subprocess.run(sp + args + ["--profile", str(pf), "-o", str(tmp_path / "a.yaml")], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "using profile abc123 tuned 2026-11-23" in r.stdout
    from sp_plan.planner import Plan

    assert Plan.load(tmp_path / "a.yaml").profile == "abc123"
    r = subprocess.run(sp + ["estimate", str(tmp_path / "a.yaml"), "--cluster", "cpu-local", "--no-profile"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "not using a profile" in r.stdout
    r = subprocess.run(sp + args + ["--profile", str(tmp_path / "missing.yaml")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "--profile" in r.stderr
    r = subprocess.run(sp + args + ["--profile", str(pf), "--no-profile"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2


def test_a_comm_fit_key_outside_the_pattern_and_link_classes_is_refused(tmp_path):
    """A mistyped key would be ignored by the engine (no fit found): refused, naming the key and the valid forms."""
    with pytest.raises(ValueError, match="'all_to_all/intr' is not PATTERN_CLASS/LINK_CLASS"):
        Params(comm={"all_to_all/intr": CommFit()})
    with pytest.raises(ValueError, match="'alltoall/intra'"):
        Params(comm={"alltoall/intra": CommFit()})
    assert Params(comm={"all_to_all/host": CommFit(efficiency=0.5)}).comm_fit("all_to_all", "host").efficiency == 0.5
    bad = tmp_path / "bad.yaml"
    bad.write_text((Path(__file__).parent / "fixtures" / "profile-dgx-h100.yaml").read_text()
                   .replace("all_to_all/inter:", "all_to_all/intr:"))
    r = subprocess.run([sys.executable, "-m", "sp_plan.cli.app", "plan", "--cluster", "dgx-h100", "--nodes", "2",
                        "--model", "llama3-8b", "--seq-len", "128k", "--profile", str(bad)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") <= 1
    assert "profile.params.comm" in r.stderr and "'all_to_all/intr'" in r.stderr


def test_tp_overhead_adds_its_collectives_by_hand_and_spares_metp():
    cl, m, w = load_cluster("dgx-h100", 1), load_model("gpt-3b"), Workload(seq_len=32768, batch=2)
    tp = Candidate("ring", tp=2, ring=4, order=("tp", "ring"), token_layout="zigzag")
    ckpt = Candidate("ring", tp=2, ring=4, order=("tp", "ring"), token_layout="zigzag", checkpointing="full")
    metp = Candidate("metp", tp=8, order=("tp",), token_layout="zigzag")
    ring = Candidate("ring", ring=8, order=("ring",), token_layout="zigzag")
    o = 1e-3
    base, est = Estimator(cl, m, w), Estimator(cl, m, w, params=Params(tp_overhead_s=o))
    # 2 all-gathers + 2 reduce-scatters a forward, as many a backward (and a recomputed forward), per layer and
    # micro-batch (batch 2: two micro-batches of one)
    assert est.evaluate(tp).step_time_s - base.evaluate(tp).step_time_s == pytest.approx(8 * o * m.layers * 2)
    assert est.evaluate(ckpt).step_time_s - base.evaluate(ckpt).step_time_s == pytest.approx(12 * o * m.layers * 2)
    rows = {r.name: r.seconds for r in est.predict(tp).breakdown}
    assert rows["tp collective overhead"] == pytest.approx(8 * o * m.layers * 2)
    for c in (metp, ring):  # METP's own TP and no TP: untouched
        assert est.evaluate(c).step_time_s == base.evaluate(c).step_time_s
    inf = Workload(seq_len=32768, batch=2, training=False)
    assert Estimator(cl, m, inf, params=Params(tp_overhead_s=o)).evaluate(tp).step_time_s - \
        Estimator(cl, m, inf).evaluate(tp).step_time_s == pytest.approx(4 * o * m.layers * 2)


def test_tp_overhead_is_recovered_only_where_a_candidate_has_tp_collectives():
    cl, m, w = load_cluster("dgx-h100", 1), load_model("gpt-3b"), Workload(seq_len=32768, batch=2)
    truth = TRUTH.model_copy(update={"tp_overhead_s": 3e-3})
    tp = [Candidate("ring", tp=2, ring=4, order=("tp", "ring"), token_layout="zigzag"),
          Candidate("usp", tp=4, ulysses=2, order=("tp", "ulysses"), checkpointing="full")]
    p = fit(cl, Params(), _measured(cl, m, w, truth, CANDS + tp)).params
    assert p.tp_overhead_s == pytest.approx(3e-3, rel=0.02) and p.overlap == pytest.approx(0.6, rel=0.02)
    r = fit(cl, Params(), _measured(cl, m, w, truth, CANDS))  # no TP candidate: nothing to tell it by
    assert r.params.tp_overhead_s == 0.0 and not any(f.startswith("TP overhead") for f in r.fitted)


def test_a_candidate_that_alone_moves_a_parameter_has_no_leave_one_out_time():
    cl, m, w = load_cluster("dgx-h100", 1), load_model("gpt-3b"), Workload(seq_len=32768, batch=2)
    truth = TRUTH.model_copy(update={"tp_overhead_s": 3e-3})
    one_tp = CANDS + [Candidate("ring", tp=2, ring=4, order=("tp", "ring"), token_layout="zigzag")]
    r = fit(cl, Params(), _measured(cl, m, w, truth, one_tp))
    # the fit without the TP candidate cannot know the TP overhead: no leave-one-out time for it (tune's reread
    # would take the missing parameter for a slow reading); the others have theirs, as the fit without them says
    assert r.params.tp_overhead_s == pytest.approx(3e-3, rel=0.05)
    assert r.loo_times[-1] is None and all(t is not None and t > 0 for t in r.loo_times[:-1])
    two_tp = one_tp + [Candidate("usp", tp=4, ulysses=2, order=("tp", "ulysses"), checkpointing="full")]
    assert all(t is not None for t in fit(cl, Params(), _measured(cl, m, w, truth, two_tp)).loo_times)


def test_the_calibration_pages_synthetic_profile_is_what_the_code_computes():
    """docs/concepts/calibration.md's example: the preset's terms with overlap 0.6, 2 ms a call, activations x1.3 and
    1 GiB more, measured on four gpt-3b layouts with 1 % noise, fitted from the preset's terms; what the fit recovers
    and how llama3-8b at 128k ranks under it are the page's figures."""
    from sp_plan.profiles.kernels import default_params

    page = (Path(__file__).parents[1] / "docs" / "concepts" / "calibration.md").read_text()
    cl, m, w = load_cluster("dgx-h100", 1), load_model("gpt-3b"), Workload(seq_len=32768, batch=2)
    base = default_params(cl)
    truth = base.model_copy(update=dict(overlap=0.6, round_overhead_s=2e-3, activation_factor=1.3,
                                        memory_overhead_bytes=GIB))
    r = fit(cl, base, _measured(cl, m, w, truth, CANDS, time_noise=[1.01, 0.99, 1.005, 0.995]))
    p = r.params
    assert (f"recovers overlap {p.overlap:.2f}, {p.round_overhead_s * 1e3:.2f} ms, a compute efficiency of "
            f"{p.compute_efficiency:.2f}, {p.activation_factor:.3f} and {p.memory_overhead_bytes / GIB:.2f} GiB") \
        in " ".join(page.split())
    assert f"from {r.loo_error_before * 100:.1f} % to {r.loo_error_after * 100:.1f} %" in " ".join(page.split())
    work = Workload(seq_len="128k")
    llama = load_model("llama3-8b")
    tuned = plan(cl, llama, work, top_k=3, profile=Profile(cluster_fingerprint=cl.topology_fingerprint(), params=p))
    plain = plan(cl, llama, work, top_k=3, profile=False)
    for rows in (tuned, plain):
        best = rows[0]
        assert f"│ 1 │ {best.summary()} " in page and f"│ {best.predicted.step_time_s:.3f} s │" in page
    assert tuned[0].zero_stage == 3 and plain[0].zero_stage == 2  # the page's point: under the profile ZeRO-2 does not fit
    zero2 = estimate(plain[0], cl, llama, work, profile=Profile(cluster_fingerprint=cl.topology_fingerprint(),
                                                                 params=p))
    gib = lambda b: f"{b / GIB:.1f} GiB"  # noqa: E731
    assert (f"ZeRO-2's {gib(plain[0].predicted.peak_memory_bytes)} becomes {gib(zero2.peak_memory_bytes)}, over the "
            f"{gib(zero2.memory_capacity_bytes)}") in " ".join(page.split())


def test_activations_two_percent_apart_fit_the_overhead_only():
    """The activation factor is fitted only from peaks whose activations differ by more than 5 %: 2 % apart, the
    factor cannot be told from the overhead (small noise on the peaks would throw it anywhere in its bounds), so it
    keeps the base's value, the overhead alone is fitted, and a note says why."""
    from types import SimpleNamespace

    from sp_plan.planner.calibration import _fit_memory

    rest, act = [4 * GIB, 4 * GIB], [10 * GIB, 10.2 * GIB]
    peaks = [4 * GIB + 10 * GIB + GIB, 1.01 * (4 * GIB + 10.2 * GIB + GIB)]  # 1 % noise on the second peak
    p, words, notes = _fit_memory(_MemoryParts(rest, act), Params(), [SimpleNamespace(memory=m) for m in peaks])
    assert p.activation_factor == 1.0
    assert words == [f"memory overhead {p.memory_overhead_bytes / GIB:.2f} GiB (from 2 candidates)"]
    assert notes and notes[0].startswith("activation factor not fitted")
    assert p.memory_overhead_bytes == pytest.approx(1.07 * GIB, rel=0.05)


def test_round_overhead_is_fitted_from_three_candidates_without_a_ring():
    """From three timed candidates (MIN_FOR_COMPUTE) the fit tells the round overhead apart from the compute
    efficiency even where no candidate runs a ring: both are fitted, and no note leaves the round overhead to the
    compute efficiency for want of a ring."""
    from sp_plan.planner.calibration import MIN_FOR_COMPUTE

    cands = [Candidate("ulysses", ulysses=8, order=("ulysses",)),
             Candidate("ulysses", ulysses=8, order=("ulysses",), checkpointing="full"),
             Candidate("ulysses", ulysses=4, dp=2, order=("ulysses", "dp"))]
    assert len(cands) == MIN_FOR_COMPUTE
    cl, m, w = load_cluster("dgx-h100", 1), load_model("gpt-3b"), Workload(seq_len=32768, batch=2)
    meas = _measured(cl, m, w, Params(round_overhead_s=2e-3, compute_efficiency=0.8), cands)
    r = fit(cl, Params(), meas)
    assert any(f.startswith("round overhead") for f in r.fitted)
    assert any(f.startswith("compute efficiency") for f in r.fitted)
    assert not any(n.startswith("round overhead not fitted") for n in r.notes)
    for mc, (t, _) in zip(meas, r.predicted_after):
        assert t == pytest.approx(mc.measured_s, rel=1e-3)


def test_two_short_rings_that_both_move_the_overlap_keep_their_leave_one_out_times():
    """Whether a candidate moves a parameter is judged against its own step: two short rings on cpu-local (512
    tokens, steps of about 0.1 s) both move with the overlap, one by only 0.8 ms, and neither is taken for the
    overlap's only witness, so each keeps its leave-one-out time."""
    cl = load_cluster("cpu-local", 1)
    m = ModelSpec(name="t", layers=2, hidden=256, heads=4, ffn_hidden=1024, vocab=1024, dtype="fp32")
    w = Workload(seq_len=512, batch=2)
    cands = [Candidate("ring", ring=4, order=("ring",), token_layout="zigzag"),
             Candidate("ring", ring=2, dp=2, order=("ring", "dp"), token_layout="zigzag")]
    moved = [Estimator(cl, m, w, params=Params(overlap=0.0)).evaluate(c).step_time_s -
             Estimator(cl, m, w, params=Params(overlap=1.0)).evaluate(c).step_time_s for c in cands]
    assert all(d > 0 for d in moved) and min(moved) < 1e-3
    r = fit(cl, Params(), _measured(cl, m, w, Params(overlap=0.6), cands))
    assert all(t is not None and t > 0 for t in r.loo_times)
