"""A plan's ``stage_layers`` must list exactly pp counts that sum to exactly the model's layers: more counts than
pp, or counts that leave some of the model's layers on no stage, are refused naming the field, as too few counts
and too many layers are."""
from __future__ import annotations

import pytest

from sp_plan.planner import Plan, PlanError
from sp_plan.planner.stages import check_stage_layers
from sp_plan.profiles import load_model


@pytest.mark.parametrize("layers,why", [([2, 2, 2, 1, 1], "5 stages listed for pp 4"),
                                        ([2, 2, 2, 1], "hold 7 layers, the model has 8")])
def test_stage_layers_with_more_stages_than_pp_or_fewer_layers_than_the_model_are_refused(layers, why):
    with pytest.raises(PlanError, match=f"stage_layers: .*{why}"):
        Plan(algorithm="ring", degrees={"pp": 4, "ring": 2}, stage_layers=layers, model=load_model("tiny-llama"))


def test_the_check_accepts_exactly_pp_counts_summing_to_the_layers():
    check_stage_layers([1, 3, 3, 1], 4, 8)
    for bad in ([1, 3, 3, 1, 0], [1, 3, 3], [1, 3, 2, 1], [1, 3, 3, 2]):
        with pytest.raises(PlanError):
            check_stage_layers(bad, 4, 8)
