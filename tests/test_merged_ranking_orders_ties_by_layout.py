"""The shares' rankings merge in the one search's order: fastest first, times equal to 12 significant places
(floating-point noise between shares) ordered by layout, so the rows a split search shows are the rows one process
shows, whichever share ranked them and in whatever order the shares come back."""
from sp_plan.planner.candidate import Candidate
from sp_plan.planner.partition import merged
from sp_plan.planner.search import SearchResult

RING = Candidate("ring", ring=2, order=("ring", "dp"))
USP = Candidate("usp", ring=4, order=("ring", "dp"))
SLOW = Candidate("ring", ring=8, order=("ring", "dp"))


def _result(ranked):
    return SearchResult(ranked, len(ranked), len(ranked), 0, None)


def test_a_tie_to_twelve_places_is_ordered_by_layout_not_by_time_or_share():
    a = _result([(1.0, USP), (3.0, SLOW)])
    b = _result([(1.0 + 1e-15, RING)])  # the same time up to rounding noise, in another share
    for results in ([a, b], [b, a]):
        assert [c for _, c in merged(results).ranked] == [RING, USP, SLOW]


def test_an_exact_tie_is_ordered_by_layout_whichever_share_comes_first():
    a, b = _result([(2.0, USP)]), _result([(2.0, RING)])
    assert [c for _, c in merged([a, b]).ranked] == [c for _, c in merged([b, a]).ranked] == [RING, USP]
