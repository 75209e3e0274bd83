"""A tune's measurements as a table: TuneReport.to_pandas has one row per measured candidate (no world needed)."""
from __future__ import annotations

from pathlib import Path

import pytest

from sp_plan.planner.profile import Profile
from sp_plan.profiles.tune.run import FRAME_COLUMNS, TuneReport, candidates_frame

FIXTURE = Path(__file__).parent / "fixtures" / "profile-dgx-h100.yaml"


def test_the_report_is_one_row_per_measured_candidate():
    prof = Profile.load(FIXTURE)
    first = prof.candidates[0]
    read_twice = first.model_copy(update={"detail": {**first.detail, "readings_s": [2.5, first.measured_s],
                                                     "wall_s": 40.0, "estimate_s": 30.0}})
    prof = prof.model_copy(update={"candidates": [read_twice, *prof.candidates[1:]]})
    df = TuneReport(profile=prof, best=None, resumed=False, reused=[], stop_reason="budget").to_pandas()
    assert list(df.columns) == list(FRAME_COLUMNS) and len(df) == len(prof.candidates)
    assert list(df["layout"]) == [c.summary for c in prof.candidates]
    assert list(df["status"]) == ["ok", "ok", "oom"] and list(df["readings"]) == [2, 1, 0]
    row = df.iloc[0]
    assert row["measured_s"] == first.measured_s and row["wall_s"] == 40.0 and row["estimate_s"] == 30.0
    assert row["error_after"] == pytest.approx((first.predicted_after_s - first.measured_s) / first.measured_s)
    assert df.iloc[2]["error_after"] is None or df.iloc[2]["error_after"] != df.iloc[2]["error_after"]  # none: OOM


def test_an_empty_tune_is_an_empty_table_with_the_columns():
    prof = Profile.load(FIXTURE).model_copy(update={"candidates": []})
    df = candidates_frame(prof)
    assert df.empty and list(df.columns) == list(FRAME_COLUMNS)
