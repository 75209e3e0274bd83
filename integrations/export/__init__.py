"""Exporters: a Plan into what Megatron-LM, torchtitan, DeepSpeed, yunchang, xDiT or accelerate read.

``TARGETS`` maps a target name to its Target (what it can express and its writer); ``nearest`` finds
the best plan a target can express when it cannot express the one given.
"""
from __future__ import annotations

from sp_plan.planner.errors import PlanError

from . import accelerate, deepspeed, megatron, torchtitan, xdit, yunchang
from .target import Target

TARGETS: dict[str, Target] = {m.TARGET.name: m.TARGET for m in (megatron, torchtitan, deepspeed, yunchang, xdit,
                                                                 accelerate)}


def target(name: str) -> Target:
    """The Target called ``name``; PlanError naming the known ones otherwise."""
    if name not in TARGETS:
        raise PlanError("to", f"unknown target {name!r}", f"use one of {'|'.join(TARGETS)}")
    return TARGETS[name]


__all__ = ["TARGETS", "Target", "target"]
