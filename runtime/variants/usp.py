"""USP, unified sequence parallelism (Fang & Zhao 2024, Algorithm 2): Ulysses inside, ring across.

Rank (u, r) holds piece u of ring rank r's token list (``planner.layout.sp_tokens``). The Ulysses
all-to-all over the ulysses group gathers the pieces in order, so every ring rank then holds
exactly its ring-level tokens (``ring_tokens``) for H/U heads; ring attention runs over the ring
group in the plan's token layout, and the reverse all-to-all returns the output to the pieces.
Which dimension is inner in the rank mesh only changes the groups passed in.

Masks. With packed documents a ring member's token list is laid out per document (``ring.member_tokens``) and cut
into U pieces (``ring.member_pieces``) whose lengths may differ: the all-to-all exchanges them by their lengths and
the masked ring (or, for the all-gather hybrid, the masked all-gather) runs on the reassembled list.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..kernels import local_attention
from .ring import check_masks, check_share, make_ring, member_pieces, ring_attention
from .ulysses import check_local_tokens, check_ulysses_ranks, heads_to_seq, masked_ulysses, seq_to_heads
from . import degree, register


def usp_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ulysses_group: dist.ProcessGroup | None,
                  ring_group: dist.ProcessGroup | None, *, causal: bool = False, token_layout: str = "contiguous",
                  scale: float | None = None, ring_ranks=None, backend: str | None = None, cu_seqlens=None,
                  window: int | None = None, inner=ring_attention) -> torch.Tensor:
    """USP Algorithm 2: Ulysses all-to-all, ``inner`` attention (ring, or all-gather for its hybrid) over
    ``ring_group``, all-to-all back. A group given as None is a dimension of degree 1 (no all-to-all, or local
    attention). ``cu_seqlens`` and ``window`` as ``ring_attention``'s."""
    cu, w = check_masks(cu_seqlens, window, None)
    masked = cu is not None or w is not None
    if ring_group is None and masked:
        return masked_ulysses(q, k, v, ulysses_group, causal=causal, scale=scale, backend=backend,
                              token_layout=token_layout, cu_seqlens=cu, window=w)
    lengths = piece_lengths(q, ulysses_group, ring_group, ring_ranks, causal, token_layout, cu, w) if masked else None
    if ulysses_group is not None:
        q, k, v = seq_to_heads(q, k, v, ulysses_group, lengths)
    if ring_group is not None:
        out = inner(q, k, v, ring_group, causal=causal, token_layout=token_layout, scale=scale, ranks=ring_ranks,
                    backend=backend, cu_seqlens=cu, window=w)
    else:
        out = local_attention(q, k, v, causal=causal, scale=scale, backend=backend)
    return out if ulysses_group is None else heads_to_seq(out, ulysses_group, lengths)


def piece_lengths(q, ulysses_group, ring_group, ring_ranks, causal, token_layout, cu, window) -> list[int]:
    """Tokens of each ulysses member of this rank's ring member (``ring.member_pieces``), after checking that this
    rank holds its own."""
    u = 1 if ulysses_group is None else dist.get_world_size(ulysses_group)
    ring = make_ring(ring_group, ring_ranks)
    seq_len = q.shape[1] * u * ring.size if cu is None else cu[-1]
    check_share(q.shape[1], token_layout, ring.size, u, seq_len)
    pieces = member_pieces(token_layout, u, ring.size, seq_len, bool(causal), cu, window)[ring.position]
    lengths = [len(p) for p in pieces]
    check_local_tokens(q.shape[1], lengths, 0 if ulysses_group is None else dist.get_rank(ulysses_group),
                       token_layout)
    return lengths


def _registered_usp(q, k, v, *, groups, ranks, causal, token_layout, scale, backend=None, cu_seqlens=None,
                    window=None):
    """The registry's entry: USP over groups["ulysses"] and groups["ring"] (degree-1 sides dropped)."""
    uly_g, ring_g = groups.get("ulysses"), groups.get("ring")
    uly_g = uly_g if degree(uly_g) > 1 else None
    ring_g = ring_g if degree(ring_g) > 1 else None
    check_ulysses_ranks(uly_g, ranks.get("ulysses"))
    return usp_attention(q, k, v, uly_g, ring_g, causal=causal, token_layout=token_layout, scale=scale,
                         ring_ranks=ranks.get("ring"), backend=backend, cu_seqlens=cu_seqlens, window=window)


register("usp", _registered_usp)
