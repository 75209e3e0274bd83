"""WallFacer's team orders per sub-ring round (``layout._round_orders``) with one-member teams, in closed form: the
same team in the first round alone, an earlier and a later one in every other, as the pairs themselves give."""
from __future__ import annotations

from sp_plan.planner.layout import PLACEMENTS, _round_orders, wallfacer_pairs


def test_one_member_teams_closed_form_matches_the_pairs():
    n = 0
    for P in (1, 2, 3, 4, 8, 12, 16, 64, 100, 256, 512):
        for pl in (*PLACEMENTS, None):
            for bwd in (False, True):
                pairs = wallfacer_pairs(P, 1, pl, bwd)
                u, v = pairs[..., 0], pairs[..., 1]
                got = _round_orders(P, 1, pl, bwd)
                for want, have in zip(((v < u).any(axis=0), (v == u).any(axis=0), (v > u).any(axis=0)), got):
                    assert have.dtype == bool and have.shape == want.shape and (have == want).all(), (P, pl, bwd)
                    assert not have.flags.writeable  # cached: shared by every caller
                n += 1
    assert n > 40
