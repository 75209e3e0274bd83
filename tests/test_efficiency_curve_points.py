"""An efficiency curve reads the same whatever order its points are given in (a profile file, a hand-written
YAML, an import): the points are kept sorted by size, and the curve interpolates log-linearly between neighbours
and stays flat past either end."""
from __future__ import annotations

import pytest

from sp_plan.planner.params import Curve


@pytest.mark.parametrize("points", [((1000, 0.2), (4000, 0.4), (16000, 0.5)),
                                    ((16000, 0.5), (1000, 0.2), (4000, 0.4)),
                                    ((4000, 0.4), (16000, 0.5), (1000, 0.2))])
def test_points_in_any_order_read_as_sorted(points):
    c = Curve(points=points)
    assert [x for x, _ in c.points] == [1000, 4000, 16000]
    assert c.at(2000) == pytest.approx(0.3)  # halfway in log size between 1000 and 4000
    assert c.at(8000) == pytest.approx(0.45)  # halfway between 4000 and 16000
    assert c.at(10) == 0.2 and c.at(1e9) == 0.5
