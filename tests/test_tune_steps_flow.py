"""How `sp-plan tune` goes through its steps (profiles/tune/steps.py), on one rank without a world: which candidates
it measures and in what order, at how many timed steps, when it stops, what it reads again in the reread and confirm
steps, what it saves for the next tune, and what it skips once --max-minutes is spent. The model's predictions and
estimates, the fit and the measurements are scripted, so each test states a tune's situation and what it does."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sp_plan.planner.calibration import FitResult
from sp_plan.planner.errors import PlanError
from sp_plan.planner.model import Workload
from sp_plan.planner.params import Params
from sp_plan.planner.plan import Plan
from sp_plan.planner.profile import MeasuredCandidate
from sp_plan.profiles import load_cluster, load_model
from sp_plan.profiles.tune import measure
from sp_plan.profiles.tune import steps as S
from sp_plan.profiles.tune.budget import Budget
from sp_plan.profiles.tune.run import TuneOptions
from test_tune_resume_steps import OneRank, Store as CheckpointStore

CLUSTER, MODEL, WORK = load_cluster("cpu-local", 1), load_model("tiny-llama"), Workload(seq_len=256, batch=1)
#: the layouts a scripted tune draws from, by short name: two all-to-all layouts, a ring one, a data-parallel one
LAYOUTS = {"u4": Plan(algorithm="ulysses", degrees={"ulysses": 4}),
           "u2dp2": Plan(algorithm="ulysses", degrees={"ulysses": 2, "dp": 2}),
           "r4": Plan(algorithm="ring", degrees={"ring": 4}),
           "dp4": Plan(algorithm="ulysses", degrees={"dp": 4})}
NAME = {p.summary(): short for short, p in LAYOUTS.items()}
WALL_S = 1.0  # seconds each scripted measurement takes on the tune's clock


class Store(CheckpointStore):
    """The store's checkpoint writes and saved link fits, kept in order."""

    def __init__(self):
        super().__init__()
        self.link_fits = []

    def save_link_fit(self, fingerprint, links):
        self.link_fits.append((fingerprint, links))


class Script:
    """A tune whose model, fit and measurements are scripted: each layout's predicted step (``predicted``, the pool
    in its order) and estimated measuring seconds, what measuring it reads next (seconds, or a failure's status), and
    the fit's leave-one-out error; the fit predicts each candidate at its ``predicted`` step."""

    def __init__(self, monkeypatch, predicted: dict, estimate: dict | None = None, reads: dict | None = None,
                 loo_error: float | None = None, limit: float = 600.0, **options):
        self.predicted, self.estimate = predicted, estimate or dict.fromkeys(predicted, 10.0)
        self.reads = {name: list(r) for name, r in (reads or {}).items()}
        self.loo_error, self.now, self.ran, self.iters = loo_error, 0.0, [], []
        monkeypatch.setattr(S, "predict", lambda cluster, plan, params: (self.predicted[NAME[plan.summary()]], 0.0))
        monkeypatch.setattr(S, "estimates", lambda cluster, pool, params, opts, measured:
                            {p.summary(): self.estimate[NAME[p.summary()]] for p in pool})
        monkeypatch.setattr(S, "fit", self.fit)
        monkeypatch.setattr(measure, "run_candidate", self.run_candidate)
        pool = [LAYOUTS[name] for name in predicted]
        self.cal = S.Calibration(Params(), frozenset(), [], pool, {p.summary(): p for p in pool})
        self.run = OneRank(CLUSTER, MODEL, WORK, Store(), TuneOptions(**options), lambda *a: None,
                           Budget(limit, clock=lambda: self.now, start=0.0), 0, 1)

    def measured(self, name: str, seconds: float | None = None, status: str = "ok", clamped: bool = False) -> None:
        """``name`` measured already (by an earlier round of the tune), at ``seconds`` or failed."""
        detail = {"wall_s": WALL_S, "iters": 3, "fit": {"fwd_bwd_s": {"clamped": clamped, "per_layer": None}}}
        self.run.measured[LAYOUTS[name].summary()] = self._result(name, seconds, status, detail)

    def fit(self, cluster, base, ok, hold) -> FitResult:
        predicted = [self.predicted[NAME[m.summary]] for m in ok]
        return FitResult(params=base, fitted=[], loo_error_before=None, loo_error_after=self.loo_error,
                         candidates=[m.model_copy(update={"predicted_after_s": p}) for m, p in zip(ok, predicted)],
                         loo_times=predicted)

    def run_candidate(self, plan, model, work, cluster, opts, fault=None, beat=None, backends=None):
        name = NAME[plan.summary()]
        assert self.reads.get(name), f"{name} measured beyond its script"
        self.ran.append(name)
        self.iters.append(opts.iters)
        self.now += WALL_S
        got = self.reads[name].pop(0)
        if isinstance(got, str):
            return self._result(name, None, got, {})
        return self._result(name, got, "ok", {"iters": opts.iters})

    def fitted(self) -> dict:
        """The step the latest fit was fitted to, by layout."""
        return {NAME[c.summary]: c.measured_s for c in self.cal.result.candidates}

    @staticmethod
    def _result(name: str, seconds: float | None, status: str, detail: dict) -> MeasuredCandidate:
        return MeasuredCandidate(summary=LAYOUTS[name].summary(), plan=LAYOUTS[name].model_dump(mode="json"),
                                 status=status, measured_s=seconds, reason="" if status == "ok" else "scripted",
                                 detail=detail)


def test_the_last_candidate_of_the_budget_goes_to_the_likeliest_to_beat_the_best(monkeypatch):
    """The model's best first, then the best of a family not yet measured (calibration), but the budget's last
    candidate is the one likeliest to beat the best measured, not one more family."""
    t = Script(monkeypatch, {"u4": 1.0, "u2dp2": 1.02, "r4": 1.5, "dp4": 1.6}, budget=3,
               reads={"u4": [1.0], "r4": [1.5], "u2dp2": [1.02], "dp4": [1.6]})
    S.candidates_step(t.run, t.cal)
    assert t.ran == ["u4", "r4", "u2dp2"]
    assert t.cal.stop == "budget of 3 candidate(s) reached"


def test_a_failed_candidate_does_not_make_the_models_error_trusted(monkeypatch):
    """With two candidates timed and one failed, the fit's small leave-one-out error means nothing yet: tune keeps
    the prior uncertainty and measures a candidate the model puts 50 % behind, rather than stopping early."""
    t = Script(monkeypatch, {"u4": 1.0, "u2dp2": 1.05, "r4": 1.1, "dp4": 1.5}, loo_error=0.01, budget=4,
               reads={"dp4": [1.4]})
    t.measured("u4", 1.0)
    t.measured("u2dp2", 1.05)
    t.measured("r4", status="oom")
    S.candidates_step(t.run, t.cal)
    assert t.ran == ["dp4"]


def test_a_candidate_left_out_for_time_does_not_count_toward_the_early_stop(monkeypatch):
    """No early stop before three candidates were measured: one left out because it did not fit the time is not
    one of them, so tune measures the next candidate even where the model gives it little chance."""
    t = Script(monkeypatch, {"u4": 1.0, "u2dp2": 1.05, "r4": 0.9, "dp4": 3.0}, reads={"dp4": [3.0]})
    t.measured("u4", 1.0)
    t.measured("u2dp2", 1.05)
    t.run.skip(f"candidate:{LAYOUTS['r4'].summary()}", LAYOUTS["r4"].summary(), 900.0)
    S.candidates_step(t.run, t.cal)
    assert t.ran == ["dp4"]
    assert t.cal.stop == "every candidate in the pool was measured"


def test_the_candidates_the_fit_lacks_are_timed_shorter_failed_ones_not_counted(monkeypatch):
    """One candidate timed and one failed: the step-time fit lacks two more, and the two quickest (10 s and 50 s at
    --iters 3) fit the 55 s left only at 2 timed steps, so the next candidate runs 2."""
    t = Script(monkeypatch, {"u4": 1.0, "r4": 1.1, "u2dp2": 0.9, "dp4": 2.0},
               estimate={"u4": 10.0, "r4": 10.0, "u2dp2": 50.0, "dp4": 10.0}, limit=55.0,
               reads={"u2dp2": [0.9], "dp4": [2.0]})
    t.measured("u4", 1.0)
    t.measured("r4", status="error")
    S.candidates_step(t.run, t.cal)
    assert (t.ran[0], t.iters[0]) == ("u2dp2", 2)
    assert any(n.startswith("candidates timed at 2 of --iters 3") for n in t.run.notes)


def test_a_candidate_or_a_reading_that_takes_exactly_the_time_left_is_measured(monkeypatch):
    """The time left is there to be spent: a candidate estimated at exactly the seconds left runs, and so does a
    reading again whose first reading took exactly them."""
    t = Script(monkeypatch, {"u4": 1.0, "dp4": 1.5}, estimate={"u4": 10.0, "dp4": 40.0}, limit=40.0,
               reads={"dp4": [1.5]})
    t.measured("u4", 1.0)
    S.candidates_step(t.run, t.cal)
    assert t.ran == ["dp4"] and t.run.skipped == []
    t = Script(monkeypatch, {"u4": 1.0, "u2dp2": 1.1, "dp4": 1.5}, limit=WALL_S, reads={"u4": [1.1]})
    t.measured("u4", 2.0, clamped=True)
    S.reread_step(t.run, t.cal)
    assert t.ran == ["u4"] and t.run.skipped == []


def test_a_fit_whose_quickest_candidates_just_fit_is_not_said_to_lack_them(monkeypatch):
    """The quickest candidate the fit lacks takes exactly the 10 s left at one timed step: tune times it at one
    step and says so, not that the fit may lack it."""
    t = Script(monkeypatch, {"u4": 1.0, "dp4": 1.5}, estimate={"u4": 10.0, "dp4": 14.0}, limit=10.0,
               reads={"dp4": [1.5]})
    t.measured("u4", 1.0)
    S.candidates_step(t.run, t.cal)
    assert (t.ran, t.iters) == (["dp4"], [1])
    assert [n.split(" ")[:3] for n in t.run.notes] == [["candidates", "timed", "at"]]


def test_each_candidate_is_checkpointed_running_then_as_it_ended(monkeypatch):
    """A candidate is recorded "running" before it runs (a killed tune knows what was in flight), then "ok" or
    "failed" with its result."""
    t = Script(monkeypatch, {"u4": 1.0, "r4": 1.2}, budget=2, reads={"u4": [1.0], "r4": ["oom"]})
    S.candidates_step(t.run, t.cal)
    u4, r4 = (f"candidate:{LAYOUTS[n].summary()}" for n in ("u4", "r4"))
    assert t.run.store.writes == [(u4, "running"), (u4, "ok"), (r4, "running"), (r4, "failed")]


def test_after_a_reread_the_model_is_refitted_to_the_reading_kept(monkeypatch):
    """A reading whose stacks made no step is read again; the model the confirm step ranks by is fitted to the new
    reading, not to the one that made no step."""
    t = Script(monkeypatch, {"u4": 1.0, "u2dp2": 1.1, "dp4": 1.2}, reads={"u4": [1.1]})
    t.measured("u4", 2.0, clamped=True)
    t.measured("u2dp2", 1.0)
    t.measured("dp4", 1.2)
    t.cal.result = t.fit(CLUSTER, Params(), list(t.run.measured.values()), frozenset())  # the candidates' last fit
    S.reread_step(t.run, t.cal)
    assert t.ran == ["u4"] and t.fitted() == {"u4": 1.1, "u2dp2": 1.0, "dp4": 1.2}


def test_rereads_are_at_most_reread_the_readings_that_made_no_step_first(monkeypatch):
    """--reread bounds the reread step: of a reading whose stacks made no step and a reading far slower than the fit
    predicts, --reread 1 reads the first again only; --reread 2 both, the first first."""
    for reread, ran in ((1, ["u4"]), (2, ["u4", "dp4"])):
        t = Script(monkeypatch, {"u4": 1.0, "u2dp2": 1.0, "dp4": 1.0}, loo_error=0.05, reread=reread,
                   reads={"u4": [1.0], "dp4": [1.0]})
        t.measured("u4", 1.0, clamped=True)
        t.measured("u2dp2", 1.0)
        t.measured("dp4", 3.0)
        t.cal.result = t.fit(CLUSTER, Params(), list(t.run.measured.values()), frozenset())
        S.reread_step(t.run, t.cal)
        assert t.ran == ran


def test_confirm_reads_again_the_runners_up_within_the_spread_the_readings_showed(monkeypatch):
    """Confirm reads the best and the runners-up within 10 %; their readings spread by 32 % (median), so a second
    round reads the candidate 25 % behind as well, and nothing is read a third time."""
    t = Script(monkeypatch, {"u4": 1.0, "u2dp2": 1.05, "dp4": 1.3}, loo_error=0.05, confirm=1,
               reads={"u4": [1.6], "u2dp2": [1.1], "dp4": [1.26]})
    t.measured("u4", 1.0)
    t.measured("u2dp2", 1.05)
    t.measured("dp4", 1.25)
    S.confirm_step(t.run, t.cal)
    assert t.ran == ["u4", "u2dp2", "dp4"]


def test_confirm_reaches_as_far_as_the_models_error_where_it_is_wider(monkeypatch):
    """With a leave-one-out error of 30 %, the first confirm round reads the candidate 25 % behind the best too, not
    only those within --confirm-within's 10 %."""
    t = Script(monkeypatch, {"u4": 1.0, "u2dp2": 1.05, "dp4": 1.3}, loo_error=0.3, confirm=1,
               reads={"u4": [1.02], "u2dp2": [1.06], "dp4": [1.26]})
    t.measured("u4", 1.0)
    t.measured("u2dp2", 1.05)
    t.measured("dp4", 1.25)
    t.cal.result = t.fit(CLUSTER, Params(), list(t.run.measured.values()), frozenset())
    S.confirm_step(t.run, t.cal)
    assert t.ran == ["u4", "u2dp2", "dp4"]


def _one_plan_tune(monkeypatch, estimate_s: float, limit: float, steps: dict) -> OneRank:
    """A tune of one layout estimated at ``estimate_s`` with ``limit`` seconds, resuming ``steps``."""
    plan = LAYOUTS["u4"].model_copy(update={"model": MODEL, "workload": WORK})
    monkeypatch.setattr(S, "candidate_pool", lambda *a: [plan])
    monkeypatch.setattr(S, "estimates", lambda cluster, pool, *a: {p.summary(): estimate_s for p in pool})
    return OneRank(CLUSTER, MODEL, WORK, Store(), TuneOptions(max_minutes=1.0), lambda *a: None,
                   Budget(limit), 0, 1, dict(steps))


def test_a_resumed_tune_goes_on_where_a_new_one_would_be_refused_for_time(monkeypatch):
    """A new tune whose quickest candidate does not fit --max-minutes is refused; one resuming an interrupted run
    (its kernels already timed) goes on with what it stored."""
    with pytest.raises(PlanError) as e:
        S.first_pool(_one_plan_tune(monkeypatch, 1000.0, 30.0, {}))
    assert e.value.field == "max_minutes"
    assert len(S.first_pool(_one_plan_tune(monkeypatch, 1000.0, 30.0, {"kernels": ("ok", {"samples": []})}))) == 1


def _two_ranks(monkeypatch) -> None:
    """The steps see a world of two ranks (their decisions still need no broadcast: ``OneRank``)."""
    monkeypatch.setattr(S, "dist", SimpleNamespace(get_world_size=lambda: 2))


def test_links_measured_are_saved_for_the_next_tune_of_the_topology(monkeypatch):
    """Links measured by a tune are checkpointed and saved under the cluster's topology, where the next tune of any
    model finds them."""
    _two_ranks(monkeypatch)
    fit = {"classes": {"intra": {"latency_s": 1e-5}}}
    monkeypatch.setattr(measure, "measure_links", lambda cluster, opts: fit)
    r = _one_plan_tune(monkeypatch, 10.0, 600.0, {})
    assert S.links_step(r, None) == fit
    assert r.store.link_fits == [(CLUSTER.topology_fingerprint(), fit)] and r.store.writes == [("links", "ok")]


def test_the_round_probe_is_not_timed_once_max_minutes_is_spent(monkeypatch):
    """The ring-round probe runs after the kernel sweep where time is left, and not once --max-minutes is spent."""
    _two_ranks(monkeypatch)
    probes = []
    monkeypatch.setattr(measure, "device", lambda: torch.device("cpu"))
    monkeypatch.setattr(measure, "measure_kernels_step", lambda *a, **k: [])
    monkeypatch.setattr(S, "time_rounds", lambda model, dev, dtype: probes.append(model.name) or 0.01)
    pool = [LAYOUTS["u4"].model_copy(update={"model": MODEL, "workload": WORK})]
    for limit, rounds_s in ((600.0, 0.01), (0.0, None)):
        r = _one_plan_tune(monkeypatch, 10.0, limit, {})
        assert S.kernels_step(r, pool, None).rounds_s == rounds_s
    assert probes == [MODEL.name]


def test_a_failed_candidate_does_not_shift_which_readings_are_surprises(monkeypatch):
    """Every reading matches the prediction of a fit without it: nothing is read again, wherever a failed candidate
    falls among those measured (the fit's per-candidate predictions line up with the candidates it was given)."""
    t = Script(monkeypatch, {"u4": 1.0, "r4": 1.0, "u2dp2": 3.0, "dp4": 1.0}, loo_error=0.05,
               reads={"u2dp2": [3.0], "dp4": [1.0]})
    t.measured("u4", 1.0)
    t.measured("r4", status="oom")
    t.measured("u2dp2", 3.0)
    t.measured("dp4", 1.0)
    t.cal.result = t.run.refit(Params(), frozenset())
    S.reread_step(t.run, t.cal)
    assert t.ran == []
