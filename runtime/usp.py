"""USP, unified sequence parallelism (Fang & Zhao 2024, Algorithm 2): Ulysses inside, ring across.

Rank (u, r) holds piece u of ring rank r's token list (``planner.layout.sp_tokens``). The Ulysses
all-to-all over the ulysses group gathers the pieces in order, so every ring rank then holds
exactly its ring-level tokens (``ring_tokens``) for H/U heads; ring attention runs over the ring
group in the plan's token layout, and the reverse all-to-all returns the output to the pieces.
Which dimension is inner in the rank mesh only changes the groups passed in.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .kernels import local_attention
from .ring import ring_attention
from .ulysses import check_ulysses_ranks, heads_to_seq, seq_to_heads
from .variants import degree, register


def usp_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ulysses_group: dist.ProcessGroup | None,
                  ring_group: dist.ProcessGroup | None, *, causal: bool = False, token_layout: str = "contiguous",
                  scale: float | None = None, ring_ranks=None, backend: str | None = None) -> torch.Tensor:
    """USP Algorithm 2: Ulysses all-to-all, ring attention over ``ring_group``, all-to-all back.

    A group given as None is a dimension of degree 1 (no all-to-all, or local attention).
    """
    if ulysses_group is not None:
        q, k, v = seq_to_heads(q, k, v, ulysses_group)
    if ring_group is not None:
        out = ring_attention(q, k, v, ring_group, causal=causal, token_layout=token_layout, scale=scale,
                             ranks=ring_ranks, backend=backend)
    else:
        out = local_attention(q, k, v, causal=causal, scale=scale, backend=backend)
    return out if ulysses_group is None else heads_to_seq(out, ulysses_group)


def _registered_usp(q, k, v, *, groups, ranks, causal, token_layout, scale, backend=None):
    """The registry's entry: USP over groups["ulysses"] and groups["ring"] (degree-1 sides dropped)."""
    uly_g, ring_g = groups.get("ulysses"), groups.get("ring")
    uly_g = uly_g if degree(uly_g) > 1 else None
    ring_g = ring_g if degree(ring_g) > 1 else None
    check_ulysses_ranks(uly_g, ranks.get("ulysses"))
    return usp_attention(q, k, v, uly_g, ring_g, causal=causal, token_layout=token_layout, scale=scale,
                         ring_ranks=ranks.get("ring"), backend=backend)


register("usp", _registered_usp)
