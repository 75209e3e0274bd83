"""After a tune, the layouts it measured rank by their measured step (planner/measured.py), in the Python API,
the CLI's planning call and the plan file; other workloads' measurements and other layouts are left alone."""
from __future__ import annotations

import pytest

from sp_plan.planner.measured import twins
from sp_plan.planner.model import Workload
from sp_plan.planner.profile import MeasuredCandidate, Profile
from sp_plan.pipeline import plan
from sp_plan.profiles import load_cluster, load_model
from sp_plan.profiles.resolve import resolve_params
from sp_plan.pipeline import PlanRequest, run_plan

CLUSTER, MODEL = load_cluster("dgx-h100"), load_model("llama3-8b")
WORK = Workload(seq_len=131072, batch=1)


def _ran(p, seconds: float) -> MeasuredCandidate:
    return MeasuredCandidate(summary=p.summary(), plan=p.model_dump(mode="json"), model=p.model.name,
                             seq_len=p.workload.seq_len, measured_s=seconds, measured_memory=1e9)


@pytest.fixture(scope="module")
def measured():
    """The model's top plans, the first measured at twice its prediction, the second at its prediction, the 12th
    (outside the top 5) at half the first's prediction, and one of another sequence length faster than all."""
    params = resolve_params(CLUSTER, False)[0]
    ranked = plan(CLUSTER, MODEL, WORK, top_k=12, profile=False)
    other = plan(CLUSTER, MODEL, Workload(seq_len=65536, batch=1), top_k=1, profile=False)[0]
    first, second, far = ranked[0], ranked[1], ranked[11]
    step = first.predicted.step_time_s
    cands = [_ran(first, 2 * step), _ran(second, second.predicted.step_time_s), _ran(far, step / 2),
             _ran(other, step / 100)]
    prof = Profile(id="p1", cluster_fingerprint=CLUSTER.topology_fingerprint(), params=params, candidates=cands)
    return prof, ranked


def test_twins_are_this_model_and_workload_only(measured):
    prof, ranked = measured
    assert set(twins(prof, MODEL, WORK)) == {ranked[0].summary(), ranked[1].summary(), ranked[11].summary()}
    assert twins(prof, load_model("llama3-70b"), WORK) == {}


def test_a_failed_candidate_is_no_twin_and_a_repeated_layout_keeps_its_fastest_reading(measured):
    """A candidate stored as over the device's memory keeps the step it ran before the memory check: it is no
    measurement to rank by. A layout measured twice ranks at its faster reading, whichever came first."""
    prof, ranked = measured
    third, step = ranked[2], ranked[2].predicted.step_time_s
    oom = _ran(third, step / 50).model_copy(update={"status": "oom"})
    for slow_first in (True, False):
        pair = [_ran(ranked[3], 3 * step), _ran(ranked[3], 0.9 * step)]
        got = twins(prof.model_copy(update={"candidates": [*prof.candidates, oom, *pair[::1 if slow_first else -1]]}),
                    MODEL, WORK)
        assert third.summary() not in got
        assert got[ranked[3].summary()].measured_s == 0.9 * step


def test_plan_ranks_measured_layouts_by_their_measurement(measured):
    prof, ranked = measured
    got = plan(CLUSTER, MODEL, WORK, top_k=5, profile=prof)
    names = [p.summary() for p in got]
    assert names[0] == ranked[11].summary()  # measured fastest, though the model put it 12th
    assert got[0].measured.step_time_s == ranked[0].predicted.step_time_s / 2 and got[0].measured.profile == "p1"
    assert ranked[0].summary() not in names  # measured at twice its prediction: behind the top 5 now
    assert names.index(ranked[1].summary()) == 1 and got[1].measured is not None
    assert all(p.measured is None for p in got[2:])
    steps = [p.measured.step_time_s if p.measured else p.predicted.step_time_s for p in got]
    assert steps == sorted(steps)
    from sp_plan.planner.ranking import secs, versus_first

    assert versus_first(got[1], got[0]) == f"{secs(steps[1] - steps[0])} slower (both measured)"
    assert versus_first(got[2], got[0]) == f"{secs(steps[2] - steps[0])} slower"


def test_the_planning_call_of_cli_and_service_ranks_the_same(measured, tmp_path):
    prof, ranked = measured
    path = tmp_path / "profile.yaml"
    prof.save(path)
    res = run_plan(PlanRequest(cluster="dgx-h100", model="llama3-8b", workload=WORK, top=3, profile=str(path)))
    assert res.winner.summary() == ranked[11].summary() and res.winner.measured is not None
    assert [p.summary() for p in res.plans][:2] == [ranked[11].summary(), ranked[1].summary()]


def test_without_the_profile_nothing_is_measured():
    got = plan(CLUSTER, MODEL, WORK, top_k=5, profile=False)
    assert all(p.measured is None for p in got)


def test_marked_plans_sort_by_their_measurement(measured):
    from sp_plan.planner.measured import mark
    from sp_plan.planner.ranking import step_time

    prof, ranked = measured
    got = mark(ranked, prof, MODEL, WORK)
    assert got[0].summary() == ranked[11].summary() and got[0].measured is not None  # measured at half the best
    assert [step_time(p) for p in got] == sorted(step_time(p) for p in got)


def test_a_measured_alternative_gets_a_row_of_its_own(measured):
    from sp_plan.planner.equivalent import Row
    from sp_plan.planner.measured import rank_rows

    prof, ranked = measured
    rows = rank_rows([Row(ranked[0], [ranked[1]], "mesh order")], CLUSTER, prof, prof.params, MODEL, WORK)
    first = next(r for r in rows if r.plan.summary() == ranked[0].summary())
    assert first.alternatives == [] and first.parameter is None
    assert sum(r.plan.summary() == ranked[1].summary() for r in rows) == 1
