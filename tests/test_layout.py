"""The shared layout module: mesh groups, token permutations, causal work per ring round."""
import numpy as np
import pytest

from sp_plan.planner import PlanError
from sp_plan.planner.layout import (Layout, causal_work, chunks_needed, group_ranks, ring_tokens, round_work,
                                    sp_tokens)


def test_groups_follow_mesh_order_innermost_first():
    d = {"ulysses": 2, "ring": 2, "dp": 2}
    assert group_ranks("ulysses", d, ["ulysses", "ring", "dp"]) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert group_ranks("ring", d, ["ulysses", "ring", "dp"]) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert group_ranks("dp", d, ["ulysses", "ring", "dp"]) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert group_ranks("ring", d, ["ring", "dp", "ulysses"]) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert group_ranks("ulysses", d, ["ring", "dp", "ulysses"]) == [[0, 4], [1, 5], [2, 6], [3, 7]]


@pytest.mark.parametrize("order", [["ulysses", "ring", "dp"], ["dp", "ring", "ulysses"], ["ring", "ulysses", "dp"]])
def test_every_dimension_partitions_the_world(order):
    lay = Layout({"ulysses": 2, "ring": 2, "dp": 2}, tuple(order))
    for name, groups in lay.all_groups().items():
        flat = sorted(r for g in groups for r in g)
        assert flat == list(range(8)), name
    # sequence group is ordered ulysses-fastest: index in group == sp_rank
    for g in lay.groups("sp"):
        assert [lay.sp_rank(r) for r in g] == list(range(4))


def test_zigzag_holds_chunks_r_and_2P_minus_1_minus_r():
    t = ring_tokens("zigzag", 4, 16)
    assert t[0].tolist() == [0, 1, 14, 15]
    assert t[1].tolist() == [2, 3, 12, 13]
    assert t[3].tolist() == [6, 7, 8, 9]


def test_striped_puts_token_t_on_rank_t_mod_P():
    t = ring_tokens("striped", 4, 16)
    for r in range(4):
        assert all(x % 4 == r for x in t[r])
    assert t[1].tolist() == [1, 5, 9, 13]


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
@pytest.mark.parametrize("u,r", [(1, 4), (2, 2), (4, 1), (2, 4)])
def test_sp_tokens_is_a_permutation_and_ring_rank_gets_its_tokens(layout, u, r):
    s = 64
    t = sp_tokens(layout, u, r, s)
    assert sorted(t.reshape(-1).tolist()) == list(range(s))
    # concatenating the ulysses pieces gives the ring rank's ring-level tokens (USP Algorithm 2)
    rt = ring_tokens(layout, r, s)
    for ri in range(r):
        assert np.concatenate(list(t[ri])).tolist() == rt[ri].tolist()


def test_bad_sequence_length_names_the_field():
    with pytest.raises(PlanError, match="seq_len: 30 is not divisible by 8"):
        ring_tokens("zigzag", 4, 30)
    assert chunks_needed("zigzag", 4, 2) == 16


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
@pytest.mark.parametrize("P", [2, 3, 4, 8])
def test_causal_work_closed_form_matches_brute_force(layout, P):
    s = 2 * P * 6
    rt = ring_tokens(layout, P, s)
    c = s // P
    brute = np.array([[(rt[j][None, :] <= rt[r][:, None]).sum() / c**2 for j in range(P)] for r in range(P)])
    assert np.allclose(causal_work(layout, P, s), brute)


def test_striped_attention_per_round_workload():
    """Striped Attention Sec. 3: contiguous ring is bound by a full block every round after the first;
    striped does c(c+1)/2 of c^2 interactions per round; zigzag exactly half after round 0."""
    P, s = 8, 8 * 1024
    c = s // P
    contiguous = round_work("contiguous", P, s, causal=True)
    striped = round_work("striped", P, s, causal=True)
    zigzag = round_work("zigzag", P, s, causal=True)
    assert contiguous[1:] == [1.0] * (P - 1)
    assert contiguous[0] == pytest.approx((c + 1) / (2 * c))
    assert striped == [pytest.approx((c + 1) / (2 * c))] * P
    assert zigzag[1:] == [0.5] * (P - 1)
    # the bound the paper states: up to 2x less attention time as blocks and rings grow
    speedup = sum(contiguous) / sum(striped)
    assert speedup == pytest.approx((P - 1 + (c + 1) / (2 * c)) / (P * (c + 1) / (2 * c)))
    assert 1.8 < speedup < 2.0
    assert round_work("contiguous", P, s, causal=False) == [1.0] * P


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
@pytest.mark.parametrize("P", [65, 128])
def test_large_rings_closed_form_is_the_per_round_maximum(layout, P):
    """Past 64 ranks ``_round_work`` takes a closed form; it is the busiest rank's block fraction of each round that
    ``causal_work`` gives, round by round."""
    from sp_plan.planner.layout import _large_ring_work

    s = 2 * P * 12
    w = causal_work(layout, P, s)
    r = np.arange(P)
    rounds = w[r, (r[None, :] - r[:, None]) % P].max(axis=1)
    diag, later = _large_ring_work(layout, P, s)
    assert diag == pytest.approx(rounds[0], rel=1e-12) and np.allclose(rounds[1:], later, rtol=1e-12)


@pytest.mark.parametrize("R,U,S", [(2, 2, 101), (3, 2, 100), (2, 3, 97), (4, 1, 103), (1, 4, 10)])
def test_local_token_range_bounds_every_rank_of_an_uneven_sequence(R, U, S):
    """The range the runtime checks shards against holds every rank's count, and both ends are attained."""
    from sp_plan.planner.layout import document_sp_tokens, local_token_range

    for layout in ("contiguous", "zigzag", "striped"):
        counts = [len(t) for ring_rank in document_sp_tokens(layout, U, R, [0, S]) for t in ring_rank]
        lo, hi = local_token_range(layout, R, U, S)
        assert (min(counts), max(counts)) == (lo, hi), (layout, counts)
