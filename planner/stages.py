"""Pipeline stages: how many layers each of the pp stages holds.

Every stage runs its layers; the last also runs the LM head (logits and loss), the first holds the embedding and,
under 1F1B, the most micro-batches in flight (stage i holds min(pp - i, m) of them). A pipeline runs at the pace of
its busiest stage, so an even split is not the best one where the head is large or pp does not divide the layers:
Llama 3 405B put its 126 layers on 16 stages with one layer fewer on the first and the last (arXiv 2407.21783,
§3.3.2), as Megatron's --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers allow.
"""
from __future__ import annotations

import numpy as np

from .errors import PlanError
from .model import ModelSpec, Workload


def layer_flops(model: ModelSpec, workload: Workload | None = None) -> float:
    """Forward FLOPs of one layer per token: its weights, and with a workload its attention under the mask."""
    f = 2.0 * model.layer_params()
    if workload is not None:
        from .masks import mask_fraction  # documents and windows: the mask's share of the S^2 pairs

        plain = workload.documents is None and workload.mask_window is None
        S = workload.seq_len
        frac = ((S + 1) / (2 * S) if workload.causal else 1.0) if plain else mask_fraction(workload, model.layers)
        f += 4.0 * S * model.heads * model.head_dim * frac
    return f


def head_flops(model: ModelSpec) -> float:
    """Forward FLOPs of the LM head per token (the last stage's logits)."""
    return 2.0 * model.vocab * model.hidden


def check_stage_layers(stage_layers, pp: int, layers: int | None = None, field: str = "stage_layers") -> None:
    """pp entries of at least one layer each, summing to the model's layers where known (PlanError naming the field)."""
    if len(stage_layers) != pp:
        raise PlanError(field, f"{len(stage_layers)} stages listed for pp {pp}", f"list {pp} layer counts, one a stage")
    if any(n < 1 for n in stage_layers):
        raise PlanError(field, f"every stage needs at least one layer, got {list(stage_layers)}",
                        "give each stage 1 or more layers")
    if layers is not None and sum(stage_layers) != layers:
        raise PlanError(field, f"the stages hold {sum(stage_layers)} layers, the model has {layers}",
                        f"make the {pp} counts sum to {layers}")


def stage_times(stage_layers, model: ModelSpec, workload: Workload | None = None) -> list[float]:
    """Forward FLOPs per token of each stage: its layers, and the LM head on the last."""
    f, h = layer_flops(model, workload), head_flops(model)
    return [n * f + (h if i == len(stage_layers) - 1 else 0.0) for i, n in enumerate(stage_layers)]


def balanced_stage_layers(model: ModelSpec, pp: int, workload: Workload | None = None) -> tuple[int, ...]:
    """Layers per stage with the least busiest-stage time (the LM head on the last); ties go light on early stages."""
    L = model.layers
    if pp < 1 or L < pp:
        raise PlanError("degrees.pp", f"pp {pp} needs at least one layer a stage, the model has {L}",
                        f"choose pp between 1 and {L}")
    f, h = layer_flops(model, workload), head_flops(model)
    extra = [0.0] * pp
    extra[-1] += h
    n = [1] * pp
    for _ in range(L - pp):  # one layer at a time to the stage it leaves least busy: optimal for equal layers
        # ties: the stage with the fewest layer-activations in flight under 1F1B, (n + 1)(pp - i), which leaves the
        # first stage (the embedding's, with the most micro-batches in flight) lightest
        i = min(range(pp), key=lambda s: ((n[s] + 1) * f + extra[s], (n[s] + 1) * (pp - s), -s))
        n[i] += 1
    return tuple(n)


def resolve_stage_layers(model: ModelSpec, pp: int, stage_layers=None, workload: Workload | None = None
                         ) -> tuple[int, ...] | None:
    """The stages a layout runs: ``stage_layers`` as given, else even where pp divides the layers (None), else
    balanced; an even list given is None (the same layout)."""
    if stage_layers is None:
        return None if model.layers % pp == 0 else balanced_stage_layers(model, pp, workload)
    check_stage_layers(stage_layers, pp, model.layers)
    s = tuple(int(x) for x in stage_layers)
    return None if len(set(s)) == 1 else s


#: the most virtual stages a pipeline rank holds in the search: each one adds a round of stage sends per micro-batch
MAX_VIRTUAL_STAGES = 8


def chunk_layers(n: int, v: int, first: bool = False, last: bool = False) -> list[int] | None:
    """Layers in each of the ``v`` equal chunks of a stage of ``n`` layers, first to last, or None where they do not
    split: ``n`` a multiple of v, or on the first stage n + 1 with the embedding counted as a layer (its first chunk
    one layer short), on the last n + 1 with the LM head (its last chunk one short). Llama 3 405B put one layer
    fewer on the first and the last stage, which leaves the first chunk of the first stage the embedding alone and
    the last chunk of the last stage the output projection and loss alone (arXiv 2407.21783, §3.3.2), as Megatron's
    --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split count them."""
    if n % v == 0:
        return [n // v] * v
    if (first or last) and not (first and last) and (n + 1) % v == 0 and (n + 1) // v >= 1:
        k = (n + 1) // v
        return [k - 1] + [k] * (v - 1) if first else [k] * (v - 1) + [k - 1]
    return None


def stage_chunks(stage_layers, v: int) -> list[list[int]] | None:
    """Each stage's chunk layers (``chunk_layers``), or None where a stage does not split into ``v``."""
    pp = len(stage_layers)
    out = [chunk_layers(n, v, i == 0, i == pp - 1) for i, n in enumerate(stage_layers)]
    return None if any(c is None for c in out) else out


def check_virtual_stages(v: int, pp: int, layers: int | None = None, stage_layers=None,
                         field: str = "virtual_stages") -> None:
    """An interleaved schedule needs a pipeline and stages that split into v equal chunks (PlanError naming the
    field); the layers are checked where known (the model's, or ``stage_layers``)."""
    if v == 1:
        return
    if v < 1:
        raise PlanError(field, f"{v} virtual stages", "give 1 (plain 1F1B) or more virtual stages a pipeline rank")
    if pp < 2:
        raise PlanError(field, f"{v} virtual stages need a pipeline, and pp is {pp}",
                        "set virtual_stages to 1, or give pp 2 or more")
    if stage_layers is None:
        if layers is None or layers % pp:
            return  # the even split is unknown here (no model), or an uneven one is resolved later
        stage_layers = [layers // pp] * pp
    if stage_chunks(stage_layers, v) is None:
        fits = [k for k in range(2, max(stage_layers) + 2) if stage_chunks(stage_layers, k) is not None]
        raise PlanError(field, f"the stages' layers {stage_list(stage_layers)} do not split into {v} equal "
                        "chunks a stage (each stage's layers a multiple of it, or with the embedding on the first "
                        "and the LM head on the last counted as a layer)",
                        f"use virtual_stages {' or '.join(map(str, fits[:4]))}" if fits
                        else "use virtual_stages 1 (plain 1F1B)")


def stage_list(stage_layers) -> str:
    """Layers per stage, runs of equal counts folded: [7, 8, 8, 8, 7] -> '7,8x3,7'."""
    runs: list[list[int]] = []
    for n in stage_layers:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return ",".join(f"{n}x{k}" if k > 1 else str(n) for n, k in runs)


def check_interleaved_micro_batches(v: int, pp: int, micro_batches: int, field: str = "virtual_stages") -> None:
    """An interleaved schedule runs the micro-batches in groups of pp (Narayanan et al. 2021, §2.2.2: "the number
    of microbatches in a batch [must be] an integer multiple of the degree of pipeline parallelism"; Megatron's
    default --microbatch-group-size-per-virtual-pipeline-stage is pp, and a last group of fewer than pp is refused:
    core/pipeline_parallel/schedules.py)."""
    if v > 1 and (micro_batches < pp or micro_batches % pp):
        raise PlanError(field, f"{v} virtual stages run the micro-batches in groups of pp {pp}, and a step has "
                        f"{micro_batches} micro-batches", f"make the micro-batches a multiple of {pp} (batch / "
                        "(dp x micro_batch_size)), or set virtual_stages to 1")


def searched_virtual_stages(pp: int, micro_batch_counts, layers: int, stage_layers=None) -> list[int]:
    """The virtual stages the search prices for a pipeline: 1 and the most of ``virtual_stage_options`` at any of
    these micro-batch counts. Of the interleaved schedules a pipeline can run, the most chunks has the least bubble
    and holds the fewest activations (``memory.in_flight_micro_batches``); only its v sends a micro-batch can make a
    middle one faster, and pricing every v would double the candidates of a batch-16 search at cluster scale where
    these two add a fifth to a third (1,024-131,072 GPUs, llama3-70b and 405b, 1M tokens)."""
    most = max((max(virtual_stage_options(pp, m, layers, stage_layers)) for m in micro_batch_counts), default=1)
    return [1] if most == 1 else [1, most]


def virtual_stage_options(pp: int, micro_batches: int, layers: int, stage_layers=None) -> list[int]:
    """The virtual stages a search offers for a pipeline: 1, and each v up to ``MAX_VIRTUAL_STAGES`` whose chunks
    split the stages (``stage_chunks``) where the micro-batches come in groups of pp."""
    if pp < 2 or micro_batches < pp or micro_batches % pp:
        return [1]
    stages = list(stage_layers) if stage_layers is not None else ([layers // pp] * pp if layers % pp == 0 else None)
    if stages is None:
        return [1]
    return [1] + [v for v in range(2, MAX_VIRTUAL_STAGES + 1) if stage_chunks(stages, v) is not None]


def busiest_stage(stage_layers: tuple[int, ...], layer, head):
    """Seconds of the busiest of uneven pipeline stages: the most layers before the last, or the last's layers and
    the LM head (``layer``, ``head``: floats or arrays per mesh order)."""
    return np.maximum(max(stage_layers[:-1]) * layer, stage_layers[-1] * layer + head)


def pipeline_time(m: int, pp: int, v: int, stage):
    """Seconds of m micro-batches through pp stages of ``stage`` seconds each: m stages and the bubble."""
    if v == 1:
        return (m + pp - 1) * stage
    return m * stage + bubble_time(pp, v, stage)


def bubble_time(pp: int, v: int, stage):
    """The pipeline's idle time: (pp - 1) stages under 1F1B, (pp - 1) chunks of 1/v stage interleaved (Narayanan et
    al. 2021, §2.2.2: bubble (p - 1) (t_f + t_b) / v)."""
    return (pp - 1) * stage if v == 1 else (pp - 1) * stage / v
