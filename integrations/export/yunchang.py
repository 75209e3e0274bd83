"""A Python snippet that sets up yunchang (USP) for a plan.

Targets yunchang 0.6.4 (feifeibear/long-context-attention): yunchang/globals.py
``set_seq_parallel_pg(sp_ulysses_degree, sp_ring_degree, rank, world_size, use_ulysses_low=True)``
(use_ulysses_low: Ulysses groups on consecutive ranks, i.e. mesh order ulysses<ring; False: ring<ulysses;
data parallel outside the sequence group), LongContextAttention(ring_impl_type=...) with the ring
implementation of the token layout ("basic" contiguous, "zigzag", "strip" striped; hybrid/utils.py
RING_IMPL_DICT) and EXTRACT_FUNC_DICT (comm/extract_local.py) to take this rank's tokens. yunchang is
the attention only: tensor and pipeline parallelism are not its to set. Its all-to-all (comm/all_to_all.py
SeqAllToAll4D) reshapes the heads to (ulysses, heads // ulysses) for q, k and v alike and repeats no KV head, so
the Ulysses degree must divide the query and the KV heads.
"""
from __future__ import annotations

from sp_plan.planner.plan import Plan

from .target import Target, header

VERSION = "0.6.4"
RING_IMPL = {"contiguous": "basic", "zigzag": "zigzag", "striped": "strip"}


def settings(p: Plan) -> dict:
    """set_seq_parallel_pg's degrees and placement flag, and the ring implementation."""
    d = p.degrees
    ulysses_low = d["ulysses"] == 1 or d["ring"] == 1 or p.order.index("ulysses") < p.order.index("ring")
    return {"ulysses": d["ulysses"], "ring": d["ring"], "use_ulysses_low": ulysses_low,
            "ring_impl_type": RING_IMPL[p.token_layout]}


def _rules(p: Plan) -> list[tuple[str, str]]:
    """yunchang's basic and strip token splits take chunk ``rank`` of the sequence (comm/extract_local.py), which is
    the plan's tokens only when Ulysses ranks are innermost; its zigzag split follows the groups, any order."""
    d = p.degrees
    if d["ulysses"] > 1 and d["ring"] > 1 and p.token_layout != "zigzag" and p.order.index("ring") < p.order.index("ulysses"):
        return [("order", f"yunchang's {RING_IMPL[p.token_layout]} token split assumes use_ulysses_low "
                 f"(ulysses<ring); with ring<ulysses it splits tokens zigzag only")]
    return []


def render(p: Plan) -> str:
    s = settings(p)
    return header(p, TARGET) + f'''import torch.distributed as dist
from yunchang import EXTRACT_FUNC_DICT, LongContextAttention, set_seq_parallel_pg

ULYSSES_DEGREE, RING_DEGREE = {s["ulysses"]}, {s["ring"]}
SP_DEGREE = ULYSSES_DEGREE * RING_DEGREE
set_seq_parallel_pg(ULYSSES_DEGREE, RING_DEGREE, dist.get_rank(), dist.get_world_size(), use_ulysses_low={s["use_ulysses_low"]})
RING_IMPL_TYPE = "{s["ring_impl_type"]}"


def make_attention() -> LongContextAttention:
    """The sequence-parallel attention (q, k, v: batch, local sequence, heads, head dim)."""
    return LongContextAttention(ring_impl_type=RING_IMPL_TYPE)


def local_tokens(x):
    """This rank's part of a full-sequence tensor x (batch, sequence, ...) in the plan's token layout."""
    return EXTRACT_FUNC_DICT[RING_IMPL_TYPE](x, dist.get_rank() % SP_DEGREE, SP_DEGREE, RING_DEGREE, ULYSSES_DEGREE)
'''


TARGET = Target(
    name="yunchang", title=f"yunchang {VERSION} (feifeibear/long-context-attention, yunchang/globals.py set_seq_parallel_pg)",
    render=render, suffix=".py", algorithms=("ring", "ulysses", "usp"),
    orders=(("ulysses", "ring", "dp"), ("ring", "ulysses", "dp")), extra=_rules, ulysses_heads="divide",
    notes={"tp": "yunchang has no tp (it is the attention only; set tensor parallelism in your trainer)",
           "pp": "yunchang has no pp (it is the attention only)"},
)
