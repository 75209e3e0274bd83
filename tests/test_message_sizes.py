"""``--sizes`` as `profile links` and tune read it: binary units (K = 2^10, M = 2^20, G = 2^30), any case, an
optional B; sorted and deduplicated."""
from __future__ import annotations

import pytest

from sp_plan.planner.errors import PlanError
from sp_plan.profiles.discover.sizes import parse_sizes


def test_units_are_binary():
    assert parse_sizes("1G,2g,1GB") == [2**30, 2 * 2**30]
    assert parse_sizes("64M,1k,8") == [8, 1024, 64 * 2**20]


def test_eight_bytes_is_the_smallest_size():
    assert parse_sizes("8") == [8]
    with pytest.raises(PlanError, match="below 8 bytes"):
        parse_sizes("7")
