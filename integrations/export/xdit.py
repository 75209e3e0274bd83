"""xDiT (xfuser) command-line arguments for a plan: Ulysses and Ring degrees for diffusion inference.

Targets xfuser 0.7.0 (xdit-project/xDiT): xfuser/config/args.py ``--ulysses_degree``, ``--ring_degree``,
``--data_parallel_degree``, ``--tensor_parallel_degree`` (flags recorded in
tests/fixtures/export/xdit_flags.json). Ranks are ordered 'tp-sp-pp-cfg-dp'
(xfuser/core/distributed/parallel_state.py) and the sequence group is split by yunchang's
set_seq_parallel_pg with its default use_ulysses_low=True (ulysses<ring); its ring is yunchang's
"basic" (contiguous tokens). xDiT runs inference; PipeFusion is patch pipelining, not a layer pipeline.
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


def render(p: Plan) -> str:
    a = arguments(p)
    return header(p, TARGET) + " \\\n".join(" ".join(a[i:i + 2]) for i in range(0, len(a), 2)) + "\n"


TARGET = Target(
    name="xdit", title=f"xDiT (xfuser {VERSION}, xfuser/config/args.py)", render=render, suffix=".args",
    algorithms=("ring", "ulysses", "usp"), orders=(("tp", "ulysses", "ring", "dp"),),
    token_layouts=("contiguous",), zero_stages=(0,), checkpointing=("none",), training=False,
)
