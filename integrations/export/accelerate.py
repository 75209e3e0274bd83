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
is DeepSpeed Ulysses (ZeRO from DeepSpeedPlugin; accelerator.py registers DeepSpeed's UlyssesSPAttentionHF and
UlyssesSPDataLoaderAdapter, so its head split is DeepSpeed's: KV heads evenly or replicated). Packed documents reach
the Ulysses half through position_ids that restart at each document (DeepSpeed all-gathers them and FlashAttention-2's
varlen path finds the documents from them: the snippet sets sp_attn_implementation "flash_attention_2"), not torch's
context_parallel. FSDP2 shards over dp_shard x cp (fsdp_dim_names
"dp_shard_cp"), so context parallelism trains under it: ZeRO-2 or ZeRO-3, never 0 or 1 (inference keeps no
gradients or optimizer state, so its ZeRO-0 is FSDP2 without resharding). No pipeline parallelism.
The model's dtype is Accelerator's ``mixed_precision`` ("bf16", "fp16", "no" for fp32), which the DeepSpeed and FSDP2
plugins take (state.py: set_mixed_precision on each).
"""
from __future__ import annotations

from sp_plan.planner.plan import Plan

from .target import Target, batch_split, dtype, header

VERSION = "1.15.0"
#: sp-plan algorithm -> TorchContextParallelConfig.cp_comm_strategy (torch's rotate method)
CP_COMM_STRATEGY = {"ring": "alltoall", "allgather": "allgather"}
#: the model's dtype -> Accelerator(mixed_precision=...) (accelerate.utils.PrecisionType); written for fp32 too, since
#: the default comes from the environment and `accelerate config`
MIXED_PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}


def _degree_rules(d: dict[str, int]) -> list[tuple[str, str]]:
    """Ulysses is DeepSpeed's, beside data parallelism alone."""
    if d["ulysses"] > 1 and d["tp"] > 1:
        return [("tp", "accelerate composes Ulysses (DeepSpeed) with data parallelism only, not with tp")]
    return []


def _zero_rule(d: dict[str, int], zero: int) -> str | None:
    """Why accelerate cannot run ZeRO-``zero`` with these degrees: its cp runs under FSDP2 (ZeRO-2/3) always, its tp
    beside data parallelism only over FSDP2, and FSDP2 has no ZeRO-1; DeepSpeed (Ulysses) runs any stage."""
    if d["ulysses"] > 1 or zero >= 2:
        return None
    if d["ring"] > 1:
        return (f"accelerate runs context parallelism under FSDP2, which shards over the cp ranks (ZeRO-2 or ZeRO-3), "
                f"so it has no ZeRO-{zero} with cp")
    if zero == 1:
        return "accelerate composes tp with FSDP2 (ZeRO-2 or ZeRO-3), which has no ZeRO-1" if d["tp"] > 1 else \
            "accelerate's FSDP2 has no ZeRO-1"
    if d["tp"] > 1 and d["dp"] > 1:
        return "accelerate composes tp with data parallelism only over FSDP2 (ZeRO-2 or ZeRO-3)"
    return None


def _ulysses_body(p: Plan, seq: int | None) -> str:
    """The snippet's ParallelismConfig and DeepSpeedPlugin for DeepSpeed's Ulysses."""
    d, packed = p.degrees, p.workload is not None and p.workload.documents is not None
    # FlashAttention-2 finds packed documents from the all-gathered position_ids (ulysses_sp.py: "FA2 uses them for
    # packed-sequence detection")
    attn = ', sp_attn_implementation="flash_attention_2"' if packed else ""
    note = ("# packed documents: position_ids must restart at each document; DeepSpeed's Ulysses all-gathers them and "
            "FlashAttention-2's varlen path finds the documents from them\n") if packed else ""
    return f'''from accelerate import Accelerator
from accelerate.parallelism_config import ParallelismConfig
from accelerate.utils import DeepSpeedPlugin, DeepSpeedSequenceParallelConfig

{note}parallelism_config = ParallelismConfig(
    dp_replicate_size=1, dp_shard_size=1, sp_size={d["ulysses"]}, sp_backend="deepspeed",
    sp_handler=DeepSpeedSequenceParallelConfig(sp_seq_length={seq}, sp_seq_length_is_variable={seq is None}{attn}),
)
plugin = DeepSpeedPlugin(zero_stage={p.zero_stage})  # {d["dp"]} data-parallel replicas of the {d["ulysses"]}-rank Ulysses group
'''


def accumulation(p: Plan) -> str:
    """The Accelerator argument that keeps FSDP2 reduce-scattering every micro-batch, as the planner prices ZeRO-2/3
    and its sharded-gradient memory: ``accelerate``'s accumulate otherwise holds the sync (``no_sync``:
    set_requires_gradient_sync(False), accelerator.py) and keeps whole gradients until the last micro-batch."""
    steps = batch_split(p)[2]
    if steps <= 1:
        return ""
    return f", gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps={steps}, sync_each_batch=True)"


def render(p: Plan) -> str:
    d = p.degrees
    seq = p.workload.seq_len if p.workload else None
    ckpt = p.checkpointing == "full"
    mp = f', mixed_precision="{MIXED_PRECISION[dtype(p)]}"'
    if d["ulysses"] > 1:
        body = _ulysses_body(p, seq)
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
from accelerate.utils import FullyShardedDataParallelPlugin, GradientAccumulationPlugin, TorchContextParallelConfig

parallelism_config = ParallelismConfig({sizes}, tp_size={d["tp"]}{cp})
'''
        if fsdp:
            body += (f"plugin = FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward={p.zero_stage == 3}, "
                     f"activation_checkpointing={ckpt})\n")
            make = f"Accelerator(parallelism_config=parallelism_config, fsdp_plugin=plugin{mp}{accumulation(p)})"
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
    checkpointing=("none", "full"), documents=("ulysses",), ulysses_heads="replicate", degree_rules=_degree_rules,
    zero_rule=_zero_rule,
    notes={"usp": "accelerate has no USP (its cp (Ring) and sp (Ulysses) are exclusive)",
           "documents": "accelerate's context parallelism (torch's context_parallel) takes no packed documents; its "
                        "DeepSpeed Ulysses does"},
)
