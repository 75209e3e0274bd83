"""A DeepSpeed config (JSON) for a plan: ZeRO stage, batch sizes and the Ulysses sequence-parallel size.

Targets DeepSpeed 0.19.8 (deepspeedai/DeepSpeed): deepspeed/runtime/config.py DeepSpeedConfig reads
train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x data-parallel size,
zero_optimization.stage, bf16/fp16, and ``sequence_parallel_size`` (the Ulysses degree; Hugging Face
models get it through UlyssesSPAttentionHF.register_with_transformers(..., sequence_parallel_size=...)
in deepspeed/runtime/sequence_parallel/ulysses_sp.py). Sequence-parallel groups are consecutive ranks
(runtime/sequence_parallel/parallel_state_sp.py), data parallel outside them. DeepSpeed has no Ring
attention; tensor and pipeline parallelism are not set by this config. ``full`` checkpointing writes
the activation_checkpointing section; the model's blocks must still be wrapped (Hugging Face:
model.gradient_checkpointing_enable()). UlyssesSPAttentionHF splits the query heads evenly over the Ulysses ranks and
the KV heads evenly or, where the degree is a multiple of them, replicated (ulysses_sp.py kv_replication_factor).
Packed documents reach its Ulysses through position_ids that restart at each document: the attention all-gathers
them over the sequence-parallel group and FlashAttention-2's varlen path finds the documents from them (ulysses_sp.py
UlyssesSPAttentionHF.forward, "FA2 uses them for packed-sequence detection"; UlyssesSPDataLoaderAdapter asks for
position_ids in every batch); the config has no setting for them, so the data collator writes them and the model
attends with core_attn_implementation "flash_attention_2". ZeRO 1-3 reduce the gradients during the backward
with ``overlap_comm`` (on by default for stage 3 only: runtime/zero/config.py), as the planner prices them; without
ZeRO, DeepSpeed's engine all-reduces them after the backward, which the planner counts as hidden but for the
last bucket.
"""
from __future__ import annotations

import json

from sp_plan.planner.plan import Plan

from .target import Target, batch_split, dtype

VERSION = "0.19.8"


def config(p: Plan) -> dict:
    """The DeepSpeed config dict for ``p``."""
    batch, mbs, gas = batch_split(p)
    dt = dtype(p)
    out = {"train_batch_size": batch, "train_micro_batch_size_per_gpu": mbs, "gradient_accumulation_steps": gas,
           "zero_optimization": {"stage": p.zero_stage, **({"overlap_comm": True} if p.zero_stage else {})},
           "bf16": {"enabled": dt == "bf16"}, "fp16": {"enabled": dt == "fp16"},
           "sequence_parallel_size": p.degrees["ulysses"]}
    if p.checkpointing == "full":
        out["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": False}
    return out


def render(p: Plan) -> str:
    return json.dumps(config(p), indent=2) + "\n"


TARGET = Target(
    name="deepspeed", title=f"DeepSpeed {VERSION} (deepspeed/runtime/config.py DeepSpeedConfig)",
    render=render, suffix=".json", algorithms=("ulysses",), orders=(("ulysses", "dp"),),
    checkpointing=("none", "full"), documents=("ulysses",), ulysses_heads="replicate",
    notes={"ring": "deepspeed has no Ring attention (its sequence parallelism is Ulysses)",
           "usp": "deepspeed has no Ring attention, so no USP (its sequence parallelism is Ulysses)"},
)
