"""Calibration from link samples (what `sp-plan tune` measures before any candidate runs): each sample is priced on
the pair it names, one link class per kind gives the fit (the first by name), a sample without a group size is a
pair, and ``measured_params`` replaces only the fits it measured in a base profile. Also: the fit moves the overlap
even where communication is a small part of the step (a CPU world's ring)."""
import pytest

from sp_plan.planner import Candidate, Estimator, ModelSpec, Workload
from sp_plan.planner.calibration import comm_fits, fit, measured_params
from sp_plan.planner.params import CommFit, Params
from sp_plan.planner.profile import MeasuredCandidate
from sp_plan.profiles import load_cluster, preset_cluster


def _p2p(pair, busbw, alpha_s):
    """One link class timed with a lone pair sending one way (probe's p2p)."""
    return {"pair": list(pair), "ops": {"p2p": {"group_size": 2, "alpha_s": alpha_s, "busbw": busbw}}}


# ---- which pair a sample is priced on
def test_a_pair_across_sockets_is_priced_on_its_own_path():
    """l20-8-pcie: GPUs 0 and 4 sit on different sockets (the 20 GB/s inter-socket link, 20 us path latency), not
    under one 32 GB/s switch as 0 and 1 do; 10 GB/s and 100 us measured on that pair are half its path's bandwidth
    and 80 us beyond its latency."""
    f = comm_fits(load_cluster("l20-8-pcie", 1), {"classes": {"intra:smp": _p2p((0, 4), 10e9, 1e-4)}})
    assert f["p2p/intra"].efficiency == pytest.approx(0.5)
    assert f["p2p/intra"].alpha_s == pytest.approx(8e-5)


# ---- several link classes of one kind
def test_of_two_intra_classes_the_first_by_name_gives_the_fit():
    """l20-8-pcie timed on a pair under one switch (pcie, 32 GB/s) and on a pair across sockets (smp, 20 GB/s): both
    price as intra, and the fit is the pcie pair's, whichever order the file lists them in."""
    cl = load_cluster("l20-8-pcie", 1)
    pcie, smp = _p2p((0, 1), 24e9, 1e-4), _p2p((0, 4), 10e9, 1e-4)
    for classes in ({"intra:pcie": pcie, "intra:smp": smp}, {"intra:smp": smp, "intra:pcie": pcie}):
        f = comm_fits(cl, {"classes": classes})
        assert f["p2p/intra"].efficiency == pytest.approx(0.75)  # 24 of the switch's 32 GB/s
        assert f["p2p/intra"].alpha_s == pytest.approx(1e-4 - 8e-6)  # beyond the pcie pair's 8 us path


# ---- a sample without a group size
def test_samples_without_a_group_size_are_taken_as_pairs():
    """cpu-local with 2 ranks a node: a p2p and an all-gather sample that give no group size fit as the same samples
    with group_size 2 do, a pair of the node's two ranks."""
    cl = preset_cluster("cpu-local", devices_per_node=2)
    ops = {"p2p": {"alpha_s": 1e-4, "busbw": 4e9}, "all_gather": {"alpha_s": 2e-4, "busbw": 2.5e9}}
    sized = {op: {**f, "group_size": 2} for op, f in ops.items()}
    bare = comm_fits(cl, {"classes": {"intra:shm": {"pair": [0, 1], "ops": ops}}})
    assert set(bare) == {"p2p/intra", "all_gather/intra"}
    assert bare == comm_fits(cl, {"classes": {"intra:shm": {"pair": [0, 1], "ops": sized}}})


# ---- measured_params over a base profile
def test_measured_params_replaces_the_measured_fits_and_keeps_the_rest_of_its_base():
    """A base with an intra p2p fit, an inter all-to-all fit and an overlap: new intra samples replace the intra p2p
    fit; the inter fit and the overlap, not measured again, stay."""
    cl = load_cluster("cpu-local", 2)
    old_p2p, old_a2a = CommFit(alpha_s=1e-3, efficiency=0.3), CommFit(alpha_s=2e-3, efficiency=0.4)
    base = Params(overlap=0.7, comm={"p2p/intra": old_p2p, "all_to_all/inter": old_a2a})
    links = {"classes": {"intra:shm": _p2p((0, 1), 4e9, 1e-4)}}
    p = measured_params(cl, "fp32", links=links, base=base)
    assert p.comm["p2p/intra"] == comm_fits(cl, links)["p2p/intra"]
    assert p.comm["p2p/intra"].efficiency == pytest.approx(0.8)
    assert p.comm["all_to_all/inter"] == old_a2a
    assert p.overlap == 0.7


# ---- overlap where communication is a small part of the step
def _ring_on_cpu(truth):
    """A ring of 2 (x dp 2) on cpu-local, 64k tokens, timed as the engine prices it under ``truth``: its K, V
    messages are ~0.03 % of the step, so the overlap moves the step by only that much."""
    cl = load_cluster("cpu-local", 1)
    m = ModelSpec(name="t", layers=2, hidden=256, heads=4, ffn_hidden=1024, vocab=1024, dtype="fp32")
    w = Workload(seq_len=65536, batch=2)
    c = Candidate("ring", ring=2, dp=2, order=("ring", "dp"), token_layout="zigzag")
    p = c.to_plan(model=m, workload=w)
    t = Estimator(cl, m, w, params=truth).evaluate(c).step_time_s
    return cl, MeasuredCandidate(summary=p.summary(), plan=p.model_dump(mode="json"), measured_s=t)


def test_overlap_is_fitted_where_communication_is_a_small_part_of_the_step():
    """The round overhead held at what the probe read (as tune does): the one ring candidate gives the overlap it
    was timed with, and no note claims it has no round with communication."""
    cl, mc = _ring_on_cpu(Params(overlap=0.6, round_overhead_s=2e-3))
    r = fit(cl, Params(round_overhead_s=2e-3), [mc], hold=frozenset({"round_overhead_s"}))
    assert r.params.overlap == pytest.approx(0.6, rel=1e-3)
    assert r.fitted == ["overlap 0.60 (from 1 candidate)"]
    assert not any(n.startswith("overlap not fitted") for n in r.notes)
