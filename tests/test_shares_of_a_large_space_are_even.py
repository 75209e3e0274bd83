"""A split search's shares are dealt whole ring degrees, the ring degree with the most degrees choices first, each
to the share holding the fewest so far: on a large space the shares end within a few choices of each other, so no
worker is left with most of the search."""
import pytest

from sp_plan.planner import Workload
from sp_plan.planner.partition import shares
from sp_plan.planner.search import Space
from sp_plan.profiles import load_model


@pytest.mark.parametrize("parts", [2, 3, 4])
def test_shares_hold_about_as_many_choices_each(parts):
    space = Space(128, load_model("tiny-llama"), Workload(seq_len="32k", batch=8))  # 132 choices, 8 ring degrees
    sizes = [sum(1 for _ in s.degrees()) for s in shares(space, parts)]
    assert sum(sizes) == sum(1 for _ in space.degrees())
    assert max(sizes) - min(sizes) <= 6
