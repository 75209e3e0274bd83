"""Megatron-LM command-line arguments for a plan.

Targets NVIDIA/Megatron-LM at commit d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22),
megatron/training/arguments.py (flags recorded in tests/fixtures/export/megatron_flags.json), and
Megatron-Core 0.16.1 (ModelParallelConfig, TransformerConfig). Context parallelism: ``--cp-comm-type``
p2p (Ring), a2a (Ulysses) or a2a+p2p (USP) with ``--hierarchical-context-parallel-sizes`` listing the
inner (a2a) level first (parallel_state.create_hierarchical_groups); get_batch_on_this_cp_rank splits
the sequence into 2 x cp chunks, so a causal ring is always zigzag. Rank order 'tp-cp-ep-dp-pp', or
'tp-cp-ep-pp-dp' with ``--use-tp-pp-dp-mapping`` (training/initialize.py). ZeRO-1 is the distributed
optimizer; ZeRO-2/3 are Megatron-FSDP's optim_grads / optim_grads_params sharding.
"""
from __future__ import annotations

from sp_plan.planner.plan import Plan

from .target import Target, batch_split, header

COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
CP_COMM = {"ring": "p2p", "ulysses": "a2a", "usp": "a2a+p2p"}
SHARDING = {2: "optim_grads", 3: "optim_grads_params"}


def arguments(p: Plan) -> list[str]:
    """The Megatron-LM arguments for ``p``, as argv words."""
    d = p.degrees
    cp = d["ulysses"] * d["ring"]
    args = ["--tensor-model-parallel-size", str(d["tp"]), "--pipeline-model-parallel-size", str(d["pp"]),
            "--context-parallel-size", str(cp)]
    if cp > 1:
        args += ["--cp-comm-type", CP_COMM[p.algorithm]]
        if p.algorithm == "usp":
            args += ["--hierarchical-context-parallel-sizes", str(d["ulysses"]), str(d["ring"])]
    if d["tp"] > 1:
        args.append("--sequence-parallel")
    if p.zero_stage >= 1:
        args.append("--use-distributed-optimizer")
    if p.zero_stage >= 2:
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", SHARDING[p.zero_stage]]
    if p.checkpointing == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if d["pp"] > 1 and d["dp"] > 1 and p.order.index("pp") < p.order.index("dp"):
        args.append("--use-tp-pp-dp-mapping")
    batch, mbs, _ = batch_split(p)
    args += ["--micro-batch-size", str(mbs), "--global-batch-size", str(batch)]
    if p.workload:
        args += ["--seq-length", str(p.workload.seq_len)]
    return args


def render(p: Plan) -> str:
    words = arguments(p)
    lines, cur = [], []
    for w in words:  # one flag and its values per line
        if w.startswith("--") and cur:
            lines.append(" ".join(cur))
            cur = []
        cur.append(w)
    lines.append(" ".join(cur))
    return header(p, TARGET) + " \\\n".join(lines) + "\n"


TARGET = Target(
    name="megatron", title=f"Megatron-LM (NVIDIA/Megatron-LM {COMMIT[:7]}, megatron/training/arguments.py)",
    render=render, suffix=".args", algorithms=("ring", "ulysses", "usp"),
    orders=(("tp", "ulysses", "ring", "dp", "pp"), ("tp", "ulysses", "ring", "pp", "dp")),
    token_layouts=("zigzag",), checkpointing=("none", "full"),
)
