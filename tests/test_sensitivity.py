"""Sensitivity: link classes halved and doubled, compute at 80 %; a cluster where halving the network flips the winner."""
import pytest

from sp_plan.planner.estimate import Estimator
from sp_plan.planner.model import Workload
from sp_plan.planner.params import Curve, Params
from sp_plan.planner.plausible import MIN_EFFICIENCY
from sp_plan.planner.search import finish, grid_search
from sp_plan.planner.sensitivity import link_classes, scale_compute, scale_links, sensitivity
from sp_plan.profiles import load_cluster, load_model

# two DGX A100 nodes, Llama-3-8B at 16k tokens: ulysses8 x ring2 wins, its ring and ZeRO across the InfiniBand
# rails; with half the InfiniBand bandwidth tp8 x ring2 wins instead
W = Workload(seq_len=16384, batch=1)


@pytest.fixture(scope="module")
def dgx():
    return load_cluster("dgx-a100", 2), load_model("llama3-8b")


def best(cluster, model, params=None):
    res = grid_search(cluster, model, W, keep=1, params=params)
    return finish(res, cluster, model, W, 1)[0]


def test_halving_the_network_changes_the_winner(dgx):
    c, m = dgx
    win = best(c, m)
    sen = sensitivity(c, m, W, win)
    by = {s.name: s for s in sen.scenarios}
    assert set(by) == {"nvswitch x0.5", "nvswitch x2", "pcie x0.5", "pcie x2", "smp x0.5", "smp x2", "ib x0.5", "ib x2",
                       "compute x0.8"}
    half = by["ib x0.5"]
    assert not half.holds and half.winner.summary() != win.summary()
    assert half.loss > 0.05 and "keeping the winner loses" in half.line()
    # checked independently: rank again on a cluster whose InfiniBand links carry half, price both there and here
    slow = scale_links(c, "ib", 0.5)
    new = best(slow, m)
    assert new.summary() == half.winner.summary()
    unpinned = lambda p: p.model_copy(update={"cluster_fingerprint": None})  # noqa: E731
    there = Estimator(slow, m, W)
    assert there(unpinned(new)).step_time_s < there(unpinned(win)).step_time_s
    assert half.old_winner_s == pytest.approx(there(unpinned(win)).step_time_s)
    here = Estimator(c, m, W)
    assert here(unpinned(win)).step_time_s < here(unpinned(new)).step_time_s  # a real swap, not a tie
    assert half.old_winner_s > half.base_s  # a slower network slows the winner
    assert by["ib x2"].old_winner_s < half.base_s
    assert by["nvswitch x0.5"].holds and by["compute x0.8"].holds
    assert not sen.robust


def test_scale_links_touches_only_its_kind(dgx):
    c, _ = dgx
    assert link_classes(c) == {"nvswitch": "intra-node", "pcie": "intra-node", "smp": "intra-node", "ib": "inter-node"}
    assert "ib" not in link_classes(load_cluster("dgx-h100", 1))  # one node: the NICs carry nothing
    s = scale_links(c, "ib", 0.5)
    for a, b in zip(c.node_type(0).links, s.node_type(0).links):
        assert b.capacity == (a.capacity * 0.5 if a.kind == "ib" else a.capacity)
    assert c.node_type(0).links[0].capacity == load_cluster("dgx-a100", 2).node_type(0).links[0].capacity  # a copy


@pytest.mark.parametrize("params", [Params(), Params(attention_fwd=Curve(points=((4096, 0.5), (32768, 0.7))),
                                                     attention_bwd=Curve(points=((4096, 0.4),)),
                                                     matmul=Curve(points=((1024, 0.6), (8192, 0.75))))])
def test_compute_at_80_percent_stretches_every_compute_phase_by_a_quarter(dgx, params):
    c, m = dgx
    win = best(c, m, params).model_copy(update={"cluster_fingerprint": None})
    c80, p80 = scale_compute(c, params, 0.8)
    before = {x.name: x for x in Estimator(c, m, W, params=params)(win).breakdown}
    after = {x.name: x for x in Estimator(c80, m, W, params=p80)(win).breakdown}
    computes = [n for n, x in before.items() if x.kind == "compute"]
    assert len(computes) >= 3
    for n in computes:
        assert after[n].seconds == pytest.approx(before[n].seconds / 0.8, rel=1e-9)
    comms = [n for n, x in before.items() if x.kind == "communication"]
    for n in comms:
        assert after[n].seconds == pytest.approx(before[n].seconds, rel=1e-9)


@pytest.mark.parametrize("kind, factor", [("smp", 0.5), ("smp", 2.0), ("pcie", 0.5), ("ib", 2.0)])
def test_an_unrouted_change_keeps_the_full_searchs_answer(dgx, kind, factor):
    """The shortcut's condition holds only where no route moves, and there a full search ranks as the base does."""
    from sp_plan.planner.sensitivity import unrouted

    c, m = dgx
    base = Estimator(c, m, W)
    changed = scale_links(c, kind, factor)
    skip = unrouted(base, changed)
    assert skip == (kind == "smp")  # a DGX's CPU sockets' link carries no GPU flow; the others do
    if skip:
        win, again = best(c, m), best(changed, m)
        assert again.predicted.step_time_s == win.predicted.step_time_s
        assert again.summary() == win.summary()


@pytest.mark.parametrize("preset, nodes, model, seq, batch", [
    ("dgx-a100", 2, "llama3-8b", 16384, 1), ("dgx-h100", 16, "llama3-70b", 131072, 4),
    ("a100-16-eth100", 2, "bert-large", 8192, 8), ("ascend-910b-8", 4, "llama2-7b", 65536, 2)])
def test_a_search_for_the_winner_alone_finds_the_same_winner_with_less_work(preset, nodes, model, seq, batch):
    """variants=False prunes on the K-th time alone: the same best time as the search that keeps every variant's
    best, never more layouts priced."""
    c, m, w = load_cluster(preset, nodes), load_model(model), Workload(seq_len=seq, batch=batch)
    full = grid_search(c, m, w, keep=1)
    alone = grid_search(c, m, w, keep=1, variants=False)
    assert alone.ranked[0][0] == full.ranked[0][0]
    assert alone.evaluated <= full.evaluated
    assert {cand.algorithm for _, cand in full.ranked} > {alone.ranked[0][1].algorithm}  # the full one kept more


def test_compute_at_80_percent_scales_a_profile_curve_that_starts_at_the_floor():
    """A profile's curve may hold an efficiency at the floor a curve validates (MIN_EFFICIENCY); the what-if scales
    every point, that one too, instead of refusing the scenario."""
    cl = load_cluster("dgx-h100", 1)
    curve = Curve(points=((256.0, MIN_EFFICIENCY), (8192.0, 0.6)))
    _, scaled = scale_compute(cl, Params(attention_fwd=curve), 0.8)
    assert scaled.attention_fwd.points == ((256.0, 0.8 * MIN_EFFICIENCY), (8192.0, pytest.approx(0.48)))
