"""tune's round probe (profiles/tune/rounds.py): the fixed cost of a ring round measured, and read back through the
model."""
from types import SimpleNamespace

import pytest
import torch

from sp_plan.planner import Estimator, ModelSpec, Workload
from sp_plan.planner.params import Params
from sp_plan.profiles import load_cluster
from sp_plan.profiles.tune import rounds
from sp_plan.profiles.tune.rounds import LAYERS, TOKENS_PER_RANK, probe_plan, round_overhead, time_rounds
from sp_plan.runtime.variants import ring
from harness.worlds import run_world

MODEL = ModelSpec(name="tiny", layers=4, hidden=64, heads=4, kv_heads=2, vocab=128, dtype="fp32")


def _probe_seconds(cluster, params):
    """What the probe would measure if the model were exact: LAYERS x one layer's attention forward + backward."""
    one = MODEL.model_copy(update={"layers": 1})
    work = Workload(seq_len=TOKENS_PER_RANK * cluster.world_size, causal=True)
    t, _ = Estimator(cluster, one, work, params=params).attention_time(probe_plan(cluster.world_size), backward=True)
    return LAYERS * t


@pytest.mark.parametrize("truth_ms", [0.0, 0.4, 2.5])
def test_round_overhead_reads_back_the_overhead_a_probe_was_priced_with(truth_ms):
    cl = load_cluster("cpu-local")
    base = Params(solo_speedup=2.0)
    seconds = _probe_seconds(cl, base.model_copy(update={"round_overhead_s": truth_ms * 1e-3}))
    assert round_overhead(cl, MODEL, base, seconds) == pytest.approx(truth_ms * 1e-3, abs=1e-9)


def test_round_overhead_by_hand_on_a_ring_of_four():
    # zigzag ring of 4, training: 4 rounds forward and 4 backward, one block call each on every rank (balanced:
    # no share); past the point where the blocks outlast the rounds' tiny messages, one more millisecond a call
    # adds 8 ms a layer
    cl = load_cluster("cpu-local")
    t1 = _probe_seconds(cl, Params(round_overhead_s=1e-3))
    assert _probe_seconds(cl, Params(round_overhead_s=2e-3)) - t1 == pytest.approx(LAYERS * 8e-3)
    assert round_overhead(cl, MODEL, Params(), t1 + LAYERS * 8 * 2e-3) == pytest.approx(3e-3)
    t0 = _probe_seconds(cl, Params())
    assert round_overhead(cl, MODEL, Params(), t0 / 2) == 0.0  # faster than the blocks alone: no negative cost


def test_with_round_probe_says_where_the_model_alone_prices_the_probe_above_its_reading():
    from sp_plan.profiles.tune.measure import with_round_probe

    cl = load_cluster("cpu-local")
    t0 = _probe_seconds(cl, Params())
    for seconds, zero in ((t0 / 2, True), (t0 + LAYERS * 8e-3, False)):
        said = []
        got, hold = with_round_probe(cl, MODEL, Params(), seconds, said)
        assert hold == {"round_overhead_s"} and (got.round_overhead_s == 0) == zero
        assert (said[0].endswith("alone price the probe at or above that")) == zero, said


def test_no_probe_reading_without_a_measurement_or_a_ring():
    from sp_plan.profiles import preset_cluster

    assert round_overhead(load_cluster("cpu-local"), MODEL, Params(), 0.0) is None
    one = preset_cluster("cpu-local", devices_per_node=1)
    assert one.world_size == 1 and round_overhead(one, MODEL, Params(), 1.0) is None


def _timed(rank, world):
    torch.set_num_threads(1)
    return time_rounds(MODEL, torch.device("cpu"), torch.float32, iters=2, warmup=1)


def test_time_rounds_agrees_on_the_slowest_rank():
    a, b = run_world(_timed, 2, timeout=120)
    assert a == b > 0  # every rank returns the slowest rank's median


@pytest.mark.parametrize("overhead_s", [2.0, 9.5])
def test_a_probe_of_seconds_a_call_still_reads_back_its_overhead(overhead_s):
    """A probe slowed to seconds a round (a stalled host) reads back its overhead, up to the most a profile holds."""
    cl = load_cluster("cpu-local")
    got = round_overhead(cl, MODEL, Params(), _probe_seconds(cl, Params(round_overhead_s=overhead_s)))
    assert got == pytest.approx(overhead_s)


def test_a_probe_slower_than_a_profile_can_hold_gives_no_reading():
    cl = load_cluster("cpu-local")
    slow = 2 * _probe_seconds(cl, Params(round_overhead_s=10.0))
    assert round_overhead(cl, MODEL, Params(), slow) is None


def _clock(durations):
    """perf_counter for runs of these durations: each run reads it once at its start and once at its end."""
    ticks, now = [], 0.0
    for d in durations:
        ticks += [now, now + d]
        now += d + 1.0
    return iter(ticks).__next__


def test_time_rounds_is_the_median_of_the_timed_runs_after_warmup(monkeypatch):
    """Two slow warm-up runs (100 s: first calls) then runs of 1, 1, 1, 2, 2 s: the reading is 1 s. No world: the
    collectives are a world of one rank's, the Ring attention and the clock scripted."""
    one_rank = SimpleNamespace(get_rank=lambda: 0, barrier=lambda: None, all_reduce=lambda t, op=None: None,
                               ReduceOp=SimpleNamespace(MAX="max"))
    monkeypatch.setattr(rounds, "dist", one_rank)
    monkeypatch.setattr(rounds, "time", SimpleNamespace(perf_counter=_clock([100, 100, 1, 1, 1, 2, 2])))
    monkeypatch.setattr(ring, "ring_attention", lambda q, k, v, **kw: q * 1.0)
    assert time_rounds(MODEL, torch.device("cpu"), torch.float32, iters=5, warmup=2) == 1.0
