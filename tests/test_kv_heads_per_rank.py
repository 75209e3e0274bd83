"""The KV heads one rank attends (``local_kv_heads``), which all-gather gathers and ``kv_chunks`` must divide: the
model's KV heads over tp (one where tp exceeds them), then over Ulysses evenly, one replicated where Ulysses is a
multiple of them, else one per local query head; a plan's kv_chunks is checked against that count."""
from __future__ import annotations

import pytest

from sp_plan.planner import Plan, PlanError
from sp_plan.planner.plan import local_kv_heads
from sp_plan.profiles import load_model


@pytest.mark.parametrize("heads,kv,tp,u,want", [
    (32, 8, 1, 1, 8),    # every KV head
    (32, 8, 2, 2, 2),    # 8 / 2 / 2: even splits
    (32, 32, 4, 2, 4),   # 32 / 4 / 2
    (32, 8, 1, 16, 1),   # 16 is a multiple of 8: one head, replicated
    (32, 8, 4, 4, 1),    # 8 / 4 = 2 heads, 4 a multiple of 2: one
    (32, 8, 16, 1, 1),   # tp above the KV heads: one (Megatron)
    (24, 3, 1, 2, 12),   # 3 over 2 neither way: one per query head, 24 / 2
])
def test_kv_heads_a_rank_attends_by_hand(heads, kv, tp, u, want):
    assert local_kv_heads(heads, kv, tp, u) == want


def three_kv_heads():
    return load_model("llama3-8b").model_copy(update={"heads": 24, "kv_heads": 3})


def test_kv_chunks_divide_the_heads_after_tp_then_ulysses_not_the_other_way():
    model = three_kv_heads()
    # ulysses 2: 12 heads a rank (one per query head), so 12 chunks split them
    assert Plan(algorithm="allgather", degrees={"ring": 2, "ulysses": 2}, kv_chunks=12, model=model).kv_chunks == 12
    # tp 2: one KV head a rank, which no 2 chunks split
    with pytest.raises(PlanError, match="do not split the 1 KV heads") as e:
        Plan(algorithm="allgather", degrees={"ring": 2, "tp": 2}, kv_chunks=2, model=model)
    assert e.value.field == "kv_chunks"
