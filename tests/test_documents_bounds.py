"""Document distributions at the edges of a float: histogram weights of any scale are drawn from, and a lognormal too
wide to mean anything is refused by name (a PlanError), never an overflow."""
from __future__ import annotations

import numpy as np
import pytest

from sp_plan.pipeline import PlanRequest, run_plan
from sp_plan.planner.documents import draw_packs, mean_length
from sp_plan.planner.errors import PlanError
from sp_plan.planner.model import MAX_SIGMA, Histogram, Lognormal


def test_histogram_weights_near_the_largest_float_are_drawn_as_equal_weights():
    huge = Histogram(edges=(0, 100, 1000), weights=(1e308, 1e308))  # their sum overflows to inf
    same = Histogram(edges=(0, 100, 1000), weights=(1.0, 1.0))
    assert mean_length(huge) == pytest.approx(mean_length(same)) and mean_length(same) > 1
    for a, b in zip(draw_packs(huge, 4096, 2, seed=3), draw_packs(same, 4096, 2, seed=3)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("sigma", [MAX_SIGMA * 1.01, 1e200])
def test_a_lognormal_wider_than_max_sigma_is_refused_by_name(sigma):
    with pytest.raises(PlanError) as e:  # when the workload is read, before any draw
        Lognormal(mean=1000, sigma=sigma, min=1, max=4096)
    assert e.value.field == "workload.documents.sigma" and f"{MAX_SIGMA:g}" in e.value.fix


def test_the_widest_lognormal_is_drawn_within_its_bounds():
    packs = draw_packs(Lognormal(mean=1000, sigma=MAX_SIGMA, min=1, max=4096), 4096, 2, seed=0)
    assert all(cu[0] == 0 and cu[-1] == 4096 and np.all(np.diff(cu) >= 1) for cu in packs)


@pytest.mark.parametrize("documents, field", [
    ({"kind": "lognormal", "mean": 1000, "sigma": 1e200, "min": 1, "max": 4096}, "workload.documents.sigma")])
def test_the_pipeline_refuses_a_wide_lognormal_as_a_plan_error(documents, field):
    with pytest.raises(PlanError) as e:  # the request is refused as it is read
        run_plan(PlanRequest(cluster="dgx-h100", model="tiny-gpt", workload={"seq_len": "4k", "documents": documents},
                             use_profile=False))
    assert e.value.field == field


def test_the_pipeline_plans_with_weights_near_the_largest_float():
    docs = {"kind": "histogram", "edges": [0, 100, 1000], "weights": [1e308, 1e308]}
    req = PlanRequest(cluster="dgx-h100", model="tiny-gpt", workload={"seq_len": "4k", "documents": docs},
                      use_profile=False, top=1)
    assert run_plan(req).plans[0].predicted.step_time_s > 0


def test_a_pack_of_more_documents_than_the_planner_prices_is_refused_naming_documents():
    """Pricing places every document of every pack drawn; few-token documents in a sequence of a million held a
    search (and a service process) for minutes."""
    from sp_plan.planner.model import MAX_DOCUMENTS_PER_PACK, Workload

    least = (1 << 20) // MAX_DOCUMENTS_PER_PACK
    assert Workload(seq_len="1m", documents=[least]).documents is not None
    with pytest.raises(PlanError) as e:
        Workload(seq_len="1m", documents=[least // 4, least // 4])
    assert e.value.field == "workload.documents" and f"at least {least:,} tokens" in e.value.fix
