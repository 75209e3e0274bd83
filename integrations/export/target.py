"""What one framework can express of a Plan (algorithms, token layouts, mesh orders, degrees, ZeRO,
checkpointing), the reasons a plan falls outside it, and the exporter that writes it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from sp_plan.planner.errors import PlanError, of_type
from sp_plan.planner.model import ModelSpec
from sp_plan.planner.plan import Plan, order_text

#: the papers' names, for messages ("megatron has no WallFacer")
ALGORITHM_NAMES = {"ring": "Ring attention", "ulysses": "Ulysses", "usp": "USP (Ulysses x Ring)",
                   "wallfacer": "WallFacer", "tokenring": "TokenRing", "tokenring_ring": "TokenRing x Ring",
                   "metp": "METP", "allgather": "all-gather K/V"}


@dataclass(frozen=True)
class Target:
    """A framework sp-plan exports to: what it can express and how its configuration is written."""

    name: str
    title: str  # e.g. "Megatron-LM (NVIDIA/Megatron-LM d98e8a6)"
    render: Callable[[Plan], str]
    suffix: str  # default file suffix of the export
    algorithms: tuple[str, ...]
    #: mesh orders it places, innermost first, over every dimension it knows; a plan's order over its
    #: dimensions of degree > 1 must be one of these restricted to those dimensions
    orders: tuple[tuple[str, ...], ...]
    #: token layouts of a causal ring (ring > 1); contiguous-only targets list ("contiguous",)
    token_layouts: tuple[str, ...] = ("contiguous", "zigzag", "striped")
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    checkpointing: tuple[str, ...] = ("none", "full", "attention_boundary")
    training: bool | None = None  # True: training only, False: inference only, None: both
    notes: dict[str, str] = field(default_factory=dict)  # reason overrides, keyed like problems()' keys
    extra: Callable[[Plan], list[tuple[str, str]]] | None = None  # the target's own rules: (key, reason)
    #: algorithms whose context parallelism the target runs on packed documents (sp > 1); a plan without
    #: context parallelism packs documents anywhere
    documents: tuple[str, ...] = ()
    #: algorithms whose context parallelism the target runs a sliding window with (sp > 1); a plan without context
    #: parallelism carries one where any does; empty: its export carries no window
    windows: tuple[str, ...] = ()
    #: whether the target places these uneven layers per pipeline stage (None: it splits the layers evenly)
    stages: Callable[[list[int]], bool] | None = None
    #: whether the target runs an interleaved 1F1B schedule (a plan's virtual_stages > 1)
    virtual_stages: bool = False
    #: the model dtypes (ModelSpec.dtype) its configuration can set; another is an error no nearest plan fixes
    dtypes: tuple[str, ...] = ("bf16", "fp16", "fp32")
    #: how its Ulysses all-to-all splits the heads of a tp rank: "divide" (the Ulysses degree must divide the query
    #: and the KV heads), "replicate" (KV heads are repeated where the degree is a multiple of them), None: any
    ulysses_heads: str | None = None
    #: its own rules on the degrees alone: (key, reason) for each broken; the nearest search skips such degrees
    degree_rules: Callable[[dict[str, int]], list[tuple[str, str]]] | None = None
    #: its own rule on the ZeRO stage of these degrees in training (inference keeps no gradients or optimizer state):
    #: a reason, or None; the nearest search skips such policies
    zero_rule: Callable[[dict[str, int], int], str | None] | None = None

    def dims(self) -> set[str]:
        return {d for o in self.orders for d in o}

    def order_ok(self, order: tuple[str, ...] | list[str], degrees: dict[str, int]) -> bool:
        """Whether the mesh order (innermost first) of the dimensions of degree > 1 is one this target places."""
        return tuple(d for d in order if degrees.get(d, 1) > 1 and d != "team") in self.placed(degrees)

    def placed(self, degrees: dict[str, int]) -> set[tuple[str, ...]]:
        """The mesh orders this target places, each cut to the dimensions of degree > 1."""
        return {tuple(d for d in o if degrees.get(d, 1) > 1) for o in self.orders}

    def problems(self, p: Plan) -> list[tuple[str, str]]:
        """(key, reason) for every part of ``p`` this target cannot express; empty: it can export ``p``."""
        of_type("plan", p, Plan, "a Plan (Plan.load(file), or one sp_plan.plan returned)")
        out = []
        d = p.degrees
        # without context parallelism the plan's algorithm runs nowhere; METP is tensor parallelism's own
        if p.algorithm not in self.algorithms and (p.sp > 1 or p.algorithm == "metp"):
            out.append(("algorithm", self.notes.get(p.algorithm) or
                        f"{self.name} has no {ALGORITHM_NAMES[p.algorithm]}"))
        for dim, size in d.items():
            if size > 1 and dim != "team" and dim not in self.dims():
                out.append((dim, self.notes.get(dim) or f"{self.name} has no {dim} parallelism in its configuration"))
        causal = p.workload.causal if p.workload else True
        if causal and d["ring"] > 1 and p.token_layout not in self.token_layouts:
            out.append(("token_layout", f"{self.name} has no {p.token_layout} token layout (it splits tokens "
                        f"{'/'.join(self.token_layouts)})"))
        if not out and not self.order_ok(p.order, d):
            shown = order_text(p.order, d)
            # orders that differ only in dimensions of degree 1 place these degrees alike: each named once
            places = " or ".join(dict.fromkeys(order_text(o, d) for o in self.orders))
            out.append(("order", f"{self.name} cannot place the mesh order {shown} (it places {places})"))
        if p.zero_stage not in self.zero_stages:
            out.append(("zero_stage", self.notes.get("zero_stage") or f"{self.name} has no ZeRO-{p.zero_stage}"))
        elif self.zero_rule and (p.workload is None or p.workload.training) and self.zero_rule(d, p.zero_stage):
            out.append(("zero_stage", self.zero_rule(d, p.zero_stage)))
        if p.checkpointing not in self.checkpointing:
            out.append(("checkpointing", f"{self.name} has no {p.checkpointing} checkpointing "
                        f"(it has {'/'.join(self.checkpointing)})"))
        if (p.kv_chunks or 1) > 1:  # no framework's all-gather context parallelism takes chunks of KV heads
            out.append(("kv_chunks", f"{self.name} gathers K, V in one piece: its export has no kv_chunks "
                        f"{p.kv_chunks}"))
        out += self.mask_problems(p)
        out += self.degree_problems(d, p.model)
        if not out and self.extra:
            out += self.extra(p)
        return out

    def mask_problems(self, p: Plan) -> list[tuple[str, str]]:
        """Packed documents, a sliding window, uneven stages and virtual stages the target cannot carry: (key,
        reason)."""
        out = []
        w = p.workload
        if w is not None and w.documents is not None and p.sp > 1 and p.algorithm not in self.documents:
            out.append(("documents", self.notes.get("documents") or f"{self.name} cannot split packed documents "
                        f"over its {ALGORITHM_NAMES[p.algorithm]} context parallelism"))
        if w is not None and w.mask_window is not None and not self.windows:
            out.append(("window", f"the {self.name} export carries no sliding window: its layers would attend "
                        "in full"))
        elif w is not None and w.mask_window is not None and p.sp > 1 and p.algorithm not in self.windows:
            out.append(("window", self.notes.get("window") or f"{self.name} runs no sliding window under its "
                        f"{ALGORITHM_NAMES[p.algorithm]} context parallelism"))
        uneven = p.stage_layers is not None and len(set(p.stage_layers)) > 1
        if uneven and not (self.stages and self.stages(p.stage_layers)):
            out.append(("stage_layers", self.notes.get("stage_layers") or f"{self.name} cannot place the stages' "
                        f"layers {p.stage_layers}"))
        if (p.virtual_stages or 1) > 1 and not self.virtual_stages:
            out.append(("virtual_stages", self.notes.get("virtual_stages") or f"the {self.name} export has no "
                        f"interleaved schedule (it writes plain 1F1B or no pipeline) for {p.virtual_stages} virtual "
                        "stages a pipeline rank"))
        return out

    def degree_problems(self, degrees: dict[str, int], model: ModelSpec | None) -> list[tuple[str, str]]:
        """(key, reason) for what the degrees alone break: the target's own rules and its Ulysses head split."""
        out = list(self.degree_rules(degrees)) if self.degree_rules else []
        why = self.head_split(degrees, model)
        return out + ([("ulysses", why)] if why else [])

    def head_split(self, degrees: dict[str, int], model: ModelSpec | None) -> str | None:
        """Why the target's Ulysses all-to-all cannot split the heads of a tp rank over the Ulysses degree, or None."""
        u, tp = degrees.get("ulysses", 1), degrees.get("tp", 1)
        if u == 1 or model is None or self.ulysses_heads is None:
            return None
        q, kv = model.heads // tp, max(model.kv_heads // tp, 1)
        if q % u == 0 and kv % u == 0:
            return None
        if self.ulysses_heads == "replicate" and q % u == 0 and u % kv == 0:
            return None
        where = f" of a tp rank (tp {tp})" if tp > 1 else ""
        if self.ulysses_heads == "replicate":
            return (f"{self.name}'s Ulysses splits the {q} query heads{where} over {u} ranks and its {kv} KV heads "
                    f"evenly or, where {u} is a multiple of them, replicated: ulysses {u} does neither")
        return (f"{self.name}'s Ulysses all-to-all splits the {q} query and {kv} KV heads{where} over its {u} ranks "
                f"without replicating KV heads: ulysses {u} must divide both")

    def check_workload(self, p: Plan) -> None:
        """A plan for the wrong kind of run (training vs inference), or for a dtype the target cannot set, is an error
        no nearest plan fixes."""
        if dtype(p) not in self.dtypes:
            raise PlanError("model.dtype", f"{self.name} has no {dtype(p)} precision setting (it sets "
                            f"{'/'.join(self.dtypes)}), and the plan's model is {dtype(p)}", "make the plan with a "
                            f"model file of dtype {' or '.join(self.dtypes)}, or export to another target")
        if self.training is None or p.workload is None or p.workload.training == self.training:
            return
        kind = "training" if self.training else "inference"
        raise PlanError("workload", f"{self.name} runs {kind} only; the plan is for "
                        f"{'training' if p.workload.training else 'inference'}",
                        f"make the plan with `sp-plan plan {'--inference ' if not self.training else ''}...` for {kind}")

    def export(self, p: Plan) -> str:
        """The text this target reads for ``p`` (PlanError when it cannot express ``p``)."""
        of_type("plan", p, Plan, "a Plan (Plan.load(file), or one sp_plan.plan returned)")
        self.check_workload(p)
        probs = self.problems(p)
        if probs:
            raise PlanError(probs[0][0], probs[0][1], f"export a plan {self.name} can express")
        batch_split(p)  # a batch the replicas' micro-batches do not divide is refused, whichever the target
        return self.render(p)


def header(p: Plan, target: Target, comment: str = "#") -> str:
    """The export's first lines: the plan it came from and the version of the target it was written for."""
    pred = f", predicted step {p.predicted.step_time_s:.3f} s" if p.predicted else ""
    return (f"{comment} sp-plan export: {p.summary()}{pred}\n"
            f"{comment} for {target.title}\n")


def dtype(p: Plan) -> str:
    """The dtype the plan was priced in: its model's, else ModelSpec's default (bf16)."""
    return p.model.dtype if p.model else ModelSpec.model_fields["dtype"].default


def batch_split(p: Plan) -> tuple[int, int, int]:
    """(global batch, micro-batch size, gradient-accumulation steps) of the plan's workload; a PlanError where dp x
    micro-batch size does not divide the batch (every framework asserts batch = dp x micro-batch x steps)."""
    dp, mbs = p.degrees["dp"], p.micro_batch_size
    batch = p.workload.batch if p.workload else dp * mbs
    if batch % (dp * mbs):
        raise PlanError("workload.batch", f"the batch of {batch} sequences is no multiple of dp {dp} x "
                        f"micro_batch_size {mbs}, so the replicas' micro-batches cannot make it",
                        f"make the plan with a batch that is a multiple of {dp * mbs} (dp x micro_batch_size), or "
                        "plan again for this batch")
    return batch, mbs, batch // (dp * mbs)
