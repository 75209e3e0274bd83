"""Megatron-LM command-line arguments for a plan.

Targets NVIDIA/Megatron-LM at commit d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22),
megatron/training/arguments.py (flags recorded in tests/fixtures/export/megatron_flags.json), and
Megatron-Core 0.16.1 (ModelParallelConfig, TransformerConfig). Context parallelism: ``--cp-comm-type``
p2p (Ring), a2a (Ulysses), a2a+p2p (USP) with ``--hierarchical-context-parallel-sizes`` listing the
inner (a2a) level first (parallel_state.create_hierarchical_groups), or all_gather (all-gather K/V). The
all-gather value is written ``all_gather``: arguments.py's help lists "allgather", but Megatron hands the string
unchanged to TransformerEngine's DotProductAttention (core/extensions/transformer_engine.py), whose
attn_forward_func_with_cp accepts "all_gather" and raises "Unsupported communication type" on anything else
(TransformerEngine d0067d0, attention/dot_product_attention/context_parallel.py). There is no all-gather x
Ulysses hierarchy. TransformerEngine's a2a (and the a2a level of a2a+p2p) splits the query and the KV heads of a
tp rank over the Ulysses ranks and replicates no KV head (context_parallel.py asserts "cp_comm_type='a2a' requires
num_heads % cp_size == 0", and a2a+p2p views the heads as [cp_a2a, h // cp_a2a]); Megatron repeats none for it
either, so the Ulysses degree must divide both. get_batch_on_this_cp_rank splits the sequence into 2 x cp chunks,
so a causal ring is always zigzag. Packed documents: ``--reset-position-ids --reset-attention-mask
--dataloader-inter-document-masking`` give each sample's cu_seqlens (core/datasets/gpt_dataset.py, no per-document
padding: a shortfall is folded into the last document), and that flag selects per-sequence balancing
(pretrain_gpt.py get_batch, core/utils.py _get_batch_on_this_cp_rank_per_sequence_balancing): the packed sequence,
not each document, is split into 2 x cp equal chunks, rank r holding chunks r and 2cp-1-r, documents cut where
they fall. sp-plan's token layouts with documents split each document (zigzag per document), so only Ulysses
(a2a), whose all-to-all hands every rank the whole sequence of its heads, runs a plan's packed documents as
priced; a ring (p2p, a2a+p2p, all_gather) with documents is refused. TransformerEngine's THD context parallelism
restores the gathered tokens' order per document (thd_cp_rank_order_to_sequence_order), which the per-sequence split
matches only for a pack of one document: the export says so in a comment. A sliding window: ``--window-size W-1,0``
(TransformerEngine's window is inclusive on both sides of the query) on every layer, or on the windowed layers of the
plan's pattern: ``--window-attn-skip-freq N`` for N - 1 windowed layers then one global, else a per-layer list
(core/transformer/utils.py is_layer_window_attention); TransformerEngine runs one under cp_comm_type a2a or
all_gather only (context_parallel.py). Uneven pipeline stages:
``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``, the stages between them even
(TransformerConfig). Interleaved 1F1B (``virtual_stages`` v): ``--num-virtual-stages-per-pipeline-rank`` where
every stage's layers divide by v (the flag Megatron asks for with uneven stages; ``--num-layers-per-virtual-pipeline-
stage`` refuses them), else ``--pipeline-model-parallel-layout``, which lists the pp x v chunks in pipeline order
(chunk k on rank k mod pp; E the embedding, t a layer, L the loss: transformer/pipeline_parallel_layer_layout.py) and
takes the place of the first and last stage flags; Megatron's interleaved schedule needs the micro-batches in groups
of pp (core/pipeline_parallel/schedules.py), as the plan does. Rank order 'tp-cp-ep-dp-pp', or 'tp-cp-ep-pp-dp' with
``--use-tp-pp-dp-mapping`` (training/initialize.py). The model's dtype is ``--bf16`` or ``--fp16``, mixed precision
that keeps fp32 main weights in the optimizer (core/optimizer/optimizer.py Float16OptimizerWithFloat16Params, the
distributed optimizer alike), and no flag for fp32, Megatron's default. ZeRO-1 is the distributed optimizer; ZeRO-2/3
are Megatron-FSDP's optim_grads / optim_grads_params sharding, which validate_args allows with the fsdp_dtensor
checkpoint format only. validate_args also asserts CUDA_DEVICE_MAX_CONNECTIONS: not 1 under Megatron-FSDP, 1 with
tensor or context parallelism on Hopper and older GPUs; the export says which in a comment. The planner hides the
gradient sync behind the backward and the distributed optimizer's weight all-gather behind the next forward, as
``--overlap-grad-reduce`` and ``--overlap-param-gather`` run them (both off by default; validate_args asks the
second for the first and for the distributed optimizer or Megatron-FSDP).
"""
from __future__ import annotations

import shlex

from sp_plan.planner.errors import PlanError
from sp_plan.planner.model import DTYPE_BYTES
from sp_plan.planner.plan import Plan
from sp_plan.planner.schedules import DDP_BUCKET_BYTES

from sp_plan.planner.stages import stage_chunks

from .target import Target, batch_split, dtype, header

COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
CP_COMM = {"ring": "p2p", "ulysses": "a2a", "usp": "a2a+p2p", "allgather": "all_gather"}
SHARDING = {2: "optim_grads", 3: "optim_grads_params"}
#: the model's dtype -> Megatron's precision flags: bf16 or fp16 mixed precision (fp32 main weights and gradients in the
#: optimizer, as sp-plan prices them); without either Megatron trains in fp32
PRECISION = {"bf16": ["--bf16"], "fp16": ["--fp16"], "fp32": []}
DOCUMENT_FLAGS = ["--reset-position-ids", "--reset-attention-mask", "--dataloader-inter-document-masking"]


def placeable_stages(stage_layers: list[int]) -> bool:
    """Megatron sets the first and the last stage's layers; the stages between hold equal counts."""
    return len(set(stage_layers[1:-1])) <= 1


def stage_arguments(p: Plan) -> list[str]:
    """The first and last stage's layers of an uneven plan (none for an even one), and its virtual stages."""
    s, v = p.stage_layers, p.virtual_stages or 1
    if v > 1 and any(n % v for n in plan_stages(p)):  # a chunk with the embedding or the loss: the layout string
        return ["--pipeline-model-parallel-layout", pipeline_layout(plan_stages(p), v)]
    out = [] if s is None or len(set(s)) == 1 else ["--decoder-first-pipeline-num-layers", str(s[0]),
                                                    "--decoder-last-pipeline-num-layers", str(s[-1])]
    return out + (["--num-virtual-stages-per-pipeline-rank", str(v)] if v > 1 else [])


def plan_stages(p: Plan) -> list[int]:
    """Layers per stage of ``p``: its own, else the even split (the model's layers over pp)."""
    if p.stage_layers is not None:
        return list(p.stage_layers)
    if p.model is None:
        raise PlanError("model", "the plan has virtual stages and no model, so its chunks' layers are unknown",
                        "give the plan its model (sp-plan plan writes it)")
    return [p.model.layers // p.degrees["pp"]] * p.degrees["pp"]


def pipeline_layout(stage_layers: list[int], v: int) -> str:
    """Megatron's --pipeline-model-parallel-layout for these stages in v chunks: the pp x v chunks in pipeline order
    (chunk j of every rank, then chunk j + 1), the embedding before the first layer and the loss after the last,
    runs of equal chunks folded as "(t|)*n"."""
    pp, chunks = len(stage_layers), stage_chunks(stage_layers, v)
    cells = ["t" * chunks[k % pp][k // pp] for k in range(pp * v)]
    cells[0], cells[-1] = "E" + cells[0], cells[-1] + "L"
    out, i = [], 0
    while i < len(cells):
        j = i
        while j + 1 < len(cells) - 1 and cells[j + 1] == cells[i] and i > 0:
            j += 1
        run = j - i + 1
        out.append(f"({cells[i]}|)*{run}" if run > 1 else cells[i] + ("|" if i < len(cells) - 1 else ""))
        i = j + 1
    return "".join(out)


def window_arguments(p: Plan) -> list[str]:
    """--window-size and --window-attn-skip-freq of the workload's sliding window (none where it masks nothing)."""
    w = p.workload.mask_window if p.workload else None
    if w is None:
        return []
    # TransformerEngine's window (left, right) is inclusive: the plan's W keys are the query and the W - 1 before it
    out = ["--window-size", f"{w.size - 1},0"]
    local, glob = w.local_global()
    if glob == 0:
        return out
    if glob == 1:  # every N-th layer (1-based) attends in full: N - 1 windowed layers, then one global
        return out + ["--window-attn-skip-freq", str(local + 1)]
    if p.model is None:
        raise PlanError("model", "the plan's window pattern is spelled per layer, and the plan has no model",
                        "give the plan its model (sp-plan plan writes it)")
    full, rest = divmod(p.model.layers, local + glob)  # a list of one 1 (windowed) or 0 a layer, its length the model's
    tail = "".join(f"+[{bit}]*{n}" for bit, n in ((1, min(rest, local)), (0, max(rest - local, 0))) if n)
    return out + ["--window-attn-skip-freq", f"([1]*{local}+[0]*{glob})*{full}{tail}"]


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
    args += stage_arguments(p) + window_arguments(p)
    if d["tp"] > 1:
        args.append("--sequence-parallel")
    if p.zero_stage >= 1:
        args.append("--use-distributed-optimizer")
    if d["dp"] * cp > 1:  # the planner hides the sync behind the passes, as these run it (both default off)
        args.append("--overlap-grad-reduce")
        if p.zero_stage >= 1:  # validate_args: needs the distributed optimizer or Megatron-FSDP, and the grad overlap
            args.append("--overlap-param-gather")
        args += bucket_arguments(p)
    if p.zero_stage >= 2:
        # validate_args refuses Megatron-FSDP with any other checkpoint format than fsdp_dtensor
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", SHARDING[p.zero_stage],
                 "--ckpt-format", "fsdp_dtensor"]
    if p.checkpointing == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if d["pp"] > 1 and d["dp"] > 1 and p.order.index("pp") < p.order.index("dp"):
        args.append("--use-tp-pp-dp-mapping")
    args += PRECISION[dtype(p)]
    batch, mbs, _ = batch_split(p)
    args += ["--micro-batch-size", str(mbs), "--global-batch-size", str(batch)]
    if p.workload:
        args += ["--seq-length", str(p.workload.seq_len)]
        if p.workload.documents is not None:
            args += DOCUMENT_FLAGS
    return args


def bucket_arguments(p: Plan) -> list[str]:
    """``--ddp-bucket-size`` (parameters) of the buckets the planner prices (``Estimator.sync_bucket``): a stage
    layer's gradients for ZeRO-1, and for ZeRO-0 DDP's 25 MiB of them where that is more; training.py
    resolve_ddp_bucket_size otherwise takes max(40e6, 1e6 x dp x cp) parameters for both. Megatron-FSDP (ZeRO-2/3)
    buckets by module already."""
    if p.zero_stage >= 2 or p.model is None:
        return []
    layer = p.model.layer_params() // p.degrees["tp"]
    size = max(layer, DDP_BUCKET_BYTES // DTYPE_BYTES[dtype(p)]) if p.zero_stage == 0 else layer
    return ["--ddp-bucket-size", str(int(size))]


def notes(p: Plan) -> str:
    """Comment lines on what Megatron runs differently from the plan, and the environment its checks ask for."""
    cp = p.degrees["ulysses"] * p.degrees["ring"]
    out = ""
    if p.workload is not None and p.workload.documents is not None and cp > 1:
        # --dataloader-inter-document-masking selects per-sequence balancing (pretrain_gpt.py get_batch)
        out += (f"# packed documents: Megatron splits each packed sequence (not each document) into {2 * cp} equal "
                f"chunks over the {cp} cp ranks, no per-document padding; the a2a all-to-all gathers it whole\n")
        # TransformerEngine's THD context parallelism restores the gathered order per document (context_parallel.py
        # thd_cp_rank_order_to_sequence_order), which a per-sequence split meets only for a pack of one document
        out += ("# packed documents: TransformerEngine's THD context parallelism reads a rank's tokens as 2 x cp "
                "chunks of each document: check a pack of several documents against cp 1\n")
    if p.zero_stage >= 2:  # arguments.py validate_args: Megatron-FSDP asserts the variable is not 1
        out += "# environment: CUDA_DEVICE_MAX_CONNECTIONS unset or above 1 (Megatron-FSDP)\n"
    elif p.degrees["tp"] > 1 or cp > 1:  # validate_args on Hopper and older: tp or cp overlap needs it at 1
        out += "# environment: CUDA_DEVICE_MAX_CONNECTIONS=1 (tensor or context parallelism)\n"
    return out


def render(p: Plan) -> str:
    words = arguments(p)
    lines, cur = [], []
    for w in words:  # one flag and its values per line
        if w.startswith("--") and cur:
            lines.append(" ".join(cur))
            cur = []
        cur.append(shlex.quote(w))  # a layout string's "|", "(" and "*" are the shell's
    lines.append(" ".join(cur))
    return header(p, TARGET) + notes(p) + " \\\n".join(lines) + "\n"


def _rules(p: Plan) -> list[tuple[str, str]]:
    """Megatron's hierarchical context parallelism is a2a inside p2p; no all-gather inside or around Ulysses."""
    if p.algorithm == "allgather" and p.degrees["ulysses"] > 1:
        return [("ulysses", "megatron has no all-gather x Ulysses hierarchy (its hierarchical context parallelism "
                 "is a2a+p2p)")]
    return []


#: why a ring's packed documents are refused: Megatron's split of them is none of sp-plan's token layouts
DOCUMENTS = ("megatron splits a packed sequence into 2 x cp zigzag chunks as a whole, cutting documents where they "
             "fall (per-sequence balancing under --dataloader-inter-document-masking), not each document as the "
             "plan's token layout does; only its Ulysses (a2a) runs packed documents as planned")


TARGET = Target(
    name="megatron", title=f"Megatron-LM (NVIDIA/Megatron-LM {COMMIT[:7]}, megatron/training/arguments.py)",
    render=render, suffix=".args", algorithms=("ring", "ulysses", "usp", "allgather"),
    orders=(("tp", "ulysses", "ring", "dp", "pp"), ("tp", "ulysses", "ring", "pp", "dp")),
    token_layouts=("zigzag",), checkpointing=("none", "full"), extra=_rules,
    documents=("ulysses",), stages=placeable_stages, virtual_stages=True, ulysses_heads="divide",
    windows=("ulysses", "allgather"),
    notes={"stage_layers": "megatron sets the first and the last stage's layers only; the stages between hold "
                           "equal counts", "documents": DOCUMENTS,
           "window": "TransformerEngine runs a sliding window under cp_comm_type a2a or all_gather only (Ulysses or "
                     "all-gather K/V), not p2p or a2a+p2p"},
)
