"""`sp-plan tune --max-minutes` bounds the whole tune: the kernel sweep planned from the time left, candidates that
do not fit skipped, exit 2 only where not one candidate fits. Driven by an injected clock, never by wall time."""
from __future__ import annotations

import os
import time

import pytest

from sp_plan.planner.model import Workload
from sp_plan.planner.params import Params
from sp_plan.profiles import load_cluster, load_model
from sp_plan.profiles.tune.readings import fits_of
from sp_plan.profiles.store import Store
from sp_plan.profiles.tune.settings import SETTINGS
from sp_plan.profiles.tune.budget import Budget, candidate_seconds, kernel_budget, learned_ratio, scaled
from sp_plan.profiles.tune.kernels import kernel_priority, plan_shapes, sweep_groups
from sp_plan.profiles.tune.run import TuneOptions, budget_check, candidate_pool
from harness import netns
from harness.worlds import run_world

TUNE = ["-m", "sp_plan.cli.app", "tune", "--cluster", "cpu-local", "--model", "tiny-llama", "--seq-len", "512",
        "--link-sizes", "16K", "--iters", "2", "--candidate-timeout", "120"]


class Clock:
    """A clock the test moves: real seconds since it was made plus the seconds ``advance`` added."""

    def __init__(self) -> None:
        self.t0, self.extra = time.monotonic(), 0.0

    def __call__(self) -> float:
        return time.monotonic() - self.t0 + self.extra

    def advance(self, seconds: float) -> None:
        self.extra += seconds


class FakeClock(Clock):
    """A clock only the test moves: a tune on it reads the same times however loaded the host is."""

    def __call__(self) -> float:
        return self.extra


def test_budget_reads_its_clock():
    clock = FakeClock()
    b = Budget(100.0, clock)
    clock.advance(60)
    assert b.elapsed() == 60 and b.left() == 40 and not b.spent()
    clock.advance(50)
    assert b.left() == 0 and b.spent()


def test_candidate_estimates_scale_by_what_measured_ones_took():
    # stacks of 1 and 2 blocks priced 1 s and 2 s a run: warm-up 1 + 3 timed + 1 memory step, then the memory step as
    # the warm-up + 3 timed: 13 s and a start
    assert candidate_seconds([1.0, 2.0], 1, 3) == pytest.approx(SETTINGS.candidate_overhead_s + 13.0)
    first = SETTINGS.candidate_overhead_s + 10.0
    ratio = learned_ratio([SETTINGS.candidate_overhead_s + 30.0], [first])
    assert ratio == pytest.approx(3.0) and scaled(first, ratio) == pytest.approx(SETTINGS.candidate_overhead_s + 30.0)
    assert learned_ratio([], []) is None and scaled(first, None) == first
    o = SETTINGS.candidate_overhead_s
    assert learned_ratio([o + 20, o + 30, o + 200], [o + 10] * 3) == pytest.approx(3.0)  # the median, not the mean
    assert learned_ratio([o + 20, o + 30], [o / 2, o + 10]) == pytest.approx(3.0)  # an estimate under the overhead
    assert learned_ratio([o + 0.5], [o + 10]) == pytest.approx(0.1)  # at least a tenth


def test_kernel_budget_leaves_the_candidates_their_time():
    assert kernel_budget(1000.0, 100.0) == pytest.approx(300.0)  # the share
    assert kernel_budget(1000.0, 900.0) == pytest.approx(100.0)  # what the candidates leave
    assert kernel_budget(10.0, 900.0) == SETTINGS.kernel_min_s  # never below the least sweep


def test_budget_check_refuses_only_when_not_one_candidate_fits():
    opts = TuneOptions(budget=3, max_minutes=1)
    err, note = budget_check([20.0, 30.0, 40.0], 20.0, opts)  # 20 s + the least kernel sweep > 20 s
    assert note is None and err[0].startswith("1 minute(s) cannot measure one candidate") and "--max-minutes" in err[1]
    err, note = budget_check([20.0, 30.0, 40.0], 80.0, opts)
    assert err is None and "fits --budget 2" in note and "--budget 3" in note and "trimmed" in note
    assert budget_check([10.0, 10.0, 10.0], 1000.0, opts) == (None, None)


def test_the_sweep_times_what_the_likeliest_candidates_run_first():
    cluster, model, work = load_cluster("cpu-local"), load_model("tiny-llama"), Workload(seq_len=512)
    pool = candidate_pool(cluster, model, work, Params(), 6)
    order = kernel_priority(pool, model, work)
    assert order[:len(plan_shapes(pool[0], model, work))] == plan_shapes(pool[0], model, work)
    assert len(order) == len(set(order))
    groups = sweep_groups([], [], [256, 128], order)
    assert groups[0] == ("attention", *order[0]) and groups[1:3] == [("matmul", 256), ("matmul", 128)]
    assert [g[1:] for g in groups[3:]] == order[1:]


def test_budgeted_windows_shrink_to_fit():
    from sp_plan.profiles.tune.kernels import shared_windows

    _, full = shared_windows([0.1, 0.2], calls=8, least=0.0)
    _, fit = shared_windows([0.1, 0.2], calls=8, least=0.0, total_s=1.25)
    _, least = shared_windows([0.1, 0.2], calls=8, least=0.0, total_s=0.0)
    assert full == pytest.approx([0.8, 1.6]) and fit == pytest.approx([0.4, 0.8])
    assert least == pytest.approx([0.1 * SETTINGS.window_min_calls, 0.2 * SETTINGS.window_min_calls])


#: seconds the test's clock says each kernel's first call and each candidate take; a candidate takes most of what the
#: sweep leaves, so that no other fits after it even where the pool's estimates put it at a small share of the first
#: (a pipeline's, which runs its stage's micro-batch twice a step, against one without)
FIRST_CALL_S = 15.0
CANDIDATE_S = 330.0


def _budget_rank(rank, world, url):
    from sp_plan.profiles.tune import kernels, measure, run

    clock = FakeClock()
    first, real = kernels._first_call, measure.run_candidate
    kernels._first_call = lambda fn, dev: (clock.advance(FIRST_CALL_S), first(fn, dev))[1]
    measure.run_candidate = lambda *a, **k: (clock.advance(CANDIDATE_S), real(*a, **k))[1]
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      GROUP_RANK="0")
    cluster, model, work = load_cluster("cpu-local"), load_model("tiny-llama"), Workload(seq_len=512)
    opts = TuneOptions(budget=4, max_minutes=10, candidate_timeout=120, iters=2, link_sizes=[16384], clock=clock)
    ticks: list = []
    rep = run.tune(cluster, model, work, Store(url) if rank == 0 else None, opts,
                   lambda *a: ticks.append(a))
    order = kernels.kernel_priority(candidate_pool(cluster, model, work, Params(), opts.pool), model, work)
    return rep, order, sorted({t[0] for t in ticks})


def test_a_tune_whose_sweep_and_candidates_would_overrun_keeps_to_its_minutes(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    out = run_world(_budget_rank, 4, url, timeout=900)
    rep, order, steps = out[0]
    st = Store(url)
    (run_,) = st.runs()
    saved = st.steps(run_["id"])
    (first,) = st.list_profiles()[0].candidates
    # a reading whose stacks made no step (CPU noise) is read again where the time left allows: only then
    assert [s for s in steps if s != "reread"] == ["candidates", "kernels", "links", "rounds"]
    assert "reread" not in steps or fits_of(first)[0][0], steps
    # the sweep: 10 minutes less the finish's 10 s, 30 % of them for kernels; each group's 4 first calls take 60 s
    # by this clock: the best candidate's largest block first, then each group only where its forecast (the groups
    # prepared so far, by FLOPs) and its least timing fit what is left; the rest left out and said
    swept = saved["kernels"][1]
    timed = {(s["size"], s["heads"]) for s in swept["samples"] if s["kind"].startswith("attention") and not s["alone"]}
    left_out = [tuple(g) for g in swept["skipped"]]
    assert order[0] in timed and left_out
    assert {("attention", *o) for o in order} <= {("attention", *t) for t in timed} | set(left_out)
    share = kernel_budget(600.0 - SETTINGS.finish_s, 0.0)
    groups_prepared = len(timed) + len({s["size"] for s in swept["samples"] if s["kind"] == "matmul"})
    assert swept["seconds"] >= groups_prepared * 4 * FIRST_CALL_S and groups_prepared * 4 * FIRST_CALL_S <= share + 60
    assert any("kernel sweep trimmed" in n for n in rep.budget_notes)
    # the first candidate ran (330 s by this clock); the rest no longer fit: skipped, said
    (prof,) = st.list_profiles()
    assert len(prof.candidates) == 1 and prof.candidates[0].status == "ok" and prof.id == rep.profile.id
    assert rep.skipped and all("skipped: estimated" in s and "--max-minutes 10" in s for s in rep.skipped), \
        (rep.stop_reason, rep.budget_notes, [(c.summary, c.detail.get("wall_s"), c.detail.get("estimate_s")) for c in prof.candidates])
    assert prof.measurements["skipped"] == rep.skipped
    assert "fits the time left" in rep.stop_reason and rep.budget_notes[-1].startswith("spent ")
    minutes, seconds = rep.budget_notes[-1].split()[1].split(":")  # spent m:ss of --max-minutes 10
    assert 60 * int(minutes) + int(seconds) <= 600
    assert any(k.startswith("skip:candidate:") and v[0] == "skipped" for k, v in saved.items())
    assert all(o[0].profile.id == prof.id for o in out)


def test_a_tune_that_cannot_fit_one_candidate_exits_2_before_measuring(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    res = netns.launch([*TUNE, "--max-minutes", "0.05", "--store", url], 4, 4, tmp_path, timeout=180)
    assert all(code == 2 for code, _ in res), res
    lines = [ln for ln in res[0][1].splitlines() if ln.strip()]
    assert len(lines) == 1 and "--max-minutes" in lines[0] and "cannot measure one candidate" in lines[0], lines
    st = Store(url)
    assert st.list_profiles() == [] and not any(st.steps(r["id"]) for r in st.runs())


def test_the_sweep_forecasts_each_group_and_leaves_out_only_what_does_not_fit(monkeypatch):
    """One process: each group's preparation costs 100 s a 256-token block's FLOPs by the test's clock; 150 s of
    budget prepare the 256-token block (100 s), leave out the 128-token one (100 + 3 x 25 s forecast: preparing and
    its least timing, a median of 1 after one call) and prepare the 64-token one after it (100 + 3 x 6.25 s)."""
    import torch

    from sp_plan.planner.model import ModelSpec
    from sp_plan.profiles.tune import kernels

    model = ModelSpec(name="t", layers=2, hidden=64, heads=2, kv_heads=2, head_dim=32, vocab=0)
    clock, real = Clock(), kernels._attention_jobs
    per = 100.0 / kernels.group_flops(model, ("attention", 256, 2), True)

    def jobs(model_, n, h, *a, **k):
        clock.advance(per * kernels.group_flops(model_, ("attention", n, h), True))
        return real(model_, n, h, *a, **k)
    monkeypatch.setattr(kernels, "_attention_jobs", jobs)
    skipped, ticks = [], []
    got = kernels.measure_kernels(model, [], [], torch.device("cpu"), torch.float32, True, repeats=1, gemm_rows=[],
                                  budget_s=150.0, shapes=[(256, 2), (128, 2), (64, 2)], clock=clock, skipped=skipped,
                                  tick=lambda *t: ticks.append(t))
    assert sorted({s.size for s in got}) == [64, 256] and skipped == [("attention", 128, 2)]
    assert ticks[:2] == [(True, "prepared 256-token blocks on 2 heads"), (True, "prepared 64-token blocks on 2 heads")]
    assert len(ticks) == 2 + len(got) and not any(t[0] for t in ticks[2:])  # then each kernel timed
