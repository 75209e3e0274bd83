"""A Python snippet with Hugging Face accelerate's ParallelismConfig (and its plugin) for a plan.

Targets accelerate 1.15.0 (huggingface/accelerate): accelerate/parallelism_config.py ParallelismConfig
(dp_replicate_size, dp_shard_size, tp_size, cp_size + TorchContextParallelConfig, sp_size with
sp_backend "deepspeed" + DeepSpeedSequenceParallelConfig; mesh ['dp_replicate', 'dp_shard', 'cp',
'sp', 'tp'] outermost first; cp and sp exclusive; tp/cp with data parallelism only over FSDP2's
dp_shard; FSDP2 needs dp_shard or cp above 1 to shard over, so tp alone runs without it). Context parallelism
is PyTorch's context_parallel (load-balanced: zigzag) with
TorchContextParallelConfig.cp_comm_strategy handed to torch's set_rotate_method (accelerator.py):
"allgather" all-gathers K and V once (sp-plan allgather), "alltoall" passes them one rank each round (sp-plan
ring; torch 2.13 torch/distributed/tensor/experimental/_context_parallel/_attention.py). Sequence parallelism
is DeepSpeed Ulysses (ZeRO from DeepSpeedPlugin). Packed documents do not reach either. No pipeline parallelism.
The model's dtype is Accelerator's ``mixed_precision`` ("bf16", "fp16", "no" for fp32), which the DeepSpeed and FSDP2
plugins take (state.py: set_mixed_precision on each).
"""
from __future__ import annotations

from sp_plan.planner.plan import Plan

from .target import Target, dtype, header

VERSION = "1.15.0"
#: sp-plan algorithm -> TorchContextParallelConfig.cp_comm_strategy (torch's rotate method)
CP_COMM_STRATEGY = {"ring": "alltoall", "allgather": "allgather"}
#: the model's dtype -> Accelerator(mixed_precision=...) (accelerate.utils.PrecisionType); written for fp32 too, since
#: the default comes from the environment and `accelerate config`
MIXED_PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}


def _rules(p: Plan) -> list[tuple[str, str]]:
    d = p.degrees
    if d["ulysses"] > 1 and d["tp"] > 1:
        return [("tp", "accelerate composes Ulysses (DeepSpeed) with data parallelism only, not with tp")]
    if (d["tp"] > 1 or d["ring"] > 1) and p.zero_stage == 1:
        return [("zero_stage", "accelerate composes tp/cp with FSDP2 (ZeRO-2 or ZeRO-3), which has no ZeRO-1")]
    if (d["tp"] > 1 or d["ring"] > 1) and d["dp"] > 1 and p.zero_stage == 0:
        return [("zero_stage", "accelerate composes tp/cp with data parallelism only over FSDP2 (ZeRO-2 or ZeRO-3)")]
    if d["ulysses"] == 1 and d["tp"] == 1 and d["ring"] == 1 and p.zero_stage == 1:
        return [("zero_stage", "accelerate's FSDP2 has no ZeRO-1")]
    return []


def render(p: Plan) -> str:
    d = p.degrees
    seq = p.workload.seq_len if p.workload else None
    ckpt = p.checkpointing == "full"
    mp = f', mixed_precision="{MIXED_PRECISION[dtype(p)]}"'
    if d["ulysses"] > 1:
        body = f'''from accelerate import Accelerator
from accelerate.parallelism_config import ParallelismConfig
from accelerate.utils import DeepSpeedPlugin, DeepSpeedSequenceParallelConfig

parallelism_config = ParallelismConfig(
    dp_replicate_size=1, dp_shard_size=1, sp_size={d["ulysses"]}, sp_backend="deepspeed",
    sp_handler=DeepSpeedSequenceParallelConfig(sp_seq_length={seq}, sp_seq_length_is_variable={seq is None}),
)
plugin = DeepSpeedPlugin(zero_stage={p.zero_stage})  # {d["dp"]} data-parallel replicas of the {d["ulysses"]}-rank Ulysses group
'''
        make = f"Accelerator(parallelism_config=parallelism_config, deepspeed_plugin=plugin{mp})"
    else:
        # FSDP2 shards over dp_shard x cp: with neither above 1 _validate_accelerator refuses it (tp alone, one rank)
        fsdp = (d["tp"] > 1 or d["ring"] > 1 or p.zero_stage >= 2) and (d["dp"] > 1 or d["ring"] > 1)
        sizes = (f"dp_replicate_size=1, dp_shard_size={d['dp']}" if fsdp else f"dp_replicate_size={d['dp']}, dp_shard_size=1")
        cp = (f', cp_size={d["ring"]}, '
              f'cp_handler=TorchContextParallelConfig(cp_comm_strategy="{CP_COMM_STRATEGY[p.algorithm]}")'
              if d["ring"] > 1 else "")
        body = f'''from accelerate import Accelerator
from accelerate.parallelism_config import ParallelismConfig
from accelerate.utils import FullyShardedDataParallelPlugin, TorchContextParallelConfig

parallelism_config = ParallelismConfig({sizes}, tp_size={d["tp"]}{cp})
'''
        if fsdp:
            body += (f"plugin = FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward={p.zero_stage == 3}, "
                     f"activation_checkpointing={ckpt})\n")
            make = f"Accelerator(parallelism_config=parallelism_config, fsdp_plugin=plugin{mp})"
        else:
            make = f"Accelerator(parallelism_config=parallelism_config{mp})"
    tail = "" if not ckpt or "FullyShardedDataParallelPlugin(" in body else \
        "    # full checkpointing: call model.gradient_checkpointing_enable() before accelerator.prepare\n"
    return header(p, TARGET) + body + f'''

def make_accelerator() -> Accelerator:
    """The Accelerator for this plan (launch {p.world_size} processes)."""
{tail}    return {make}
'''


TARGET = Target(
    name="accelerate", title=f"Hugging Face accelerate {VERSION} (accelerate/parallelism_config.py ParallelismConfig)",
    render=render, suffix=".py", algorithms=("ring", "ulysses", "allgather"),
    orders=(("tp", "ring", "dp"), ("ulysses", "dp")), token_layouts=("zigzag",),
    checkpointing=("none", "full"), extra=_rules,
    notes={"usp": "accelerate has no USP (its cp (Ring) and sp (Ulysses) are exclusive)",
           "documents": "accelerate's context and sequence parallelism take no packed documents"},
)
