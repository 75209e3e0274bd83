"""What a resumed `sp-plan tune` takes from its store (profiles/tune/steps.py), on one rank without a world: a
step's checkpoint is written once and read back, failed steps included, so a killed tune neither measures again
what finished nor runs again what failed."""
from types import SimpleNamespace

from sp_plan.planner.model import Workload
from sp_plan.planner.plan import Plan
from sp_plan.profiles import load_cluster, load_model
from sp_plan.profiles.tune import steps as S
from sp_plan.profiles.tune.budget import Budget

CLUSTER, MODEL, WORK = load_cluster("cpu-local", 1), load_model("tiny-llama"), Workload(seq_len=256, batch=1)
PLAN = Plan(algorithm="ulysses", degrees={"ulysses": 1}).model_copy(update={"model": MODEL, "workload": WORK})


class Store:
    """The store's checkpoint writes, kept in order."""

    def __init__(self):
        self.writes = []

    def record_step(self, run_id, key, status, payload):
        self.writes.append((key, status))


class OneRank(S.TuneRun):
    """A tune run on rank 0 of a world of one: its decisions need no broadcast."""

    def decide(self, choose):
        return choose()


def _run(steps: dict, left: float = 100.0) -> OneRank:
    opts = SimpleNamespace(layers=2, iters=2, max_minutes=1, settings=None)
    return OneRank(CLUSTER, MODEL, WORK, Store(), opts, lambda *a: None, Budget(left), 0, 1, steps)


def _candidate(status: str, seconds: float | None = 1.0) -> dict:
    return {"summary": PLAN.summary(), "plan": PLAN.model_dump(mode="json"), "status": status,
            "measured_s": seconds if status == "ok" else None, "detail": {"wall_s": 5.0}}


def _calibration() -> S.Calibration:
    return S.Calibration(None, frozenset(), [], [], {})


def test_a_finished_or_failed_step_is_read_back_and_a_running_one_is_not():
    r = _run({"reread:a": ("failed", {"status": "error"}), "kernels": ("ok", {"samples": []}),
              "candidate:b": ("running", {})})
    assert r.stored("reread:a") == {"status": "error"} and r.stored("kernels") == {"samples": []}
    assert r.stored("candidate:b") is None and r.stored("links") is None


def test_a_step_measured_is_checkpointed_once_and_a_stored_one_is_not_measured_again():
    r = _run({})
    assert r.checkpoint("kernels", lambda: {"samples": [1]}) == {"samples": [1]}
    assert r.store.writes == [("kernels", "ok")]
    r = _run({"kernels": ("ok", {"samples": [2]})})
    assert r.checkpoint("kernels", lambda: {"samples": [3]}) == {"samples": [2]} and r.store.writes == []


def test_a_resumed_tune_keeps_failed_candidates_and_those_the_new_ranking_lacks():
    for status in ("ok", "failed"):
        r, cal = _run({f"candidate:{PLAN.summary()}": (status, _candidate("error" if status == "failed" else "ok"))}), \
            _calibration()
        S.resumed_candidates(r, cal)
        assert list(r.measured) == [PLAN.summary()]  # a known failure is not measured again either
        assert [p.summary() for p in cal.pool] == [PLAN.summary()] and PLAN.summary() in cal.by_name


def test_a_stored_reading_is_taken_back_whatever_time_is_left():
    """A reread the interrupted run finished is the store's, even with less time left than its first reading
    took (a fresh reading would be skipped)."""
    key = f"reread:{PLAN.summary()}"
    r = _run({f"candidate:{PLAN.summary()}": ("ok", _candidate("ok")), key: ("ok", _candidate("ok", 0.8))}, left=1.0)
    S.resumed_candidates(r, _calibration())
    got = S.again(r, key, PLAN, lambda s: None)
    assert got is not None and got.measured_s == 0.8 and r.skipped == []
    r = _run({f"candidate:{PLAN.summary()}": ("ok", _candidate("ok"))}, left=1.0)
    S.resumed_candidates(r, _calibration())
    assert S.again(r, key, PLAN, lambda s: None) is None and r.skipped and r.store.writes[-1][0] == f"skip:{key}"


class RunStore(Store):
    """A store that opens a fresh run under whatever key it is given, and keeps the keys."""

    def __init__(self):
        super().__init__()
        self.keys = []

    def start_run(self, key, meta, busy=None):
        self.keys.append(key)
        return 7, False

    def steps(self, run_id):
        return {}

    def link_fit(self, fingerprint):
        return None


def test_a_tune_of_other_layers_or_iterations_is_another_run():
    """A tune that measures stacks of other depths or times other steps does not resume one that did not."""
    store = RunStore()
    for layers, iters in ((2, 2), (2, 2), (2, 3), (3, 2)):
        r = _run({})
        r.store, r.opts = store, SimpleNamespace(layers=layers, iters=iters, max_minutes=1, settings=None)
        assert S.start(r) == (False, None) and r.run_id == 7
    first, again, more_iters, more_layers = store.keys
    assert first == again and len({first, more_iters, more_layers}) == 3


def test_a_stored_link_fit_is_reused_without_measuring():
    r = _run({})
    assert S.links_step(r, {"classes": {"intra": 1}}) == {"classes": {"intra": 1}} and r.reused == ["links"]
    r = _run({"links": ("ok", {"classes": {"inter": 2}})})
    assert S.links_step(r, None) == {"classes": {"inter": 2}} and r.reused == ["links"]


def test_a_candidate_is_stopped_at_the_end_of_max_minutes(monkeypatch):
    """With 5 s of --max-minutes left, a candidate's timeout is 5 s, not --candidate-timeout's 600; one stopped
    there says so, and its wall seconds and estimate are kept."""
    from sp_plan.planner.profile import MeasuredCandidate
    from sp_plan.profiles.tune import measure
    from sp_plan.profiles.tune.run import TuneOptions

    clock = SimpleNamespace(now=0.0)
    seen = {}

    def run_candidate(plan, model, work, cluster, opts, fault=None, beat=None, backends=None):
        seen.update(timeout=opts.candidate_timeout, iters=opts.iters)
        clock.now += 5.0
        return MeasuredCandidate(summary=plan.summary(), plan={}, status="timeout", reason="timed out after 5 s")

    monkeypatch.setattr(measure, "run_candidate", run_candidate)
    r = _run({})
    r.opts = TuneOptions(max_minutes=1.0, candidate_timeout=600.0, iters=3)
    r.budget = Budget(60.0, clock=lambda: clock.now, start=-55.0)
    mc = S.timed(r, PLAN, None, 30.0, lambda s: None, iters=2)
    assert seen == {"timeout": 5.0, "iters": 2}
    assert mc.reason.endswith("stopped at the end of --max-minutes 1")
    assert (mc.detail["wall_s"], mc.detail["estimate_s"]) == (5.0, 30.0)


def test_the_choice_stops_at_the_budget_of_candidates_and_at_the_end_of_max_minutes():
    from sp_plan.planner.params import Params
    from sp_plan.planner.profile import MeasuredCandidate
    from sp_plan.profiles.tune.run import TuneOptions

    cal = S.Calibration(Params(), frozenset(), [], [PLAN], {PLAN.summary(): PLAN})
    r = _run({})
    r.opts = TuneOptions(budget=2, max_minutes=1.0)
    r.measured = {n: MeasuredCandidate(summary=n, plan={}, measured_s=1.0) for n in ("a", "b")}
    choice, _, _ = S.choose(r, cal)
    assert choice.index is None and choice.why == "budget of 2 candidate(s) reached"
    r.measured = {"a": r.measured["a"]}
    r.budget = Budget(60.0, clock=lambda: 61.0, start=0.0)
    choice, _, _ = S.choose(r, cal)
    assert choice.index is None and choice.why == "--max-minutes 1 reached"
