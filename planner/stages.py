"""Pipeline stages: how many layers each of the pp stages holds.

Every stage runs its layers; the last also runs the LM head (logits and loss), the first holds the embedding and,
under 1F1B, the most micro-batches in flight (stage i holds min(pp - i, m) of them). A pipeline runs at the pace of
its busiest stage, so an even split is not the best one where the head is large or pp does not divide the layers:
Llama 3 405B put its 126 layers on 16 stages with one layer fewer on the first and the last (arXiv 2407.21783,
§3.3.2), as Megatron's --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers allow.
"""
from __future__ import annotations

from .errors import PlanError
from .model import ModelSpec, Workload


def layer_flops(model: ModelSpec, workload: Workload | None = None) -> float:
    """Forward FLOPs of one layer per token: its weights, and with a workload its attention under the mask."""
    f = 2.0 * model.layer_params()
    if workload is not None:
        from .masks import mask_fraction  # documents and windows: the mask's share of the S^2 pairs

        plain = workload.documents is None and workload.window is None
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
