"""METP's weight broadcast (seeds/002 Sec. 4.2.1): a binomial tree over the tp group sends each head group's
W_qkv, W_proj slice ceil(log2 p) times, so p outer iterations move ceil(log2 p) x 4 h^2 elements forward, the
paper's 4 log2(p) h^2 where p is a power of two; a tp group of 6 needs 3 tree levels, not 2."""
from __future__ import annotations

import math

import pytest

from sp_plan.planner.metp import metp_steps
from sp_plan.planner.model import ModelSpec, Workload
from sp_plan.planner.schedules import Comm, Shape

HIDDEN, HEADS = 3072, 24


def _shape(p: int) -> Shape:
    m = ModelSpec(name="mha", layers=1, hidden=HIDDEN, heads=HEADS, kv_heads=HEADS, ffn_hidden=4 * HIDDEN,
                  gated_mlp=False, vocab=32000, dtype="bf16")
    w = Workload(seq_len=24 * 1024, batch=1, causal=False, training=True)
    return Shape(m, w, dp=1, ulysses=1, ring=1, token_layout="contiguous", tp=p, algorithm="metp")


def _broadcast_bytes(c: Shape) -> float:
    return sum(ph.nbytes * st.repeat for st in metp_steps(c, False) for ph in st.phases
               if isinstance(ph, Comm) and "broadcast" in ph.name)


@pytest.mark.parametrize("p, levels", [(2, 1), (3, 2), (4, 2), (6, 3), (8, 3)])
def test_forward_broadcast_sends_each_slice_once_per_tree_level(p, levels):
    assert levels == math.ceil(math.log2(p))  # the binomial tree's depth, by hand above
    c = _shape(p)
    slices = 4 * HIDDEN * HIDDEN * c.e  # W_qkv (h x 3h) and W_proj (h x h), all p slices together
    assert _broadcast_bytes(c) == pytest.approx(levels * slices, rel=1e-12)
