"""The planner at cluster scale (issue 15): same predictions as before the per-shape schedules, bounded work."""
from __future__ import annotations

import gzip
import json

import pytest

from golden_predictions import CASES, PATH, SCALE_CASE, best_of_each, candidate_times

GOLDEN = json.load(gzip.open(PATH, "rt"))


def _same(now: dict[str, float], then: dict[str, float]) -> None:
    assert sorted(now) == sorted(then)
    bad = {k: (now[k], then[k]) for k in then if abs(now[k] - then[k]) > 1e-9 * abs(then[k])}
    assert not bad, f"{len(bad)} predictions changed, e.g. {list(bad.items())[:3]}"


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_candidate_predicts_as_recorded(case):
    _same(candidate_times(case), GOLDEN[case[0]])


def test_cluster_scale_best_of_each_variant_as_recorded():
    _same(best_of_each(SCALE_CASE), GOLDEN[SCALE_CASE[0]])
