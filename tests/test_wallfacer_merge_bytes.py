"""WallFacer's per-round merge (seeds/000 Algorithm 1): each round folds a team block of C N/P tokens into the
accumulators, so its memory pass moves what Ring's merge moves for a block of that length (a ring of P / C),
forward and backward."""
from __future__ import annotations

from sp_plan.planner.model import ModelSpec, Workload
from sp_plan.planner.schedules import Compute, Shape, attention_steps, merge_bytes

MODEL = ModelSpec(name="t", layers=1, hidden=2048, heads=16, kv_heads=4, vocab=0, dtype="bf16")


def _merges(c: Shape, backward: bool) -> list[float]:
    return [p.nbytes for st in attention_steps(c, backward) for p in st.phases
            if isinstance(p, Compute) and p.kind == "memory"]


def test_wallfacer_merge_is_rings_merge_at_the_team_block_length():
    work = Workload(seq_len=65536, causal=True, training=True)
    for P, C in ((16, 2), (16, 4), (64, 4)):
        wall = Shape(MODEL, work, dp=1, ulysses=1, ring=P, token_layout="zigzag", algorithm="wallfacer", team=C,
                     placement="collective_intra")
        team_block = Shape(MODEL, work, dp=1, ulysses=1, ring=P // C, token_layout="zigzag", algorithm="ring")
        assert team_block.n_ring == C * wall.n_ring
        for backward in (False, True):
            got = _merges(wall, backward)
            assert got and set(got) == {merge_bytes(team_block, backward)}, (P, C, backward)
