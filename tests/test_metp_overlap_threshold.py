"""METP's full-overlap condition (seeds/002 Sec. 3.3, eq. 5): the FFN hides its weight sends when m / p exceeds
the FLOPs-per-byte bound, with m = b s rows, so the sequence length it needs falls as 1/b with the batch."""
from __future__ import annotations

import pytest

from sp_plan.planner.metp import full_overlap_tokens

A100, NVLINK = 312e12, 300e9  # the paper's 1040 FLOPs/byte


@pytest.mark.parametrize("batch", [1, 2, 4])
def test_ffn_threshold_is_bound_times_p_over_batch(batch):
    p = 8
    t = full_overlap_tokens(A100, NVLINK, p, batch=batch)
    assert t["ffn"] == pytest.approx(1040 * p / batch)  # m / p > 1040 with m = b s
    assert t["mha"] == pytest.approx(max(1040 * p / batch, 3 * 1040))


def test_a_larger_batch_never_raises_the_threshold():
    t = [full_overlap_tokens(A100, NVLINK, 8, batch=b)["ffn"] for b in (1, 2, 4, 8)]
    assert t == sorted(t, reverse=True) and len(set(t)) == 4
