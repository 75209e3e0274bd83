"""A plan's sequence must split evenly over its ring's chunks, its Ulysses ranks and its tensor-parallel ranks.

Megatron's sequence parallelism cuts each rank's share of the sequence again over the tp ranks, so the estimator
refuses a sequence length that is not a multiple of (ring chunks x ulysses x tp), naming ``seq_len`` and the
multiple to use: the layout's chunks (a ring of r ranks: r contiguous pieces, 2r zigzag pieces) times ulysses
times tp. A length that is such a multiple is accepted.
"""
from __future__ import annotations

import pytest

from sp_plan.planner import Candidate, Estimator, PlanError, Workload
from sp_plan.profiles import load_cluster, load_model

CASES = [  # (token layout, ring, ulysses, tp, the multiple by hand)
    ("contiguous", 2, 1, 4, 2 * 1 * 4),
    ("zigzag", 2, 1, 4, 2 * 2 * 1 * 4),
    ("zigzag", 2, 2, 2, 2 * 2 * 2 * 2),
]


def estimator(seq_len):
    return Estimator(load_cluster("dgx-h100", 1), load_model("llama3-8b"), Workload(seq_len=seq_len, batch=1))


def candidate(layout, ring, ulysses, tp):
    return Candidate("usp", ring=ring, ulysses=ulysses, tp=tp, order=("tp", "ulysses", "ring"), token_layout=layout)


@pytest.mark.parametrize("layout, ring, ulysses, tp, multiple", CASES)
def test_a_length_the_chunks_split_but_tp_does_not_is_refused(layout, ring, ulysses, tp, multiple):
    seq_len = 4096 * multiple + multiple // tp  # a multiple of the ring and ulysses chunks, not of tp as well
    with pytest.raises(PlanError, match=f"seq_len: {seq_len} is not divisible by {multiple} .*use a multiple of "
                                        f"{multiple}"):
        estimator(seq_len).check(candidate(layout, ring, ulysses, tp))


@pytest.mark.parametrize("layout, ring, ulysses, tp, multiple", CASES)
def test_a_multiple_of_chunks_ulysses_and_tp_is_accepted(layout, ring, ulysses, tp, multiple):
    estimator(4096 * multiple).check(candidate(layout, ring, ulysses, tp))
