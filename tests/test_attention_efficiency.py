"""Which measured efficiency an attention call is priced at.

A dense block reads the profile's forward or backward curve at its length, a part-filled one (a causal diagonal, a
zigzag half) at the square block of as many query x key pairs (length x sqrt(fill)); a block under a causal mask
reads the masked forward or backward curve at its own length. Each read is its own: the same length at another
fill, or forward after backward, gets its own curve's value however often and in whatever order they are asked.
"""
from __future__ import annotations

import pytest

from sp_plan.planner import Estimator, Workload
from sp_plan.planner.params import Curve, Params
from sp_plan.profiles import load_cluster, load_model

# log-linear: 2000 tokens lie halfway between 1000 and 4000, so each curve reads its two ends' mean there
FWD = Curve(points=((1000, 0.2), (4000, 0.4)))
BWD = Curve(points=((1000, 0.1), (4000, 0.3)))
FWD_MASKED = Curve(points=((1000, 0.15), (4000, 0.35)))
BWD_MASKED = Curve(points=((1000, 0.05), (4000, 0.25)))


def _estimator() -> Estimator:
    params = Params(attention_fwd=FWD, attention_bwd=BWD, attention_fwd_masked=FWD_MASKED,
                    attention_bwd_masked=BWD_MASKED)
    return Estimator(load_cluster("dgx-h100", 1), load_model("llama3-8b"), Workload(seq_len=8192), params=params)


def test_a_quarter_filled_block_after_a_full_one_of_its_length_reads_the_half_length():
    est = _estimator()
    assert est.attention_efficiency(False, 4000, 1.0) == pytest.approx(0.4)
    assert est.attention_efficiency(False, 4000, 0.25) == pytest.approx(0.3)  # the 2000-token square
    assert est.attention_efficiency(True, 4000, 0.25) == pytest.approx(0.2)
    assert est.attention_efficiency(True, 4000, 1.0) == pytest.approx(0.3)


@pytest.mark.parametrize("first", [False, True])
def test_masked_blocks_read_the_masked_curve_of_their_direction(first):
    est = _estimator()
    want = {False: 0.25, True: 0.15}  # at 2000 tokens: forward (0.15 + 0.35) / 2, backward (0.05 + 0.25) / 2
    for backward in (first, not first):
        assert est.attention_efficiency(backward, 2000, 0.5, masked=True) == pytest.approx(want[backward])
