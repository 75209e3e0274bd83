"""All-gather K/V context parallelism (Llama 3, arXiv 2407.21783, Sec. 3.3.2), with document masks and windows.

Forward. The context group all-gathers K and V (only the K/V heads travel: GQA keeps them small). Each rank
attends its local queries to the gathered K/V one chunk at a time, a chunk per group member in the plan's token
layout (``ring.member_tokens``: over the whole sequence, or per packed document), skipping the chunks its mask
empties and folding the others into (out, lse) with the online-softmax merge (``ring.attend_block``).

Backward. Each chunk's FlashAttention-2 block backward runs against the global out and lse; dq stays local, and
the dk, dv of every chunk are accumulated and reduce-scattered to the chunk's owner.

Masks. Each (local queries, key chunk) pair's mask comes from the global token indices: causal, the same packed
document (``cu_seqlens`` over the global sequence) and a sliding window (``kernels.attended``), reduced to the
region the kernel needs (``kernels.reduce_mask``). All-gather is indifferent to the mask: no rank waits on
another's work in lock step, as a ring round does.

Hybrid. With a ulysses degree over 1, Ulysses' all-to-all wraps the all-gather (``usp.usp_attention`` with the
all-gather inside): each context-group member then holds its whole token list for H/U heads.
"""
from __future__ import annotations

from functools import lru_cache

import torch
import torch.distributed as dist

from .kernels import BlockMask, attended, document_ids, reduce_mask
from .ring import (Ring, attend_chunks, attend_chunks_backward, check_masks, held_tokens, make_ring, member_tokens,
                   pad_tokens)
from .ulysses import check_ulysses_ranks
from .usp import usp_attention
from .variants import degree, register


@lru_cache(maxsize=256)
def chunk_masks(token_layout: str, size: int, seq_len: int, position: int, causal: bool,
                cu_seqlens: tuple[int, ...] | None, window: int | None) -> tuple[BlockMask | None, ...]:
    """Mask of this rank's queries against each member's key chunk (member order); None = fully masked, skip."""
    tokens = member_tokens(token_layout, size, seq_len, causal, cu_seqlens, window)
    docs = None if cu_seqlens is None else document_ids(cu_seqlens, seq_len)
    return tuple(reduce_mask(attended(tokens[position], tokens[r], causal=causal, documents=docs, window=window))
                 for r in range(size))


def _slot(ring: Ring, r: int) -> int:
    """Where member ``r`` (ring order) lands in an all-gather, which fills in group-rank order (sorted ranks)."""
    return sorted(ring.ranks).index(ring.ranks[r])


def gather_kv(k: torch.Tensor, v: torch.Tensor, ring: Ring, lengths: list[int]) -> tuple[list, list]:
    """Every member's K and V chunk (``lengths[r]`` tokens each), in ring order: one all-gather each, at the
    longest chunk's length."""
    if ring.size == 1:
        return [k], [v]
    n = max(lengths)
    k, v = pad_tokens(k, n), pad_tokens(v, n)
    ks, vs = [torch.empty_like(k) for _ in ring.ranks], [torch.empty_like(v) for _ in ring.ranks]
    dist.all_gather(ks, k, group=ring.group)
    dist.all_gather(vs, v, group=ring.group)
    return ([ks[_slot(ring, r)][:, :lengths[r]] for r in range(ring.size)],
            [vs[_slot(ring, r)][:, :lengths[r]] for r in range(ring.size)])


def reduce_scatter_chunks(chunks: list[torch.Tensor], ring: Ring) -> torch.Tensor:
    """This rank's chunk of the sum over members of ``chunks`` (ring order): reduce-scatter, or on a backend
    without it (gloo) an all-reduce of all of them; chunks of different lengths travel padded."""
    if ring.size == 1:
        return chunks[0]
    n, mine = max(c.shape[1] for c in chunks), chunks[ring.position].shape[1]
    by_slot = [pad_tokens(chunks[ring.ranks.index(g)], n) for g in sorted(ring.ranks)]
    slot = sorted(ring.ranks).index(ring.ranks[ring.position])
    if dist.get_backend(ring.group) == "nccl":  # pragma: no cover - needs GPUs
        out = torch.empty_like(by_slot[slot])
        dist.reduce_scatter(out, by_slot, group=ring.group)
        return out[:, :mine]
    flat = torch.stack(by_slot)
    dist.all_reduce(flat, group=ring.group)
    return flat[slot][:, :mine]


def allgather_backward(dout, q, ks, vs, out, lse, masks, ring: Ring, scale, backend=None):
    """dq from every chunk; each chunk's dk, dv reduce-scattered to its owner."""
    dq, dks, dvs = attend_chunks_backward(dout, q, ks, vs, out, lse, masks, scale, backend)
    dk, dv = reduce_scatter_chunks(dks, ring), reduce_scatter_chunks(dvs, ring)
    return dq.to(q.dtype), dk.to(ks[0].dtype), dv.to(vs[0].dtype)


class _AllGatherAttention(torch.autograd.Function):
    """Autograd wrapper: gather K/V, attend chunk by chunk; backward reduce-scatters dk, dv."""

    @staticmethod
    def forward(ctx, q, k, v, group, ranks, causal, token_layout, scale, backend, cu_seqlens, window):
        ring = make_ring(group, ranks) if group is not None else Ring((0,), 0, None)
        seq_len = q.shape[1] * ring.size if cu_seqlens is None else cu_seqlens[-1]
        tokens = held_tokens(token_layout, ring, seq_len, q.shape[1], bool(causal), cu_seqlens, window)
        masks = chunk_masks(token_layout, ring.size, seq_len, ring.position, bool(causal), cu_seqlens, window)
        ks, vs = gather_kv(k.contiguous(), v.contiguous(), ring, [len(t) for t in tokens])
        out, lse = attend_chunks(q, ks, vs, masks, scale, backend)
        ctx.save_for_backward(q, out, lse, *ks, *vs)
        ctx.ring, ctx.masks, ctx.scale, ctx.backend = ring, masks, scale, backend
        return out

    @staticmethod
    def backward(ctx, dout):
        q, out, lse, *kv = ctx.saved_tensors
        n = ctx.ring.size
        dq, dk, dv = allgather_backward(dout, q, kv[:n], kv[n:], out, lse, ctx.masks, ctx.ring, ctx.scale,
                                        ctx.backend)
        return dq, dk, dv, None, None, None, None, None, None, None, None


def allgather_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: dist.ProcessGroup | None = None,
                        *, causal: bool = False, token_layout: str = "contiguous", scale: float | None = None,
                        ranks=None, backend: str | None = None, cu_seqlens=None,
                        window: int | None = None) -> torch.Tensor:
    """All-gather K/V attention on (batch, local seq, heads, dim) blocks (Llama 3 Sec. 3.3.2).

    Member p of the group (``ranks`` order, default sorted) holds the tokens ``ring_tokens(token_layout, P, S)[p]``
    of a sequence of S = P * local seq tokens. ``cu_seqlens`` (0, ..., S) packs documents that attend only to
    themselves, laid out per document (``member_tokens``; members may then hold different numbers of tokens);
    ``window`` limits each query to the ``window`` keys before it (itself included).
    """
    cu, w = check_masks(cu_seqlens, window, None)
    return _AllGatherAttention.apply(q, k, v, group, None if ranks is None else tuple(int(r) for r in ranks),
                                     causal, token_layout, scale, backend, cu, w)


def _registered_allgather(q, k, v, *, groups, ranks, causal, token_layout, scale, backend=None, cu_seqlens=None,
                          window=None):
    """The registry's entry: all-gather K/V over the context (ring) group, inside Ulysses' all-to-all where the
    ulysses degree is over 1 (the hybrid); degree 1 attends locally with the masks."""
    uly = groups.get("ulysses")
    if degree(uly) == 1:
        return allgather_attention(q, k, v, groups.get("ring"), causal=causal, token_layout=token_layout,
                                   scale=scale, ranks=ranks.get("ring"), backend=backend, cu_seqlens=cu_seqlens,
                                   window=window)
    check_ulysses_ranks(uly, ranks.get("ulysses"))
    ring = groups.get("ring")
    return usp_attention(q, k, v, uly, ring if degree(ring) > 1 else None, causal=causal, token_layout=token_layout,
                         scale=scale, ring_ranks=ranks.get("ring"), backend=backend, cu_seqlens=cu_seqlens,
                         window=window, inner=allgather_attention)


register("allgather", _registered_allgather)
