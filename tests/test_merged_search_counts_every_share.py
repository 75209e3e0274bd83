"""A split search reports what the one search did: the candidates in its space, the layouts it priced and the
variants it rejected are summed over the shares, and the predictions each share made ahead are all kept; the
estimator and profile are the first share's."""
from sp_plan.planner.candidate import Candidate
from sp_plan.planner.partition import merged
from sp_plan.planner.search import SearchResult

A, B = Candidate("ring", ring=2), Candidate("usp", ring=4)


def test_counts_are_summed_and_predictions_united():
    first = SearchResult([(1.0, A)], 7, 40, 2, "estimator", "profile-1", "line", {A: "pa"})
    second = SearchResult([(2.0, B)], 5, 25, 3, None, predicted={B: "pb"})
    m = merged([first, second])
    assert (m.evaluated, m.space, m.rejected) == (12, 65, 5)
    assert m.predicted == {A: "pa", B: "pb"}
    assert (m.estimator, m.profile, m.profile_line) == ("estimator", "profile-1", "line")
    assert [c for _, c in m.ranked] == [A, B]
