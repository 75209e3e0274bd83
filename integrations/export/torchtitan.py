"""torchtitan command-line overrides (its job config's parallelism and training sections) for a plan.

Targets torchtitan 0.3.0 (pytorch/torchtitan): torchtitan/config/configs.py ParallelismConfig and
TrainingConfig, set from the command line as ``--parallelism.<field> <value>`` (tyro, fields recorded in
tests/fixtures/export/torchtitan_config.json), and the ``activation_checkpoint:{full,none}`` subcommand
(torchtitan/distributed/activation_checkpoint.py). Context parallelism is PyTorch's context_parallel with the
"headtail" load balancer (zigzag) or none (contiguous); no Ulysses. torchtitan 0.3.0 sets no rotate method, so
PyTorch's default runs: "allgather" (torch 2.13 torch/distributed/tensor/experimental/_context_parallel/
_attention.py, _cp_options.rotate_method), which all-gathers K and V once and attends the local queries against
them, sp-plan's allgather; its "alltoall" passes K and V one rank on each round, sp-plan's ring, which torchtitan
cannot select (a ring plan exports through --nearest). Packed documents do not reach its context parallelism
(varlen attention with cp > 1 raises NotImplementedError, torchtitan#2536). Pipeline stages: the layers plus
pipeline_parallel_first_stage_less_layers (the embedding's weight) and ..._last_stage_less_layers (the output's)
are split evenly, the first stages taking the remainder (distributed/pipeline_parallel.py
generate_llm_fqn_per_model_part); both default to 1, so an even plan writes 0 and 0. Mesh
['pp', 'dp_replicate', 'dp_shard', 'cp', 'tp'] outermost first (distributed/parallel_dims.py); data
parallelism is FSDP2 (ZeRO-3 with fsdp_reshard_after_forward "always", ZeRO-2 with "never"). With pipeline
parallelism the export pins the schedule sp-plan prices (some model configs default to another): 1F1B, one stage a
rank, or for v virtual stages torch's Interleaved1F1B with pipeline_parallel_layers_per_stage making pp x v stages
(distributed/pipeline_parallel.py _get_pipeline_metadata: ceil((layers + both weights) / layers_per_stage) stages,
split as above, stage k on rank k mod pp), and turns CUDA graphs off, which Trainer.Config refuses beside pipeline
parallelism. The model's dtype is
training.mixed_precision_param (bfloat16 or float32, default bfloat16; no float16), the mixed-precision policy of the
fully_shard torchtitan applies to the model (models/llama3/parallelize.py); training.dtype stays float32, the fp32
main weights sp-plan prices. The fields are 0.3.0's: torchtitan's main branch has since renamed the batch and length
fields (num_tokens_per_train_step, max_context_length).
"""
from __future__ import annotations

from sp_plan.planner.plan import Plan

from sp_plan.planner.stages import stage_chunks

from .target import Target, batch_split, dtype, header

VERSION = "0.3.0"
#: the model's dtype -> training.mixed_precision_param (fp32 parameters sharded, computed in this dtype); torchtitan has
#: no fp16 choice
MIXED_PRECISION = {"bf16": "bfloat16", "fp32": "float32"}
#: ZeRO stage -> fsdp_reshard_after_forward: ZeRO-3 "always" ("default" resolves to not resharding under pipeline
#: parallelism, distributed/fsdp.py: ZeRO-2 there), ZeRO-2 "never"
RESHARD = {2: "never", 3: "always"}


def stage_split(layers: int, pp: int, first_less: int, last_less: int) -> list[int] | None:
    """The layers torchtitan puts on each stage for these weights of the embedding and the output (None: refused)."""
    eff = layers + first_less + last_less
    base, extra = divmod(eff, pp)
    if base < 1 or first_less > base or last_less > base:
        return None
    out = [base + (i < extra) for i in range(pp)]
    out[0] -= first_less
    out[-1] -= last_less
    return out if min(out) >= 0 else None


def stage_weights(stage_layers: list[int]) -> tuple[int, int] | None:
    """(first_stage_less_layers, last_stage_less_layers) that give ``stage_layers``, or None."""
    layers, pp = sum(stage_layers), len(stage_layers)
    for a in range(max(stage_layers) + 1):
        for b in range(max(stage_layers) + 1):
            if stage_split(layers, pp, a, b) == list(stage_layers):
                return a, b
    return None


def chunk_split(p: Plan) -> tuple[int, int, int] | None:
    """(first_stage_less_layers, last_stage_less_layers, layers_per_stage) under which torchtitan splits the model into
    the plan's pp x v chunks (chunk k on rank k mod pp, the "loop" style of Interleaved1F1B), or None."""
    v, pp = p.virtual_stages or 1, p.degrees["pp"]
    if p.stage_layers is None and (p.model is None or p.model.layers % pp):  # the plan's stages are unknown
        return None
    stages = list(p.stage_layers) if p.stage_layers is not None else [p.model.layers // pp] * pp
    chunks = stage_chunks(stages, v)
    weights = chunks and stage_weights([chunks[k % pp][k // pp] for k in range(pp * v)])
    if not weights:
        return None
    eff = sum(stages) + sum(weights)
    # _get_pipeline_metadata makes ceil(eff / layers_per_stage) stages: one that makes pp x v of them
    per = next((n for n in range(1, eff + 1) if -(-eff // n) == pp * v), None)
    return None if per is None else (*weights, per)


def pipeline_arguments(p: Plan, mbs: int) -> list[str]:
    """The pipeline's schedule, micro-batch size and split: one stage a rank (1F1B), or v (Interleaved1F1B)."""
    v = p.virtual_stages or 1
    if v > 1:
        a, b, per = chunk_split(p)
        tail = ["--parallelism.pipeline_parallel_layers_per_stage", str(per)]
    else:
        a, b = stage_weights(p.stage_layers) if p.stage_layers is not None else (0, 0)
        tail = []
    return ["--parallelism.pipeline_parallel_schedule", "Interleaved1F1B" if v > 1 else "1F1B",
            "--parallelism.pipeline_parallel_microbatch_size", str(mbs),
            "--parallelism.pipeline_parallel_first_stage_less_layers", str(a),
            "--parallelism.pipeline_parallel_last_stage_less_layers", str(b), *tail]


def _rules(p: Plan) -> list[tuple[str, str]]:
    """Interleaved chunks torchtitan's even split of the layers and weights does not make."""
    if (p.virtual_stages or 1) > 1 and p.degrees["pp"] > 1 and chunk_split(p) is None:
        return [("virtual_stages", f"torchtitan splits the layers plus the embedding's and the output's weights evenly "
                 f"into pp x v stages, the first taking the remainder: it cannot make the plan's "
                 f"{p.virtual_stages} chunks a pipeline rank")]
    return []


def arguments(p: Plan) -> list[str]:
    """The torchtitan overrides for ``p``, as argv words."""
    d = p.degrees
    batch, mbs, _ = batch_split(p)
    args = ["--parallelism.data_parallel_replicate_degree", "1",
            "--parallelism.data_parallel_shard_degree", str(d["dp"]),
            "--parallelism.fsdp_reshard_after_forward", RESHARD[p.zero_stage],
            "--parallelism.tensor_parallel_degree", str(d["tp"]),
            "--parallelism.pipeline_parallel_degree", str(d["pp"]),
            "--parallelism.context_parallel_degree", str(d["ring"])]
    if d["ring"] > 1:
        args += ["--parallelism.context_parallel_load_balancer",
                 "headtail" if p.token_layout == "zigzag" else "None"]
    if d["pp"] > 1:
        args += pipeline_arguments(p, mbs)
    local = batch // d["dp"] if d["pp"] > 1 else mbs  # without pp, one local batch per accumulation step
    args += ["--training.local_batch_size", str(local), "--training.global_batch_size", str(batch),
             "--training.mixed_precision_param", MIXED_PRECISION[dtype(p)]]
    if p.workload:
        args += ["--training.seq_len", str(p.workload.seq_len)]
    if d["pp"] > 1:  # Trainer.Config refuses CUDA graphs (its default) with pipeline parallelism
        args.append("--training.disable_cuda_graphs")
    args.append("activation_checkpoint:" + ("full" if p.checkpointing == "full" else "none"))
    return args


def render(p: Plan) -> str:
    words, lines = arguments(p), []
    for w in words:
        if w.startswith("--") or ":" in w or not lines:
            lines.append(w)
        else:
            lines[-1] += " " + w
    return header(p, TARGET) + " \\\n".join(lines) + "\n"


TARGET = Target(
    name="torchtitan", title=f"torchtitan {VERSION} (torchtitan/config/configs.py ParallelismConfig, TrainingConfig)",
    render=render, suffix=".args", algorithms=("allgather",),
    orders=(("tp", "ring", "dp", "pp"),), token_layouts=("contiguous", "zigzag"),
    zero_stages=(2, 3), checkpointing=("none", "full"), training=True, dtypes=tuple(MIXED_PRECISION),
    stages=lambda s: stage_weights(s) is not None, virtual_stages=True, extra=_rules,
    notes={"ulysses": "torchtitan has no Ulysses (its context parallelism all-gathers K and V)",
           "ring": "torchtitan's context parallelism all-gathers K and V (PyTorch's default rotate method, which "
                   "torchtitan does not set): it runs allgather, not a ring",
           "documents": "torchtitan's context parallelism takes no packed documents (varlen with cp > 1 raises "
                        "NotImplementedError, torchtitan#2536)",
           "stage_layers": "torchtitan splits the layers plus the embedding's and the output's weights evenly, the "
                           "first stages taking the remainder",
           "zero_stage": "torchtitan's data parallelism is FSDP2 (ZeRO-2 or ZeRO-3)"},
)
