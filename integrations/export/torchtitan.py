"""torchtitan command-line overrides (its job config's parallelism and training sections) for a plan.

Targets torchtitan 0.3.0 (pytorch/torchtitan): torchtitan/config/configs.py ParallelismConfig and
TrainingConfig, set from the command line as ``--parallelism.<field> <value>`` (tyro, fields recorded in
tests/fixtures/export/torchtitan_config.json), and the ``activation_checkpoint:{full,none}`` subcommand
(torchtitan/distributed/activation_checkpoint.py). Context parallelism is Ring attention (PyTorch's
context_parallel) with the "headtail" load balancer (zigzag) or none (contiguous); no Ulysses. Mesh
['pp', 'dp_replicate', 'dp_shard', 'cp', 'tp'] outermost first (distributed/parallel_dims.py); data
parallelism is FSDP2 (ZeRO-3, ZeRO-2 with fsdp_reshard_after_forward "never").
"""
from __future__ import annotations

from sp_plan.planner.plan import Plan

from .target import Target, batch_split, header

VERSION = "0.3.0"


def arguments(p: Plan) -> list[str]:
    """The torchtitan overrides for ``p``, as argv words."""
    d = p.degrees
    batch, mbs, _ = batch_split(p)
    args = ["--parallelism.data_parallel_replicate_degree", "1",
            "--parallelism.data_parallel_shard_degree", str(d["dp"]),
            "--parallelism.fsdp_reshard_after_forward", "never" if p.zero_stage == 2 else "default",
            "--parallelism.tensor_parallel_degree", str(d["tp"]),
            "--parallelism.pipeline_parallel_degree", str(d["pp"]),
            "--parallelism.context_parallel_degree", str(d["ring"])]
    if d["ring"] > 1:
        args += ["--parallelism.context_parallel_load_balancer",
                 "headtail" if p.token_layout == "zigzag" else "None"]
    if d["pp"] > 1:  # the pipeline's micro-batches split the local batch
        args += ["--parallelism.pipeline_parallel_microbatch_size", str(mbs)]
    local = batch // d["dp"] if d["pp"] > 1 else mbs  # without pp, one local batch per accumulation step
    args += ["--training.local_batch_size", str(local), "--training.global_batch_size", str(batch)]
    if p.workload:
        args += ["--training.seq_len", str(p.workload.seq_len)]
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
    render=render, suffix=".args", algorithms=("ring",),
    orders=(("tp", "ring", "dp", "pp"),), token_layouts=("contiguous", "zigzag"),
    zero_stages=(2, 3), checkpointing=("none", "full"), training=True,
    notes={"ulysses": "torchtitan has no Ulysses (its context parallelism is Ring attention)",
           "zero_stage": "torchtitan's data parallelism is FSDP2 (ZeRO-2 or ZeRO-3)"},
)
