"""The bounds a split search's shares trade (``planner.exchange``): what is published comes back as the least, and a
share pruned against another's bounds still merges into the one search's rows and variant bests."""
import pytest

from sp_plan.planner import Workload
from sp_plan.planner.equivalent import distinct_prefix
from sp_plan.planner.exchange import INF, Exchange, empty
from sp_plan.planner.partition import merged, shares, variant_key_list
from sp_plan.planner.search import Space, best_per_variant, grid_search, variant_key
from sp_plan.profiles import load_cluster, load_model
from sp_plan.profiles.documents import load_documents

A, B = ("ring", 1, None), ("usp", 1, None)


def test_trade_publishes_the_least_and_pulls_every_share_bests():
    ex = Exchange([A, B], empty([A, B]))
    mine = {A: 5.0}
    assert ex.trade(9.0, A, mine) == 9.0 and ex.values == [9.0, 5.0, INF]
    ex.values[2] = 4.0  # another share priced a usp layout at 4 s, and has a K-th time of 7 s
    ex.values[0] = 7.0
    assert ex.trade(8.0, A, mine) == 7.0 and mine == {A: 5.0, B: 4.0}
    assert ex.trade(6.0, A, {A: 6.0}) == 6.0 and ex.values[1] == 5.0  # a larger best never overwrites a smaller
    with pytest.raises(ValueError):
        Exchange([A, B], [INF])


def _rows_and_bests(res, by_layout=False):
    top = [(round(t, 9), c) for t, c in res.ranked[:distinct_prefix(res.ranked, 5)]]
    return top, [(round(t, 9), c) for t, c in best_per_variant(res.ranked, by_layout)]


@pytest.mark.parametrize("workload", [{}, {"batch": 4}, {"documents": load_documents("megatron-dcp"), "seed": 1}],
                         ids=["one sequence", "batch 4", "documents"])
def test_shares_pruned_against_each_other_merge_into_the_one_search(workload):
    """Share 1 searched first publishes; share 0, pruned against it from the start, prunes more; merged, the two
    give the one search's rows and the best of every variant (and of every balancing policy under documents)."""
    m, c = load_model("tiny-llama"), load_cluster("dgx-h100", 4)
    w = Workload(seq_len="32k", **workload)
    space = Space(c.world_size, m, w)
    whole = grid_search(c, m, w, space, distinct=True)
    keys = variant_key_list(space)
    ex = Exchange(keys, empty(keys))
    first, second = shares(space, 2)
    theirs = grid_search(c, m, w, second, distinct=True, exchange=ex)
    alone = grid_search(c, m, w, first, distinct=True)
    mine = grid_search(c, m, w, first, distinct=True, exchange=ex)
    assert mine.evaluated < alone.evaluated if "documents" not in workload else mine.evaluated <= alone.evaluated
    by_layout = "documents" in workload
    assert _rows_and_bests(merged([mine, theirs]), by_layout) == _rows_and_bests(whole, by_layout)
    assert set(keys) >= {variant_key(cand, by_layout) for _, cand in whole.ranked}  # every ranked variant has a slot
