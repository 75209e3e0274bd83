"""Summarising a sample of document lengths as a histogram refuses a length below one token with a one-line
PlanError naming the length (a document has at least one token), whoever calls it."""
import pytest

from sp_plan.planner import PlanError
from sp_plan.planner.documents import histogram_of


@pytest.mark.parametrize("lengths, shown", [([5, 0, 3], "0"), ([4, -2], "-2")])
def test_a_length_below_one_token_is_refused_by_name(lengths, shown):
    with pytest.raises(PlanError) as e:
        histogram_of(lengths, "sample.txt")
    assert e.value.field == "documents" and f"length of {shown}" in e.value.problem and e.value.fix
