"""tune's reread step: which readings are surprises (``surprises``), on synthetic fits."""
from __future__ import annotations

from sp_plan.planner.calibration import FitResult
from sp_plan.planner.params import Params
from sp_plan.planner.profile import MeasuredCandidate
from sp_plan.profiles.tune.readings import surprises
from sp_plan.profiles.tune.settings import SETTINGS


def _mc(name: str, seconds: float, readings: list[float] | None = None, status: str = "ok") -> MeasuredCandidate:
    detail = {"readings_s": readings} if readings else {}
    return MeasuredCandidate(summary=name, plan={}, model="m", seq_len=1024, batch=1, status=status,
                             measured_s=seconds if status == "ok" else None, detail=detail)


def _fit(loo_error: float | None, loo_times: list[float | None]) -> FitResult:
    return FitResult(params=Params(), fitted=[], loo_error_before=None, loo_error_after=loo_error,
                     loo_times=loo_times)


def test_only_readings_slower_than_the_reach_are_surprises_largest_first():
    ms = [_mc("a", 1.0), _mc("b", 1.6), _mc("c", 2.0), _mc("d", 0.5), _mc("e", 1.25)]
    loo = [1.0, 1.0, 1.0, 1.0, 1.0]
    # reach max(0.10, 2 x 0.12) = 0.24: b (+60 %), c (+100 %) and e (+25 %) are over it; d is fast, not a surprise
    assert surprises(_fit(0.12, loo), ms, 5) == ["c", "b", "e"]
    assert surprises(_fit(0.12, loo), ms, 2) == ["c", "b"]
    assert surprises(_fit(0.12, loo), ms, 0) == []
    # a wide leave-one-out error widens the reach: 2 x 0.4 = 0.8 leaves c alone
    assert surprises(_fit(0.4, loo), ms, 5) == ["c"]


def test_the_floor_holds_where_the_fit_is_close():
    ms = [_mc("a", 1.0 + SETTINGS.surprise_floor / 2), _mc("b", 1.0 + 2 * SETTINGS.surprise_floor), _mc("c", 1.0)]
    assert surprises(_fit(0.01, [1.0, 1.0, 1.0]), ms, 5) == ["b"]


def test_nothing_is_a_surprise_before_a_leave_one_out_error_means_anything():
    ms = [_mc("a", 1.0), _mc("b", 3.0), _mc("failed", 0.0, status="oom")]  # two timed: fewer than MIN_MEASURED
    assert surprises(_fit(0.05, [1.0, 1.0, None]), ms, 5) == []
    assert surprises(_fit(0.05, [1.0, 1.0, 1.0, None]), ms[:2] + [_mc("c", 1.0)] + ms[2:], 5) == ["b"]


def test_read_again_failed_or_unpredicted_candidates_are_not_surprises():
    ms = [_mc("read twice", 3.0, [3.0, 3.2]), _mc("failed", 0.0, status="oom"), _mc("no loo", 3.0), _mc("x", 3.0)]
    assert surprises(_fit(0.05, [1.0, 1.0, None, 1.0]), ms, 5) == ["x"]
    assert surprises(None, ms, 5) == [] and surprises(_fit(None, [1.0] * 4), ms, 5) == []
