"""Team sizes the planner refuses by name: TokenRing x Ring's team must be a proper divisor of the ring (2 <= team
< ring, so at least two teams share the outer ring); a team as large as the ring is plain TokenRing."""
from __future__ import annotations

import pytest

from sp_plan.planner.algorithms import ALGORITHMS
from sp_plan.planner.candidate import Candidate
from sp_plan.planner.errors import PlanError


@pytest.mark.parametrize("ring,team", [(4, 4), (8, 8), (8, 3), (8, 1), (16, 32)])
def test_tokenring_ring_refuses_a_team_that_is_not_a_proper_divisor(ring, team):
    with pytest.raises(PlanError) as e:
        ALGORITHMS["tokenring_ring"].check(Candidate("tokenring_ring", ring=ring, team=team), None, None)
    assert e.value.field == "degrees.team"


@pytest.mark.parametrize("ring,team", [(4, 2), (8, 2), (8, 4), (16, 8)])
def test_tokenring_ring_accepts_every_proper_divisor(ring, team):
    ALGORITHMS["tokenring_ring"].check(Candidate("tokenring_ring", ring=ring, team=team), None, None)
