"""The algorithm registry's order: the built-in algorithms in the package's order, then any algorithm registered
later (an algorithm's place is its schedule's module), so the search enumerates the built-ins' variants first
whatever a user adds."""
from __future__ import annotations

from sp_plan.planner.algorithms import ALGORITHMS, Algorithm, Variant, register, variants
from sp_plan.planner.model import ModelSpec, Workload
from sp_plan.planner.search import Degrees
from sp_plan.planner.usp import ring_steps, usp_buffer_bytes

BUILT_INS = ["ring", "ulysses", "usp", "metp", "tokenring", "tokenring_ring", "wallfacer", "allgather"]


def _my_ring_steps(c, backward):
    return ring_steps(c, backward)


def _my_ring_variants(d, model, work):
    return [Variant("my_ring")]


def test_an_algorithm_registered_later_lists_after_the_built_ins():
    register(Algorithm("my_ring", _my_ring_steps, usp_buffer_bytes, variants=_my_ring_variants))
    try:
        assert list(ALGORITHMS) == BUILT_INS + ["my_ring"]
        m = ModelSpec(name="t", layers=1, hidden=1024, heads=16, vocab=0)
        found = [v.algorithm for v in variants(Degrees(1, 1, 1, 2, 4), m, Workload(seq_len="16k"))]
        assert found[-1] == "my_ring" and "my_ring" not in found[:-1]
    finally:
        ALGORITHMS.pop("my_ring")
    assert list(ALGORITHMS) == BUILT_INS
