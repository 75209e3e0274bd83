"""One entry point for every attention variant of the runtime, chosen by the plan's algorithm name."""
from __future__ import annotations

import torch
import torch.distributed as dist

from sp_plan.planner.errors import PlanError
from sp_plan.planner.layout import check_token_layout

from .kernels import local_attention
from .ring import ring_attention
from .ulysses import ulysses_attention
from .usp import usp_attention

ALGORITHMS = ["ring", "ulysses", "usp"]
#: further variants by algorithm name: fn(q, k, v, *, groups, ranks, causal, token_layout, scale) -> out
VARIANTS: dict = {}


def register(name: str, fn) -> None:
    """Add an attention variant (WallFacer, TokenRing, ...) under its plan algorithm name."""
    VARIANTS[name] = fn
    if name not in ALGORITHMS:
        ALGORITHMS.append(name)


def _size(group) -> int:
    """Degree of a group; an absent group (None) is degree 1."""
    return 1 if group is None else dist.get_world_size(group)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, algorithm: str,
              groups: dict[str, dist.ProcessGroup] | None, ranks: dict[str, list[int]] | None = None,
              causal: bool = False, token_layout: str = "contiguous", scale: float | None = None) -> torch.Tensor:
    """Sequence-parallel attention of (batch, local seq, heads, dim) shards by algorithm name.

    ``groups`` maps "ring" and "ulysses" to process groups (missing or None = degree 1);
    ``ranks`` may give the ring's global ranks in ring order under "ring", and the ulysses
    group's ranks under "ulysses" (checked: the all-to-all follows the group's rank order, which
    must be the ulysses coordinate). With every degree 1 this is plain local attention.
    """
    _load_variants()
    if algorithm not in ALGORITHMS:
        raise PlanError("algorithm", f"unknown algorithm {algorithm!r}", f"use one of {list(ALGORITHMS)}")
    check_token_layout(token_layout)
    groups, ranks = groups or {}, ranks or {}
    if algorithm in VARIANTS:
        return VARIANTS[algorithm](q, k, v, groups=groups, ranks=ranks, causal=causal, token_layout=token_layout,
                                   scale=scale)
    ring_g, uly_g = groups.get("ring"), groups.get("ulysses")
    ring_n = _size(ring_g) if algorithm in ("ring", "usp") else 1
    uly_n = _size(uly_g) if algorithm in ("ulysses", "usp") else 1
    if uly_n > 1 and ranks.get("ulysses") is not None:
        members = dist.get_process_group_ranks(uly_g)
        if list(ranks["ulysses"]) != members:
            raise PlanError("ranks.ulysses", f"order {list(ranks['ulysses'])} differs from the group's rank order "
                            f"{members}", "list the ulysses group's ranks by ulysses coordinate, as the layout does")
    if ring_n == 1 and uly_n == 1:
        return local_attention(q, k, v, causal=causal, scale=scale)
    if algorithm == "ring":
        return ring_attention(q, k, v, ring_g, causal=causal, token_layout=token_layout, scale=scale,
                              ranks=ranks.get("ring"))
    if algorithm == "ulysses":
        return ulysses_attention(q, k, v, uly_g, causal=causal, scale=scale)
    return usp_attention(q, k, v, uly_g, ring_g, causal=causal,
                         token_layout=token_layout, scale=scale, ring_ranks=ranks.get("ring"))


def _load_variants() -> None:
    """Import the modules that register WallFacer, TokenRing and METP (they import this module)."""
    from . import metp, tokenring, wallfacer  # noqa: F401
