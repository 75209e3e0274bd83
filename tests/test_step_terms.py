"""Step terms: the all-reduce priced from the reduce-scatter and all-gather fits, DDP's gradient
buckets, and a fixed cost per layer (Params.layer_overhead_s), each against a hand-computed case."""
from __future__ import annotations

import pytest

from sp_plan.planner import Candidate, Estimator, Workload
from sp_plan.planner.calibration import fit
from sp_plan.planner.engine import GroupShape, LinkEngine
from sp_plan.planner.params import CommFit, Params, all_reduce_fit
from sp_plan.planner.profile import MeasuredCandidate
from sp_plan.planner.schedules import DDP_BUCKET_BYTES, bucket_share, bucketed_exposure, shard_params
from sp_plan.profiles import load_cluster, load_model

MIB = float(1 << 20)


# ---- all-reduce = reduce-scatter + all-gather
def test_all_reduce_fit_averages_the_two_halves_per_step():
    rs, ag = CommFit(alpha_s=1e-3, efficiency=0.25), CommFit(alpha_s=3e-3, efficiency=0.5)
    f = all_reduce_fit(rs, ag)
    assert f.alpha_s == pytest.approx(2e-3)
    assert f.efficiency == pytest.approx(2 / (4 + 2))  # 1/e = (1/0.25 + 1/0.5) / 2 = 3
    assert all_reduce_fit(rs, None) is None and all_reduce_fit(None, ag) is None


def test_unfitted_all_reduce_costs_exactly_a_reduce_scatter_and_an_all_gather():
    cl = load_cluster("a100-16-eth100", 2)
    eng = LinkEngine(cl)
    p = Params(comm={"reduce_scatter/inter": CommFit(alpha_s=2e-4, efficiency=0.3),
                     "all_gather/inter": CommFit(alpha_s=1e-4, efficiency=0.6)})
    shape = GroupShape(((2, cl.devices_per_node),), cl.world_size)  # two ranks on two nodes
    nbytes = 64e6
    both = eng.time("reduce_scatter", shape, nbytes, p) + eng.time("all_gather", shape, nbytes, p)
    assert eng.time("all_reduce", shape, nbytes, p) == pytest.approx(both, rel=1e-12)
    # hand: n = 2, one step each of nbytes / 2 at capacity x efficiency, plus latency and alpha
    c = eng._cost("shift", shape)
    hand = (nbytes / 2 * c.sec_per_byte / 0.3 + c.latency + 2e-4) + (nbytes / 2 * c.sec_per_byte / 0.6 + c.latency + 1e-4)
    assert both == pytest.approx(hand, rel=1e-12)
    # an all-reduce fit of its own wins; "host" still falls back to "intra"
    own = CommFit(efficiency=0.9)
    assert Params(comm={**p.comm, "all_reduce/inter": own}).comm_fit("all_reduce", "inter") is own
    assert Params().comm_fit("all_reduce", "inter") is None


# ---- DDP buckets
def test_bucket_share_is_a_layer_or_ddp_25_mib_whichever_is_larger():
    assert DDP_BUCKET_BYTES == 25 * MIB
    assert bucket_share(27.5e6, 8) == pytest.approx(25 * MIB / 27.5e6)  # a tiny model: one bucket holds 95 %
    assert bucket_share(20e6, 8) == 1.0
    assert bucket_share(16e9, 32) == 1 / 32  # a large model: a layer's gradients outgrow the bucket
    assert bucket_share(27.5e6, 8, None) == 1 / 8  # ZeRO's per-block wrappers


def _simulated(total: float, backward: float, share: float) -> float:
    """Seconds after the backward until the last bucket is sent: bucket i is full at i f x backward and sent after
    bucket i-1, at f x total (the event simulation bucketed_exposure shortcuts); 1 / f buckets."""
    t = 0.0
    n = round(1 / share)
    for i in range(1, n + 1):
        t = max(t, i * share * backward) + share * total
    return t - backward


@pytest.mark.parametrize("share", [1.0, 0.5, 0.25, 1 / 32])
@pytest.mark.parametrize("total,backward", [(1.0, 0.2), (1.0, 0.9), (0.3, 1.0), (0.05, 2.0), (1.0, 1.0)])
def test_bucketed_exposure_matches_an_event_simulation(share, total, backward):
    assert float(bucketed_exposure(total, backward, share)) == pytest.approx(_simulated(total, backward, share),
                                                                             rel=1e-9, abs=1e-12)


def test_bucketed_exposure_by_hand():
    # 4 buckets, 1 s of sync, 0.6 s of backward: buckets full at 0.15, 0.3, 0.45, 0.6 s, each sent in 0.25 s:
    # they queue from 0.15 s, so the last is done at 1.15 s, 0.55 s after the backward
    assert float(bucketed_exposure(1.0, 0.6, 0.25)) == pytest.approx(0.55)
    # a backward longer than the sync hides all but the last bucket
    assert float(bucketed_exposure(1.0, 3.0, 0.25)) == pytest.approx(0.25)


def test_zero0_sync_exposure_in_a_step_follows_the_buckets():
    """A tiny model's gradients nearly fill one DDP bucket, so almost all its all-reduce follows the backward, where
    a bucket per layer would have hidden all but what the backward cannot cover. A ring across both nodes holds the
    network the sync needs for nearly all of its backward: the sync's window is the backward's wall time less the
    time the ring's transfers hold it, which is less than the backward's compute."""
    cl, m = load_cluster("a100-16-eth100", 2), load_model("tiny-llama")
    w = Workload(seq_len=4096, batch=1)
    est = Estimator(cl, m, w)
    cand = Candidate("ring", ring=cl.world_size, order=("ring",), token_layout="zigzag")
    p = est.predict(cand)
    sync = next(b for b in p.breakdown if b.name == "grad all-reduce")
    grads = shard_params(m, 1, 1) * 4  # fp32
    f = bucket_share(grads, m.layers)
    assert f > 0.5
    rows = {b.name: b for b in p.breakdown}
    backward = [rows[n] for n in ("linear bwd", "attention bwd", "ring p2p bwd", "ring p2p dk,dv home")]
    wall = sum(b.exposed_seconds for b in backward)
    held = sum(b.seconds for b in backward if b.kind == "communication")  # one transfer a round, all inter-node
    compute = sum(b.seconds for b in backward if b.kind == "compute")
    assert 0 < wall - held < compute
    assert sync.exposed_seconds == pytest.approx(max(f * sync.seconds, sync.seconds - (1 - f) * (wall - held)),
                                                 rel=1e-9)
    assert sync.exposed_seconds > sync.seconds - compute  # more than a bucket per layer would leave


# ---- a fixed cost per layer
def test_layer_overhead_adds_layers_per_stage_times_micro_batches_and_slots():
    cl, m = load_cluster("dgx-h100", 2), load_model("llama3-8b")
    w = Workload(seq_len=32768, batch=4)
    o = 2e-3
    for cand in (Candidate("ring", ring=8, dp=2, order=("ring", "dp"), token_layout="zigzag"),
                 Candidate("ring", ring=8, pp=2, order=("ring", "pp"), token_layout="zigzag", micro_batch_size=1)):
        a = Estimator(cl, m, w).evaluate(cand).step_time_s
        b = Estimator(cl, m, w, params=Params(layer_overhead_s=o)).evaluate(cand).step_time_s
        lp, mb = m.layers // cand.pp, w.batch // (cand.dp * cand.micro_batch_size)
        assert b - a == pytest.approx((mb + cand.pp - 1) * lp * o, rel=1e-9)
    for ckpt in ("full", "attention_boundary"):  # either recomputes a forward: a third more
        full = Candidate("ring", ring=8, dp=2, order=("ring", "dp"), token_layout="zigzag", checkpointing=ckpt)
        a = Estimator(cl, m, w).evaluate(full).step_time_s
        b = Estimator(cl, m, w, params=Params(layer_overhead_s=o)).evaluate(full).step_time_s
        assert b - a == pytest.approx(2 * m.layers * o * 4 / 3, rel=1e-9), ckpt
    inf = Workload(seq_len=32768, batch=1, training=False)
    cand = Candidate("ring", ring=16, order=("ring",), token_layout="zigzag")
    a = Estimator(cl, m, inf).evaluate(cand).step_time_s
    b = Estimator(cl, m, inf, params=Params(layer_overhead_s=o)).evaluate(cand).step_time_s
    assert b - a == pytest.approx(m.layers * o / 3, rel=1e-9)  # a forward alone: a third


def test_calibration_recovers_a_layer_overhead_where_layers_per_rank_differ():
    cl, m, w = load_cluster("dgx-h100", 1), load_model("gpt-3b"), Workload(seq_len=32768, batch=2)
    truth = Params(compute_efficiency=0.7, layer_overhead_s=4e-3)
    cands = [Candidate("ring", ring=8, order=("ring",), token_layout="zigzag"),
             Candidate("ulysses", ulysses=8, order=("ulysses",)),
             Candidate("ring", ring=4, pp=2, order=("ring", "pp"), token_layout="zigzag", micro_batch_size=1),
             Candidate("ulysses", ulysses=2, pp=4, order=("ulysses", "pp"), micro_batch_size=1),
             Candidate("ring", ring=2, pp=4, order=("ring", "pp"), token_layout="zigzag", micro_batch_size=1)]
    est = Estimator(cl, m, w, params=truth)
    meas = []
    for c in cands:
        ev = est.evaluate(c)
        p = c.to_plan(model=m, workload=w)
        meas.append(MeasuredCandidate(summary=p.summary(), plan=p.model_dump(mode="json"), measured_s=ev.step_time_s,
                                      measured_memory=ev.peak_memory_bytes))
    r = fit(cl, Params(), meas)
    assert r.params.layer_overhead_s == pytest.approx(4e-3, rel=0.02)
    assert r.params.compute_efficiency == pytest.approx(0.7, rel=0.02)
    assert any(f.startswith("layer overhead 4.00 ms per layer") for f in r.fitted)
