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
with ``overlap_comm`` (on by default for stage 3 only: runtime/zero/config.py), in buckets of a layer as the planner
prices them (``zero_section``). Two things run exposed that the planner hides: without ZeRO, DeepSpeed's engine
all-reduces the gradients after the backward; ZeRO-1/2 gather the updated weights inside the optimizer step
(stage_1_and_2.py), not behind the next forward.
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
           "zero_optimization": zero_section(p),
           "bf16": {"enabled": dt == "bf16"}, "fp16": {"enabled": dt == "fp16"},
           "sequence_parallel_size": p.degrees["ulysses"]}
    if p.checkpointing == "full":
        out["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": False}
    return out


def zero_section(p: Plan) -> dict:
    """zero_optimization: the stage; for ZeRO 1-3 the reduction overlapped with the backward (``overlap_comm``, on by
    default for stage 3 only: runtime/zero/config.py), in buckets of a layer's parameters as the planner prices them
    (``Estimator.sync_bucket``; DeepSpeed's default is 5e8 elements: one bucket for a model of fewer, which the
    backward hides none of)."""
    out: dict = {"stage": p.zero_stage}
    if p.zero_stage:
        out["overlap_comm"] = True
        if p.model is not None:
            layer = int(p.model.layer_params())
            out["reduce_bucket_size"] = layer
            if p.zero_stage < 3:
                out["allgather_bucket_size"] = layer
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
