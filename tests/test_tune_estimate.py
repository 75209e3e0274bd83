"""What measuring a candidate should cost, and measuring less where readings agree: the stacks a measurement builds
priced with their fixed part, timed steps and kernel repeats that stop once their readings agree, the quickest
candidates first where a step-time fit would otherwise lack its points. Driven by faked timings, never wall time."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sp_plan.planner import ModelSpec, Plan, Workload
from sp_plan.planner.params import Params
from sp_plan.profiles import load_cluster, load_model
from sp_plan.profiles.tune import kernels, timing
from sp_plan.profiles.tune.budget import Budget, at_iters, candidate_seconds, runs_per_count
from sp_plan.profiles.tune.candidate import steady
from sp_plan.profiles.tune.choose import Choice, quickest_for_fit
from sp_plan.profiles.tune.pool import budget_check, candidate_pool, first_estimate, fit_need, predict, stack_run
from sp_plan.profiles.tune.run import TuneOptions
from sp_plan.profiles.tune.settings import SETTINGS
from harness.worlds import run_world

TINY = ModelSpec(name="tiny", layers=4, hidden=64, heads=4, kv_heads=2, vocab=128, dtype="fp32", gated_mlp=True)


@pytest.fixture(scope="module")
def bert_pool():
    cluster, model, work = load_cluster("cpu-local"), load_model("bert-large"), Workload(seq_len=4096)
    return cluster, candidate_pool(cluster, model, work, Params(), 12)


def test_a_stack_of_one_block_carries_the_whole_fixed_part_of_a_step(bert_pool):
    cluster, pool = bert_pool
    plan = next(p for p in pool if p.degrees["pp"] == 1)
    step = predict(cluster, plan, Params())[0]
    one, two = stack_run(cluster, plan, Params(), 1), stack_run(cluster, plan, Params(), 2)
    # linear in blocks, and at the model's 24 layers the step itself: embedding, head, loss, optimizer counted once
    assert stack_run(cluster, plan, Params(), 24) == pytest.approx(step, rel=1e-6)
    assert one + 23 * (two - one) == pytest.approx(step, rel=0.02)
    # the fixed part at 4k tokens of a 30522-word head is most of a one-block run, not 1/24 of the step
    assert one > 2 * step / 24
    opts = TuneOptions(budget=3, max_minutes=9)
    first, later = runs_per_count(opts.warmup, opts.iters), runs_per_count(opts.warmup, opts.iters, first=False)
    assert first_estimate(cluster, plan, Params(), opts) == pytest.approx(
        SETTINGS.candidate_overhead_s + first * one + later * two)


def test_a_pipeline_runs_one_micro_batch_of_one_stage_twice(bert_pool):
    """A pipeline stage's timed step runs its micro-batch twice: before the last of a step's, then as the last."""
    cluster, pool = bert_pool
    plan = next(p for p in pool if p.degrees["pp"] > 1)
    m = max(plan.workload.batch // (plan.degrees["dp"] * plan.micro_batch_size), 1)
    short = plan.model_copy(update={"model": plan.model.model_copy(update={"layers": plan.degrees["pp"]})})
    assert stack_run(cluster, plan, Params(), 1) == pytest.approx(
        2 * predict(cluster, short, Params())[0] / (m + plan.degrees["pp"] - 1))


def test_candidate_seconds_are_the_runs_of_each_stack_and_a_start():
    # the first stack: warm-up, 3 timed, a memory step; a later one reads its memory in its warm-up (one at least)
    assert runs_per_count(1, 3) == 5 and runs_per_count(1, 3, first=False) == 4
    assert runs_per_count(0, 3, first=False) == 4 and runs_per_count(2, 3, first=False) == 5
    assert candidate_seconds([2.0, 3.0], 1, 3, overhead_s=5.0) == pytest.approx(5.0 + 5 * 2.0 + 4 * 3.0)


def test_readings_are_steady_when_the_last_two_agree():
    assert not steady([1.0], 0.05) and not steady([1.0, 1.0], None)
    assert steady([2.0, 1.0, 1.04], 0.05) and not steady([1.0, 1.06], 0.05)


class Ticks:
    """perf_counter for timing.time_readings: each reading lasts the next of ``seconds``."""

    def __init__(self, seconds):
        self.seconds, self.now, self.started = list(seconds), 0.0, False

    def perf_counter(self):
        if self.started:
            self.now += self.seconds.pop(0)
        self.started = not self.started
        return self.now


def test_kernel_repeats_stop_once_two_readings_agree(monkeypatch):
    monkeypatch.setattr(timing, "time", Ticks([1.0, 1.3, 1.31, 9.0, 9.0]))
    got = timing.time_readings(lambda: None, torch.device("cpu"), repeats=5, warmup=0, agree_within=0.05)
    assert got == pytest.approx([1.0, 1.3, 1.31])  # the 4th and 5th repeats not run
    monkeypatch.setattr(timing, "time", Ticks([1.0, 2.0, 3.0]))
    assert len(timing.time_readings(lambda: None, torch.device("cpu"), repeats=3, warmup=0, agree_within=0.05)) == 3
    monkeypatch.setattr(timing, "time", Ticks([1.0, 1.0, 1.0]))
    assert len(timing.time_readings(lambda: None, torch.device("cpu"), repeats=3, warmup=0)) == 3


def test_two_readings_agree_within_the_share_of_the_faster_and_a_call_reads_the_median(monkeypatch):
    monkeypatch.setattr(timing, "time", Ticks([1.0, 1.02, 5.0, 5.0]))
    assert len(timing.time_readings(lambda: None, torch.device("cpu"), repeats=4, warmup=0, agree_within=0.05)) == 2
    monkeypatch.setattr(timing, "time", Ticks([1.0, 1.1, 5.0]))  # 0.1 apart: over 9.5 % of 1.0, under 9.5 % of 1.1
    assert len(timing.time_readings(lambda: None, torch.device("cpu"), repeats=3, warmup=0, agree_within=0.095)) == 3
    monkeypatch.setattr(timing, "time", Ticks([1.0, 0.05, 4.0]))
    assert timing.time_call(lambda: None, torch.device("cpu"), repeats=3, warmup=0) == pytest.approx(1.0)


def test_a_shared_window_reads_the_mean_of_its_calls(monkeypatch):
    """Calls of 0.5 s from the window's start until one passes its stop: 4 calls in 2 s, 0.5 s each."""
    clock = SimpleNamespace(now=10.0)
    fake = SimpleNamespace(time=lambda: clock.now, perf_counter=lambda: clock.now, sleep=lambda s: None)
    monkeypatch.setattr(timing, "time", fake)

    def call():
        clock.now += 0.5

    assert timing.time_window(call, torch.device("cpu"), 10.0, 12.0) == pytest.approx(0.5)


def test_the_kernel_sweep_says_which_repeats_it_spared(monkeypatch):
    monkeypatch.setenv("SP_PLAN_ATTN_BACKEND", "cpu_flash")
    fake = iter([[1.0, 1.01], [2.0, 3.0, 2.5], [1.0, 1.02]] + [[0.5, 0.6, 0.7]] * 20)
    monkeypatch.setattr(kernels, "time_readings", lambda fn, dev, repeats, agree_within=None: next(fake))
    spared: list = []
    samples = kernels.measure_kernels(TINY, [64], [2], torch.device("cpu"), torch.float32, causal=True, repeats=3,
                                      gemm_rows=[], spared=spared)
    assert [s.seconds for s in samples[:3]] == pytest.approx([1.005, 2.5, 1.01])  # the medians of what was read
    assert [n for _, n in spared] == [1, 1] and all("attention" in k for k, _ in spared)
    said = kernels.spared_said(spared, 3, 0.05)
    assert said.startswith("2 kernel timing(s) of 2 kernel(s) not repeated") and "5%" in said
    assert kernels.spared_said([], 3, 0.05) is None


def test_a_shared_window_holds_no_more_calls_than_its_span():
    spared: list = []
    _, lengths = kernels.shared_windows([0.1, 0.5, 3.0], calls=8, least=0.0, span=2.0, spared=spared)
    assert lengths == pytest.approx([0.8, 2.0, 3.0]) and spared == [(1, 4), (2, 7)]  # 8, 4 and 1 call(s)
    _, lengths = kernels.shared_windows([0.1, 0.5, 3.0], calls=8, least=0.0, span=2.0, total_s=2.0)
    assert lengths == pytest.approx([0.1, 0.5, 3.0])  # the budget shrinks them further, to the fewest
    assert kernels.shared_windows([0.1], calls=8, least=0.0)[1] == pytest.approx([0.8])  # no span: every call
    said = kernels.spanned_said(spared, 8, 2.0)
    assert said.startswith("11 window call(s) of 2 kernel(s) not run") and "over 0.25 s each" in said


def _scripted(rank, world, readings, agree):
    """One candidate measured with every step's forward-backward seconds scripted per rank."""
    from sp_plan.profiles.tune import candidate

    script = iter(readings[rank])
    candidate.train_step = lambda bench, model, device, fault=None: (next(script), 0.001)
    res = candidate.measure(Plan(algorithm="ring", degrees={"ring": world}), TINY, Workload(seq_len=256),
                            layers=2, warmup=1, iters=3, agree_within=agree)
    return res["detail"]["steps_timed"], res["detail"]["measured"]


def test_a_candidates_timed_steps_stop_when_every_rank_reads_them_steady():
    # 1 block: warm-up, timed steps, one memory step; 2 blocks: the memory step as the warm-up (not counted for the
    # agreement: the tracker slows it), then timed steps. 1 block: the warm-up and the first timed step agree on rank 0
    # but not on rank 1 until its second; 2 blocks: never on rank 0, so every rank times all three
    readings = {0: [1.00, 1.01, 1.02, 1.0,
                    1.5, 1.5, 1.8, 1.7],
                1: [1.00, 1.30, 1.31, 1.0,
                    2.0, 2.0, 2.0, 2.0]}
    timed, measured = run_world(_scripted, 2, readings, 0.05, timeout=120)[0]
    assert timed == {"1": 2, "2": 3}
    assert measured["1"]["fwd_bwd_s"] == pytest.approx(max(1.015, 1.305))  # the slowest rank's median
    assert measured["2"]["fwd_bwd_s"] == pytest.approx(2.0)
    every = {0: [1.0] * 10, 1: [1.0] * 10}
    assert run_world(_scripted, 2, every, None, timeout=120)[0][0] == {"1": 3, "2": 3}


def test_the_quickest_candidates_go_first_only_when_the_fit_would_lack_them():
    est, done = [100.0, 40.0, 200.0, 50.0], [False] * 4
    assert quickest_for_fit(2, est, done, need=3, left=400.0) == 2  # 200 + 40 + 50 fits: the choice stands
    assert quickest_for_fit(2, est, done, need=3, left=200.0) == 1  # only 40 + 50 + 100 fit
    assert quickest_for_fit(2, est, done, need=3, left=150.0) == 1  # not even the quickest fit: still the best chance
    assert quickest_for_fit(2, est, [False, True, False, False], need=2, left=160.0) == 3  # 50 + 100
    assert quickest_for_fit(2, est, done, need=0, left=10.0) == 2


def _run(budget_s: float, left_s: float, measured: int = 0, learned: bool = True):
    """What for_the_fit and fit_iters read of a tune: ``measured`` candidates ok (with their wall seconds where
    ``learned``), ``left_s`` of ``budget_s`` left."""
    clock = SimpleNamespace(t=budget_s - left_s)
    ok = SimpleNamespace(status="ok", detail={"wall_s": 100.0} if learned else {})
    return SimpleNamespace(opts=TuneOptions(budget=3, max_minutes=budget_s / 60),
                           budget=Budget(budget_s, lambda: clock.t, 0.0), measured={f"m{i}": ok for i in range(measured)},
                           notes=[])


def test_the_choice_makes_room_for_the_fit():
    from sp_plan.profiles.tune.steps import for_the_fit

    est, done = [150.0, 150.0, 60.0, 70.0], [True, False, False, False]
    r = _run(540.0, 200.0, measured=1)
    got = for_the_fit(r, Choice(1, 0.9, "the model's best tp layout"), est, done, ok=1)
    assert got.index == 2 and "quickest to measure" in got.why and "needs 2 more" in got.why
    # 60 + 70 s do not fit 100 s either: the quickest first are still the fit's best chance
    assert for_the_fit(_run(540.0, 100.0, measured=1), Choice(1, 0.9, "x"), est, done, ok=1).index == 2
    assert for_the_fit(_run(540.0, 400.0, measured=1), Choice(1, 0.9, "x"), est, done, ok=1).index == 1


def test_fewer_timed_steps_where_the_fit_would_otherwise_lack_its_candidates():
    from sp_plan.profiles.tune.steps import fit_iters

    # --iters 3 after 1 warm-up: 5 and 4 steps at the two block counts, 100 s of them and a 5 s start; the fit lacks 2
    over = SETTINGS.candidate_overhead_s
    full, done = [over + 100.0, over + 100.0, over + 200.0, over + 100.0], [True, False, False, False]
    r = _run(540.0, 250.0, measured=1)
    iters, est = fit_iters(r, full, done, ok=1)
    assert iters == 3 and est == full and not r.notes  # 210 s fit
    r = _run(540.0, 200.0, measured=1)
    iters, est = fit_iters(r, full, done, ok=1)
    assert iters == 2 and est[1] == pytest.approx(over + 700 / 9)  # 7 of 9 steps: 166 s fit, 210 s do not
    assert r.notes == ["candidates timed at 2 of --iters 3 step(s) a block count, so that the 2 the step-time fit "
                       "still needs fit the 3:20 left"]
    r = _run(540.0, 100.0, measured=1)
    iters, est = fit_iters(r, full, done, ok=1)
    assert iters == 1 and est[1] == pytest.approx(over + 500 / 9)  # not even 1 step each fits: 1 step, and said
    (note,) = r.notes
    assert note.startswith("the step-time fit needs 2 more candidate(s)") and "2:01 together at 1 timed step" in note
    assert "--max-minutes 9.4 would fit them" in note  # 540 s + the 21 s short
    assert fit_iters(_run(540.0, 10.0, measured=3), full, done, ok=3) == (3, full)  # the fit has its 3
    # before any candidate has run, a budget that --iters does not fit times one step: the estimate may be short
    r = _run(540.0, 300.0, learned=False)  # 3 x 105 s do not fit, 3 x 83 s (2 steps) would
    iters, est = fit_iters(r, full, [False] * 4, ok=0)
    assert iters == 1 and est[0] == pytest.approx(over + 500 / 9) and "candidates timed at 1 of --iters 3" in r.notes[0]
    # --iters where three fit twice over (the first estimate's margin), not where they fit only once
    assert fit_iters(_run(540.0, 300.0, learned=False), [over + 40.0] * 4, [False] * 4, ok=0)[0] == 3
    assert fit_iters(_run(540.0, 300.0, learned=False), [over + 50.0] * 4, [False] * 4, ok=0)[0] == 1


def test_a_ratio_learned_from_a_candidate_timed_at_fewer_steps_compares_it_with_its_estimate_there(bert_pool):
    from sp_plan.planner.profile import MeasuredCandidate
    from sp_plan.profiles.tune.pool import estimates

    cluster, pool = bert_pool
    over, opts = SETTINGS.candidate_overhead_s, TuneOptions()
    assert at_iters(over + 100.0, 1, opts.warmup, opts.iters, over) == pytest.approx(over + 500 / 9)  # 5 of 9 steps
    plan = pool[0]
    first = first_estimate(cluster, plan, Params(), opts)
    there = at_iters(first, 1, opts.warmup, opts.iters, over)
    # asked for 3 steps, its readings agreed after 1 at each block count, and it took twice its estimate at 1 step:
    # the others are estimated at twice theirs
    mc = MeasuredCandidate(summary=plan.summary(), plan=plan.model_dump(mode="json"), model=plan.model.name,
                           seq_len=4096, batch=1, status="ok", measured_s=1.0,
                           detail={"wall_s": over + 2 * (there - over), "iters": 3, "steps_timed": {"1": 1, "2": 1}})
    got = estimates(cluster, pool, Params(), opts, {plan.summary(): mc})
    assert got[pool[1].summary()] == pytest.approx(over + 2 * (first_estimate(cluster, pool[1], Params(), opts) - over))


def test_the_budget_check_names_the_minutes_the_fit_needs():
    opts = TuneOptions(budget=3, max_minutes=9)
    err, note = budget_check([200.0, 150.0, 210.0, 160.0], 400.0, opts)
    assert err is None and "running a trimmed sweep" in note
    # the fit's 3 quickest: 150 + 160 + 200 s, with the kernel sweep's share: 729 s, 329 s over the 400 s left
    assert "quickest candidates, estimated 12:09" in note and "--max-minutes 14.5" in note
    assert fit_need([200.0, 150.0, 210.0, 160.0], opts) == pytest.approx(510.0)


#: seconds by the test's clock a candidate takes at --iters 2, and is estimated at: pipeline layouts cost 5x the others
CHEAP_S, DEAR_S = 40.0, 200.0


def _cost(plan) -> float:
    return DEAR_S if plan.degrees["pp"] > 1 else CHEAP_S


def _fit_rank(rank, world, url, minutes):
    import os

    from sp_plan.profiles.store import Store
    from sp_plan.profiles.tune import measure, run, steps

    clock = SimpleNamespace(t=0.0)
    real = measure.run_candidate

    def candidate(plan, model, work, cluster, opts, *a, **k):  # fewer timed steps take less, as estimated
        clock.t += at_iters(_cost(plan), opts.iters, opts.warmup, 2, opts.settings.candidate_overhead_s)
        return real(plan, model, work, cluster, opts, *a, **k)
    measure.run_candidate = candidate
    steps.estimates = lambda cluster, pool, params, opts, measured: {p.summary(): _cost(p) for p in pool}
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      GROUP_RANK="0")
    opts = TuneOptions(budget=3, max_minutes=minutes, iters=2, link_sizes=[16384], candidate_timeout=120,
                       confirm=0, reread=0, clock=lambda: clock.t)
    rep = run.tune(load_cluster("cpu-local"), load_model("tiny-llama"), Workload(seq_len=512),
                   Store(url) if rank == 0 else None, opts)
    return rep, clock.t


def test_a_tight_budget_measures_the_quickest_candidates_so_that_the_fit_gets_its_three(tmp_path):
    """160 s for candidates by the test's clock, where a pipeline layout (the model's best, or the family it explores
    first) takes 200 s and any other 40 s at --iters 2: a pipeline and two others would not fit, three others do, so
    the choice measures those and the fit gets its three; the first at 1 timed step (three at --iters with the first
    estimate's margin would not fit), the others at --iters once it showed its estimate held."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    minutes = (160.0 + SETTINGS.finish_s) / 60
    rep, spent = run_world(_fit_rank, 4, url, minutes, timeout=900)[0]
    ok = [c for c in rep.profile.candidates if c.status == "ok"]
    assert len(ok) == 3 and all(c.plan["degrees"]["pp"] == 1 for c in ok), [c.summary for c in ok]
    over = SETTINGS.candidate_overhead_s
    assert [c.detail["iters"] for c in ok] == [1, 2, 2], [c.detail for c in ok]
    assert spent == pytest.approx(at_iters(CHEAP_S, 1, 1, 2, over) + 2 * CHEAP_S) and rep.profile.id
    assert any("compute efficiency" in f for f in rep.profile.fitted), rep.profile.fitted
    assert not any(n.startswith("the step-time fit needs") for n in rep.budget_notes), rep.budget_notes
