"""What a tune candidate stores as its measured step time and memory (profiles/tune/candidate.py): a step's
forward-backward reading is split over the micro-batches it ran, a replica runs the batch's share over dp, the
composed pipeline step waits for the slowest rank's readings and stage sends and counts the gradients' sync once
(as a step without a pipeline does), the stage sends carry the message the
pipeline is priced with, a tracked step's peak leaves out what the step keeps, and timed medians leave out their
warm-up. Readings are scripted (seconds a rank reports), so the checks are exact and no time is measured."""
from types import SimpleNamespace

import torch
import torch.distributed as dist

from sp_plan.planner import ModelSpec, Plan, Workload
from sp_plan.profiles.tune import candidate
from sp_plan.profiles.tune.candidate import Bench, masked_attention, run_candidate, stage_round_trip, stage_sends
from sp_plan.profiles.tune.candidate import tracked_step
from exact import once
from harness.worlds import run_world
from markers import shared_world

MODEL = ModelSpec(name="tiny", layers=4, hidden=64, heads=4, kv_heads=2, vocab=128, dtype="fp32", gated_mlp=True)
BATCH = Workload(seq_len=256, batch=4)
REPLICAS = Plan(algorithm="ring", degrees={"dp": 2})  # 4 sequences over 2 replicas: 2 micro-batches each
PIPELINE = Plan(algorithm="ring", degrees={"pp": 2})  # 4 micro-batches, one stage's run, the step composed
#: scripted readings of each rank (binary fractions, so sums compare exactly): rank 1 is the slower one except at
#: the optimizer, so that the max over ranks is told from either rank's own
FWD_BWD_PER_MICRO_BATCH = (0.5, 0.75)
OPTIMIZER = (0.25, 0.125)
SENDS = (0.0625, 0.125)
SYNC = (0.25, 0.5)
SYNCED = {"ring2": Plan(algorithm="ring", degrees={"ring": 2}), "pp2": PIPELINE}


# ---------------------------------------------------------------- one 2-rank world, scripted readings

def _scripted_replicas(rank):
    """run_candidate of the replicas' plan, each step really run but reporting the scripted seconds; with the
    micro-batches each step of this rank ran."""
    real, ran = candidate.train_step, []

    def train_step(bench, model, device, fault=None):
        real(bench, model, device, fault)
        ran.append(len(bench.data))
        return FWD_BWD_PER_MICRO_BATCH[rank] * len(bench.data), OPTIMIZER[rank]

    candidate.train_step = train_step
    try:
        return run_candidate(REPLICAS, MODEL, BATCH, iters=1), sorted(set(ran))
    finally:
        candidate.train_step = real


def _scripted_pipeline(rank):
    """run_candidate of the pipeline's plan, each step really run but reporting the scripted seconds (forward +
    backward, sync, optimizer) and sends; with the micro-batches each step of this rank ran."""
    real, real_sends, ran = candidate.bench_step, candidate.stage_sends, []

    def bench_step(bench, model, device, fault=None):
        real(bench, model, device, fault)
        ran.append(len(bench.data))
        return FWD_BWD_PER_MICRO_BATCH[rank], SYNC[rank], OPTIMIZER[rank]

    candidate.bench_step, candidate.stage_sends = bench_step, lambda *a, **k: SENDS[rank]
    try:
        return run_candidate(PIPELINE, MODEL, BATCH, iters=1), sorted(set(ran))
    finally:
        candidate.bench_step, candidate.stage_sends = real, real_sends


def _sync_only(rank):
    """The step each plan of ``SYNCED`` stores on a clock that moves one second in each gradients' sync only."""
    now, real_time, real_par = [0.0], candidate.time, candidate.parallelize

    def parallelize(*a, **k):
        par = real_par(*a, **k)
        synchronize = par.sync_grads

        def counted():
            synchronize()
            now[0] += 1.0

        par.sync_grads = counted
        return par

    candidate.time, candidate.parallelize = SimpleNamespace(perf_counter=lambda: now[0]), parallelize
    try:
        return {name: run_candidate(plan, MODEL, BATCH, iters=1).measured_s for name, plan in SYNCED.items()}
    finally:
        candidate.time, candidate.parallelize = real_time, real_par


def _scripted_candidates(rank, world):
    return {"replicas": _scripted_replicas(rank), "pipeline": _scripted_pipeline(rank), "sync": _sync_only(rank)}


@once
def world():
    """Every rank's {plan name: (candidate, micro-batch counts its steps ran)}, and the synced steps."""
    return run_world(_scripted_candidates, 2, timeout=120)


def _fit(res, q):
    return res.detail["fit"][q]["value"]


@shared_world("tune_candidate_values")
def test_every_rank_stores_the_same_candidate():
    """Each rank of the world returns the one candidate, measured."""
    ranks = world()
    assert ranks[0] == ranks[1]
    assert all(res.status == "ok" for res, _ in (ranks[0]["replicas"], ranks[0]["pipeline"]))


@shared_world("tune_candidate_values")
def test_a_replica_runs_its_share_of_the_batch_in_micro_batches():
    """Batch 4 over 2 replicas: each rank runs 2 micro-batches a step, and the step counts 2."""
    for ranks in world():
        res, ran = ranks["replicas"]
        assert ran == [2] and res.detail["micro_batches"] == res.detail["micro_batches_run"] == 2


@shared_world("tune_candidate_values")
def test_the_forward_backward_reading_is_per_micro_batch_and_the_step_runs_each():
    """A step of 2 micro-batches read as 2 x 0.75 s stores 0.75 s a micro-batch; the step is 2 x 0.75 + 0.25 s."""
    res, _ = world()[0]["replicas"]
    assert {n: res.detail["measured"][n]["fwd_bwd_s"] for n in ("1", "2")} == {"1": 0.75, "2": 0.75}
    assert res.detail["per_rank_fwd_bwd_s"] == [0.5, 0.75]
    assert (_fit(res, "fwd_bwd_s"), _fit(res, "optimizer_s")) == (0.75, 0.25)
    assert res.measured_s == 2 * 0.75 + 0.25
    assert res.measured_memory == _fit(res, "peak_bytes")


@shared_world("tune_candidate_values")
def test_a_pipeline_step_is_composed_from_the_slowest_ranks_stage_sync_and_sends():
    """pp 2, 4 micro-batches: one stage runs one micro-batch; (4 + 2 - 1) x (0.75 + 0.125) + 0.5 + 0.25 s, rank 1's
    sends and sync."""
    res, ran = world()[0]["pipeline"]
    d = res.detail
    assert ran == [1] and (d["micro_batches"], d["micro_batches_run"]) == (4, 1)
    assert d["stage_sends_s"] == max(SENDS) and _fit(res, "sync_s") == max(SYNC)
    assert res.measured_s == (4 + 2 - 1) * (0.75 + 0.125) + 0.5 + 0.25
    peak, static = _fit(res, "peak_bytes"), _fit(res, "static_bytes")
    assert res.measured_memory == peak + (2 - 1) * (peak - static)  # one more micro-batch in flight on stage 0


@shared_world("tune_candidate_values")
def test_a_step_counts_its_gradients_sync_once_with_or_without_a_pipeline():
    """A sync of 1 s, nothing else timed: the step is 1 s whether it runs its micro-batches or composes a stage's."""
    assert world()[0]["sync"] == {"ring2": 1.0, "pp2": 1.0}


# ---------------------------------------------------------------- pieces without a world

def test_the_stage_sends_carry_a_sequence_ranks_tokens_over_tp(monkeypatch):
    """pp 2 x tp 2, 256 tokens: each way 1 x 128 x 64 elements (what the pipeline is priced with), to the other stage."""
    sent = []

    def batch_isend_irecv(ops):
        sent.extend(ops)
        return []  # nothing to wait for

    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    monkeypatch.setattr(dist, "P2POp", lambda op, tensor, peer: (op, tuple(tensor.shape), peer))
    monkeypatch.setattr(dist, "batch_isend_irecv", batch_isend_irecv)
    plan = Plan(algorithm="ring", degrees={"pp": 2, "tp": 2})
    stage_round_trip(plan, MODEL, Workload(seq_len=256), device=torch.device("cpu"), dtype=torch.float32)()
    other = [r for r in plan.layout().group_of(("pp",), 0) if r != 0]
    assert [(shape, peer) for _, shape, peer in sent] == [((1, 128, 64), other[0])] * 4
    assert [op for op, _, _ in sent] == [dist.isend, dist.irecv] * 2


def test_a_tracked_steps_peak_leaves_out_what_the_step_keeps():
    """A step that keeps a 256 KiB cache and frees a 64 KiB temporary peaks 64 KiB over the bytes it was given."""
    weights = torch.nn.Linear(64, 64, bias=False)
    inputs, targets = torch.zeros(4, 64), torch.zeros(4, dtype=torch.long)
    par = SimpleNamespace(module=weights, optimizer=torch.optim.SGD(weights.parameters(), lr=0.1))
    bench = Bench(par=par, data=[(inputs, targets)], attend=None, micro_batches=1, micro_batches_run=1, notes={})
    kept = []

    def step():
        kept.append(torch.empty(1 << 16))  # 256 KiB, made on a first call and kept
        temporary = torch.empty(1 << 14)  # 64 KiB, freed within the step
        del temporary

    static, peak = tracked_step(bench, step)
    assert static == 64 * 64 * 4 + 4 * 64 * 4 + 4 * 8
    assert peak == static + (1 << 14) * 4


def _scripted_clock(monkeypatch, durations):
    """candidate's perf_counter as a clock that moves only when a timed run ends, by the next of ``durations``."""
    now, left = [0.0], list(durations)

    def run():
        now[0] += left.pop(0)

    monkeypatch.setattr(candidate, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    monkeypatch.setattr(dist, "barrier", lambda: None)
    return run, left


def test_the_masked_attention_median_leaves_out_its_warm_up(monkeypatch):
    """Runs of 8 s (the warm-up), 1 s and 3 s: the attention under a window reads 2 s."""
    run, left = _scripted_clock(monkeypatch, [8.0, 1.0, 3.0])

    def attend(ctx, causal, cu, win, q, k, v):
        run()
        return q * 1.0

    monkeypatch.setattr(candidate, "_attend", attend)
    ctx = SimpleNamespace(shard=lambda t, dim, cu_seqlens, window: t)
    got = masked_attention(Plan(algorithm="ring", degrees={"ring": 1}), MODEL, Workload(seq_len=64, window=16), ctx,
                           iters=2, device=torch.device("cpu"), dtype=torch.float32)
    assert got == 2.0 and left == []


def test_the_stage_sends_median_leaves_out_its_warm_up(monkeypatch):
    """Round trips of 8 s (the warm-up), 1 s and 3 s: the sends read 2 s."""
    run, left = _scripted_clock(monkeypatch, [8.0, 1.0, 3.0])

    def round_trip():
        t0 = candidate.time.perf_counter()
        run()
        return candidate.time.perf_counter() - t0

    monkeypatch.setattr(candidate, "stage_round_trip", lambda *a, **k: round_trip)
    got = stage_sends(PIPELINE, MODEL, BATCH, iters=2, device=torch.device("cpu"), dtype=torch.float32)
    assert got == 2.0 and left == []
