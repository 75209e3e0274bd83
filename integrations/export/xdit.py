"""xDiT (xfuser) command-line arguments for a plan: Ulysses and Ring degrees for diffusion inference.

Targets xfuser 0.7.0 (xdit-project/xDiT): xfuser/config/args.py ``--ulysses_degree``, ``--ring_degree``,
``--data_parallel_degree``, ``--tensor_parallel_degree`` (flags recorded in
tests/fixtures/export/xdit_flags.json). Ranks are ordered 'tp-sp-pp-cfg-dp'
(xfuser/core/distributed/parallel_state.py) and the sequence group is split by yunchang's
set_seq_parallel_pg with its default use_ulysses_low=True (ulysses<ring); its ring is yunchang's
"basic" (contiguous tokens). That call passes the world rank and the world size
(parallel_state.py initialize_model_parallel), so yunchang's Ulysses and ring groups are consecutive world ranks
whatever xfuser's own tp-sp order: with tp and sequence parallelism together they mix tp ranks, and neither the
plan's groups nor xfuser's sp groups; tp runs only without sequence parallelism. Its attention is yunchang's
LongContextAttention (xfuser/core/long_ctx_attention/hybrid/attn_layer.py), which repeats no KV head, so the Ulysses
degree must divide the query and the KV heads. xDiT runs inference; PipeFusion is patch pipelining, not a layer
pipeline.
"""
from __future__ import annotations

from sp_plan.planner.plan import Plan

from .target import Target, header

VERSION = "0.7.0"


def arguments(p: Plan) -> list[str]:
    d = p.degrees
    args = ["--ulysses_degree", str(d["ulysses"]), "--ring_degree", str(d["ring"]),
            "--data_parallel_degree", str(d["dp"])]
    if d["tp"] > 1:
        args += ["--tensor_parallel_degree", str(d["tp"])]
    return args


def _degree_rules(d: dict[str, int]) -> list[tuple[str, str]]:
    """tp beside Ulysses or Ring: yunchang's groups are built over world ranks, which tp's ranks interleave."""
    if d["tp"] > 1 and d["ulysses"] * d["ring"] > 1:
        return [("tp", "xfuser builds yunchang's Ulysses and ring groups over consecutive world ranks, ignoring tp "
                 f"(set_seq_parallel_pg gets the world rank): with tp {d['tp']} they would mix tp ranks; xdit runs tp "
                 "only without ulysses or ring")]
    return []


def render(p: Plan) -> str:
    a = arguments(p)
    return header(p, TARGET) + " \\\n".join(" ".join(a[i:i + 2]) for i in range(0, len(a), 2)) + "\n"


TARGET = Target(
    name="xdit", title=f"xDiT (xfuser {VERSION}, xfuser/config/args.py)", render=render, suffix=".args",
    algorithms=("ring", "ulysses", "usp"), orders=(("tp", "ulysses", "ring", "dp"),),
    token_layouts=("contiguous",), zero_stages=(0,), checkpointing=("none",), training=False,
    ulysses_heads="divide", degree_rules=_degree_rules,
)
