"""The team sizes the search tries: TokenRing x Ring every proper divisor of the ring above 1, each once (a ring
that is a perfect square included), so no candidate is ranked twice."""
from __future__ import annotations

import pytest

from sp_plan.planner import Workload
from sp_plan.planner.algorithms import variants
from sp_plan.planner.search import Degrees
from sp_plan.profiles import load_model


@pytest.mark.parametrize("ring", [4, 8, 9, 16, 36, 64])
def test_tokenring_ring_tries_each_proper_divisor_once(ring):
    m, w = load_model("llama3-8b"), Workload(seq_len="64k", causal=True)
    teams = [v.team for v in variants(Degrees(1, 1, 1, 1, ring), m, w) if v.algorithm == "tokenring_ring"]
    assert teams == [t for t in range(2, ring) if ring % t == 0]
