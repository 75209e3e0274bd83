"""The search offers an interleaved schedule (virtual stages > 1) only where a step's micro-batches come in whole
groups of pp (``stages.virtual_stage_options``, ``searched_virtual_stages``): a count of at least pp that pp does not
divide gets plain 1F1B alone, as the Estimator refuses any other (``check_interleaved_micro_batches``)."""
from __future__ import annotations

import pytest

from sp_plan.planner import PlanError
from sp_plan.planner.stages import (check_interleaved_micro_batches, searched_virtual_stages,
                                    virtual_stage_options)


@pytest.mark.parametrize("micro_batches", [5, 6, 7, 10])
def test_micro_batches_not_a_multiple_of_pp_get_plain_1f1b_alone(micro_batches):
    assert virtual_stage_options(4, micro_batches, 80) == [1]  # 20 layers a stage would split into 2, 4, 5
    assert searched_virtual_stages(4, [micro_batches], 80) == [1]
    with pytest.raises(PlanError):
        check_interleaved_micro_batches(2, 4, micro_batches)


def test_whole_groups_of_pp_get_every_split_of_the_stages():
    assert virtual_stage_options(4, 8, 80) == [1, 2, 4, 5]
    assert searched_virtual_stages(4, [6, 8], 80) == [1, 5]
