"""The physical parameters the cost engine reads: one set, from a preset, from `sp-plan tune`, or imported.

Defaults are neutral: ``Params()`` leaves every prediction exactly as the uncalibrated engine makes
it (the device's datasheet efficiencies, link capacities as given, perfect overlap, no overheads).
A profile (planner/profile.py) carries a fitted ``Params``; the engine never forks its cost code
for calibration, it reads these fields (design.md, "Profile once per cluster").
"""
from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .merges import MERGES
from .plausible import MIN_EFFICIENCY

#: pattern classes of the engine's communication patterns (engine.pattern_steps)
PATTERN_CLASS = {"shift": "p2p", "shift_back": "p2p", "shift_bi": "p2p_bidir", "all_gather": "all_gather",
                 "reduce_scatter": "reduce_scatter", "all_reduce": "all_reduce", "all_to_all": "all_to_all"}
#: link classes: a phase whose most loaded link is inside a node, or one into the network fabric; "host": inside a
#: node on the CPU's links (PCIe into a host bridge, the socket interconnect), priced as "intra" without a fit of its own
LINK_CLASSES = ("intra", "inter", "host")


#: the most fixed seconds an overhead may claim per call or layer (tune's round probe gives up at the same)
MAX_OVERHEAD_S = 10.0
#: the most framework bytes a rank may claim beyond the modelled parts (10 TB: more than any device holds)
MAX_OVERHEAD_BYTES = 1e13


class Curve(BaseModel):
    """Efficiency (achieved / peak FLOP/s) against a size in tokens; log-linear between points, flat outside."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    points: tuple[tuple[float, float], ...] = Field(description="(size in tokens, efficiency), sizes increasing")

    @field_validator("points")
    @classmethod
    def _sorted(cls, pts):
        if not pts:
            raise ValueError("a curve needs at least one point")
        for x, y in pts:
            if not (x > 0 and math.isfinite(x) and y >= MIN_EFFICIENCY and math.isfinite(y)):
                raise ValueError(f"point ({x}, {y}): sizes must be positive and finite, efficiencies finite and at "
                                 f"least {MIN_EFFICIENCY:g}")
        return tuple(sorted((float(x), float(y)) for x, y in pts))

    def at(self, x: float) -> float:
        """Efficiency at size ``x`` (log-linear interpolation in the size, clamped to the end points)."""
        pts = self.points
        if x <= pts[0][0]:
            return pts[0][1]
        if x >= pts[-1][0]:
            return pts[-1][1]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            if x <= x1:
                f = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
                return y0 + f * (y1 - y0)
        return pts[-1][1]  # pragma: no cover


class CommFit(BaseModel):
    """A collective kind on a link class: fixed seconds per step and achieved / modelled bandwidth."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    alpha_s: float = Field(default=0.0, ge=0, le=MAX_OVERHEAD_S)
    efficiency: float = Field(default=1.0, ge=MIN_EFFICIENCY)


def all_reduce_fit(rs: CommFit | None, ag: CommFit | None) -> CommFit | None:
    """A ring all-reduce is a reduce-scatter then an all-gather, n-1 steps each (engine.pattern_steps: 2(n-1) in
    all): its fit is theirs averaged per step, alpha (a_rs + a_ag) / 2 and 1 / efficiency (1 / e_rs + 1 / e_ag) / 2,
    so that it costs exactly the two phases; None unless both are fitted."""
    if rs is None or ag is None:
        return None
    return CommFit.model_construct(alpha_s=(rs.alpha_s + ag.alpha_s) / 2,
                                   efficiency=2.0 / (1.0 / rs.efficiency + 1.0 / ag.efficiency))


#: the efficiency curves of Params (achieved / peak FLOP/s by size)
CURVES = ("attention_fwd", "attention_bwd", "attention_fwd_masked", "attention_bwd_masked", "matmul")


class Params(BaseModel):
    """Everything calibration may change in the cost model (neutral defaults: the uncalibrated engine)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    attention_fwd: Curve | None = Field(default=None, description="attention block forward efficiency by block length "
                                        "(None: the device's attn_efficiency / attn_half_block curve)")
    attention_bwd: Curve | None = Field(default=None, description="attention block backward efficiency by block length")
    attention_fwd_masked: Curve | None = Field(default=None, description="forward efficiency of a block under a causal "
                                               "mask by its length, FLOPs counted as the pairs computed (None: "
                                               "attention_fwd at the square block of as many pairs)")
    attention_bwd_masked: Curve | None = Field(default=None, description="backward efficiency of a causally masked "
                                               "block by its length")
    matmul: Curve | None = Field(default=None, description="GEMM efficiency by rows (tokens) of the GEMM "
                                 "(None: the device's matmul_efficiency)")
    comm: dict[str, CommFit] = Field(default_factory=dict, description='key "PATTERN_CLASS/LINK_CLASS", e.g. "all_to_all/intra"')
    overlap: float = Field(default=1.0, ge=0, le=1, description="fraction of min(compute, comm) a double-buffered step hides")
    compute_efficiency: float = Field(default=1.0, gt=0, le=1.5, description="achieved / isolated-kernel "
                                      "efficiency of the compute phases (GEMMs, attention blocks) inside a full "
                                      "training step: the curves are timed alone, a step runs them among the rest "
                                      "(contention for cores and caches, clocks under load, the framework between "
                                      "kernels); 1 = as timed")
    solo_speedup: float = Field(default=1.0, ge=1, le=64, description="how much faster a rank computes while the "
                                "others on its device's cores wait than while they all compute (CPU ranks sharing "
                                "cores: about ranks / cores; 1 on GPUs): an uneven attention round then costs its "
                                "ranks' mean work, at least the busiest's over this (Compute.balance)")
    round_overhead_s: float = Field(default=0.0, ge=0, le=MAX_OVERHEAD_S, description="fixed seconds per attention block call (launch, merge, sync)")
    layer_overhead_s: float = Field(default=0.0, ge=0, le=MAX_OVERHEAD_S, description="fixed seconds per layer and micro-batch of a "
                                    "training step beyond its kernels: the framework dispatching the layer's ops "
                                    "(norms, activations, residuals, autograd), exposed where the host waits on them "
                                    "(CPU ranks; hidden behind the kernels on a busy GPU: 0 in the presets)")
    tp_overhead_s: float = Field(default=0.0, ge=0, le=MAX_OVERHEAD_S, description="fixed seconds per tensor-parallel collective of a "
                                 "block's linear layers (Megatron TP-sp) beyond its transfer: the framework's "
                                 "redistribution around it and the ranks' wait for the slowest at a blocking "
                                 "collective (CPU ranks sharing cores; 0 in the presets)")
    memory_overhead_bytes: float = Field(default=0.0, ge=0, le=MAX_OVERHEAD_BYTES, description="framework bytes per rank beyond the modelled "
                                         "parts (>= 0: the modelled parts are the floor)")
    activation_factor: float = Field(default=1.0, gt=0, le=20.0, description="measured / modelled activation bytes "
                                     "(the fit keeps it in 0.05-20)")
    hbm_bandwidth: float | None = Field(default=None, ge=1e6, description="achieved device-memory bytes/s of the "
                                        "memory-bound phases (ring out/LSE merges, all-to-all packing copies); "
                                        "None: those phases cost nothing (the uncalibrated engine)")
    ring_merge: Literal[tuple(MERGES)] = Field(default="sp-plan", description="the runtime whose out/LSE merge a "
                                                "ring round runs, as its device-memory bytes (planner/merges.py): "
                                                "sp-plan's own (what tune measures), yunchang, transformer-engine")

    @field_validator("comm")
    @classmethod
    def _comm_keys(cls, comm):
        kinds = sorted(set(PATTERN_CLASS.values()))
        for key in comm:
            kind, _, link = key.partition("/")
            if kind not in kinds or link not in LINK_CLASSES:
                raise ValueError(f"key {key!r} is not PATTERN_CLASS/LINK_CLASS: use one of {kinds} / one of "
                                 f"{list(LINK_CLASSES)}, e.g. 'all_to_all/intra'")
        return comm

    def comm_fit(self, pattern: str, link_class: str) -> CommFit | None:
        """The fit for an engine pattern on a link class, or None (uncalibrated); "host" falls back to "intra", and an
        all-reduce without a fit of its own to ``all_reduce_fit`` of the reduce-scatter and all-gather fits."""
        cls = PATTERN_CLASS.get(pattern, pattern)
        fit = self._fit(cls, link_class)
        if fit is None and cls == "all_reduce":
            return all_reduce_fit(self._fit("reduce_scatter", link_class), self._fit("all_gather", link_class))
        return fit

    def _fit(self, cls: str, link_class: str) -> CommFit | None:
        fit = self.comm.get(f"{cls}/{link_class}")
        return self.comm.get(f"{cls}/intra") if fit is None and link_class == "host" else fit

    def is_default(self) -> bool:
        return self == Params()
