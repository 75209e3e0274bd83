"""All-gather K/V context parallelism (Llama 3, arXiv 2407.21783, Sec. 3.3.2), with document masks and windows.

Forward. The context group all-gathers K and V (only the K/V heads travel: GQA keeps them small). Each rank
attends its local queries to the gathered K/V one chunk at a time, a chunk per group member in the plan's token
layout (``ring.member_tokens``: over the whole sequence, or per packed document), skipping the chunks its mask
empties and folding the others into (out, lse) with the online-softmax merge (``ring.attend_block``).

Backward. As TransformerEngine's AttnFuncWithCPAndKVAllGather, the forward keeps only the local K and V and the
backward gathers them again (a full-length K, V per layer is not held from forward to backward: the planner prices
this second gather, planner/allgather.py). Each chunk's FlashAttention-2 block backward runs against the global out
and lse; dq stays local, and the dk, dv of every chunk are accumulated and reduce-scattered to the chunk's owner.

Overlap (optional, ``kv_chunks``: a plan field, which ``Context.attention`` passes through ``runtime.attention``). The KV heads may be gathered in
chunks, as ring-flash-attention's llama3 variant strides them: the gather of chunk c + 1 is in flight while chunk c's
query heads attend (forward and backward), and in backward chunk c's reduce-scatter while chunk c + 1 computes. One chunk (the default)
gathers once, exposed.

Masks. Each (local queries, key chunk) pair's mask comes from the global token indices: causal, the same packed
document (``cu_seqlens`` over the global sequence) and a sliding window, as tiles of runs inside one document
(``kernels.block_tiles``): full or diagonal, with a small explicit mask only where a window's edge crosses a tile.
All-gather is indifferent to the mask: no rank waits on another's work in lock step, as a ring round does.

Hybrid. With a ulysses degree over 1, Ulysses' all-to-all wraps the all-gather (``usp.usp_attention`` with the
all-gather inside): each context-group member then holds its whole token list for H/U heads.
"""
from __future__ import annotations

from functools import lru_cache, partial

import torch
import torch.distributed as dist

from sp_plan.planner.errors import PlanError

from ..kernels import BlockMask
from .ring import (Ring, attend_chunks, attend_chunks_backward, check_masks, held_tokens, make_ring, member_block,
                   pad_tokens)
from .ulysses import check_ulysses_ranks, masked_ulysses
from .usp import usp_attention
from . import degree, register


@lru_cache(maxsize=256)
def chunk_masks(token_layout: str, size: int, seq_len: int, position: int, causal: bool,
                cu_seqlens: tuple[int, ...] | None, window: int | None) -> tuple[tuple[BlockMask, ...] | None, ...]:
    """Tiles of this rank's queries against each member's key chunk (member order, ``ring.member_block``), no
    matrix over a chunk; None = fully masked, skip."""
    return tuple(member_block(token_layout, size, seq_len, causal, cu_seqlens, window, position, r)
                 for r in range(size))


def _slot(ring: Ring, r: int) -> int:
    """Where member ``r`` (ring order) lands in an all-gather, which fills in group-rank order (sorted ranks)."""
    return sorted(ring.ranks).index(ring.ranks[r])


class Pending:
    """Collectives in flight and what to take from their buffers once they are done; ``keep`` holds their inputs
    until then (a freed input could be reused by the caching allocator while NCCL still reads it)."""

    def __init__(self, reqs: list, take, keep=()):
        self.reqs, self.take, self.keep = reqs, take, keep

    def result(self):
        """Wait for the collectives (NCCL: the compute stream waits, no host sync) and take the result."""
        for r in self.reqs:
            r.wait()
        return self.take()


def post_gather_kv(k: torch.Tensor, v: torch.Tensor, ring: Ring, lengths: list[int]) -> Pending:
    """Start gathering every member's K and V chunk (``lengths[r]`` tokens each): one all-gather each, at the longest
    chunk's length; the result is the chunks in ring order."""
    if ring.size == 1:
        return Pending([], lambda: ([k], [v]))
    n = max(lengths)
    k, v = pad_tokens(k, n).contiguous(), pad_tokens(v, n).contiguous()
    ks, vs = [torch.empty_like(k) for _ in ring.ranks], [torch.empty_like(v) for _ in ring.ranks]
    reqs = [dist.all_gather(ks, k, group=ring.group, async_op=True),
            dist.all_gather(vs, v, group=ring.group, async_op=True)]
    return Pending(reqs, lambda: ([ks[_slot(ring, r)][:, :lengths[r]] for r in range(ring.size)],
                                  [vs[_slot(ring, r)][:, :lengths[r]] for r in range(ring.size)]), keep=(k, v))


def gather_kv(k: torch.Tensor, v: torch.Tensor, ring: Ring, lengths: list[int]) -> tuple[list, list]:
    """Every member's K and V chunk (``lengths[r]`` tokens each), in ring order (``post_gather_kv``, waited)."""
    return post_gather_kv(k, v, ring, lengths).result()


def post_reduce_scatter(chunks: list[torch.Tensor], ring: Ring) -> Pending:
    """Start this rank's chunk of the sum over members of ``chunks`` (ring order): reduce-scatter, or on a backend
    without it (gloo) an all-reduce of all of them; chunks of different lengths travel padded."""
    if ring.size == 1:
        return Pending([], lambda: chunks[0])
    n, mine = max(c.shape[1] for c in chunks), chunks[ring.position].shape[1]
    by_slot = [pad_tokens(chunks[ring.ranks.index(g)], n).contiguous() for g in sorted(ring.ranks)]
    slot = sorted(ring.ranks).index(ring.ranks[ring.position])
    if dist.get_backend(ring.group) == "nccl":  # pragma: no cover - needs GPUs
        out = torch.empty_like(by_slot[slot])
        return Pending([dist.reduce_scatter(out, by_slot, group=ring.group, async_op=True)], lambda: out[:, :mine],
                       keep=by_slot)
    flat = torch.stack(by_slot)
    return Pending([dist.all_reduce(flat, group=ring.group, async_op=True)], lambda: flat[slot][:, :mine])


def reduce_scatter_chunks(chunks: list[torch.Tensor], ring: Ring) -> torch.Tensor:
    """This rank's chunk of the sum over members of ``chunks`` (``post_reduce_scatter``, waited)."""
    return post_reduce_scatter(chunks, ring).result()


def head_chunks(q_heads: int, kv_heads: int, n: int) -> list[tuple[slice, slice]]:
    """(query heads, KV heads) of each of ``n`` chunks: the KV heads in n equal groups and the query heads that use
    them (GQA: query head h uses KV head h // (q_heads / kv_heads))."""
    if n < 1 or kv_heads % n:
        raise PlanError("kv_chunks", f"{kv_heads} KV heads do not split into {n} chunks",
                        "use a kv_chunks that divides the KV heads (1: one gather)")
    g, m = q_heads // kv_heads, kv_heads // n
    return [(slice(c * m * g, (c + 1) * m * g), slice(c * m, (c + 1) * m)) for c in range(n)]


def _heads(x: torch.Tensor, h: slice) -> torch.Tensor:
    """Heads ``h`` of a (batch, seq, heads, dim) tensor, contiguous (the whole tensor as is)."""
    return x if h.start == 0 and h.stop == x.shape[2] else x[:, :, h].contiguous()


def gathered(k, v, ring: Ring, lengths, heads):
    """Each KV-head chunk's gathered K, V in turn, chunk c + 1's gather in flight while the caller computes on chunk c
    (ring-flash-attention's llama3 heads stride)."""
    pending = post_gather_kv(_heads(k, heads[0][1]), _heads(v, heads[0][1]), ring, lengths)
    for c in range(len(heads)):
        ks, vs = pending.result()
        if c + 1 < len(heads):
            pending = post_gather_kv(_heads(k, heads[c + 1][1]), _heads(v, heads[c + 1][1]), ring, lengths)
        yield ks, vs


def allgather_forward(q, k, v, ring: Ring, lengths, masks, heads, scale, backend=None):
    """Local queries against the gathered K, V, one KV-head chunk at a time (``heads``, ``gathered``); each chunk's
    gathered K, V are freed once it has attended. (out, lse)."""
    outs, lses = [], []
    for (qh, _), (ks, vs) in zip(heads, gathered(k, v, ring, lengths, heads)):
        o, m = attend_chunks(_heads(q, qh), ks, vs, masks, scale, backend)
        outs.append(o)
        lses.append(m)
    return torch.cat(outs, dim=2), torch.cat(lses, dim=1)


def allgather_backward(dout, q, k, v, out, lse, masks, ring: Ring, lengths, heads, scale, backend=None):
    """K, V gathered again chunk by chunk (the forward keeps only the local shards, as TransformerEngine's
    AttnFuncWithCPAndKVAllGather does); dq from every chunk; each chunk's dk, dv reduce-scattered to its owner, one
    KV-head chunk's reduce-scatter in flight while the next chunk computes."""
    dq, pending = torch.empty_like(q), []
    for (qh, _), (ks, vs) in zip(heads, gathered(k, v, ring, lengths, heads)):
        lse_h = lse if qh.start == 0 and qh.stop == lse.shape[1] else lse[:, qh].contiguous()
        g, dks, dvs = attend_chunks_backward(_heads(dout, qh), _heads(q, qh), ks, vs, _heads(out, qh), lse_h, masks,
                                             scale, backend)
        dq[:, :, qh] = g
        pending.append((post_reduce_scatter(dks, ring), post_reduce_scatter(dvs, ring)))
    dk = torch.cat([p.result() for p, _ in pending], dim=2)
    dv = torch.cat([p.result() for _, p in pending], dim=2)
    return dq, dk.to(k.dtype), dv.to(v.dtype)


class _AllGatherAttention(torch.autograd.Function):
    """Autograd wrapper: gather K/V, attend chunk by chunk; backward gathers them again and reduce-scatters dk, dv."""

    @staticmethod
    def forward(ctx, q, k, v, group, ranks, causal, token_layout, scale, backend, cu_seqlens, window, kv_chunks):
        ring = make_ring(group, ranks) if group is not None else Ring((0,), 0, None)
        seq_len = q.shape[1] * ring.size if cu_seqlens is None else cu_seqlens[-1]
        tokens = held_tokens(token_layout, ring, seq_len, q.shape[1], bool(causal), cu_seqlens, window)
        masks = chunk_masks(token_layout, ring.size, seq_len, ring.position, bool(causal), cu_seqlens, window)
        heads = head_chunks(q.shape[2], k.shape[2], kv_chunks)
        lengths = [len(t) for t in tokens]
        out, lse = allgather_forward(q, k, v, ring, lengths, masks, heads, scale, backend)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.masks, ctx.heads, ctx.scale, ctx.backend, ctx.lengths = ring, masks, heads, scale, backend, lengths
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = allgather_backward(dout, q, k, v, out, lse, ctx.masks, ctx.ring, ctx.lengths, ctx.heads,
                                        ctx.scale, ctx.backend)
        return dq, dk, dv, None, None, None, None, None, None, None, None, None


def allgather_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: dist.ProcessGroup | None = None,
                        *, causal: bool = False, token_layout: str = "contiguous", scale: float | None = None,
                        ranks=None, backend: str | None = None, cu_seqlens=None,
                        window: int | None = None, kv_chunks: int = 1) -> torch.Tensor:
    """All-gather K/V attention on (batch, local seq, heads, dim) blocks (Llama 3 Sec. 3.3.2).

    Member p of the group (``ranks`` order, default sorted) holds the tokens ``ring_tokens(token_layout, P, S)[p]``
    of a sequence of S = P * local seq tokens. ``cu_seqlens`` (0, ..., S) packs documents that attend only to
    themselves, laid out per document (``member_tokens``; members may then hold different numbers of tokens);
    ``window`` limits each query to the ``window`` keys before it (itself included). ``kv_chunks`` > 1 gathers the
    KV heads in that many chunks, each chunk's gather (backward: reduce-scatter) beside the previous one's compute.
    ``group`` None is a context group of one, as the registry's degree 1 (not the world, as ``ring_attention``'s).
    """
    if group is None and ranks is not None:
        raise PlanError("ranks", f"a ring order {list(ranks)} without a group: group None attends the local tokens "
                        "alone", "pass the context group with its ring order (or neither)")
    cu, w = check_masks(cu_seqlens, window, None)
    return _AllGatherAttention.apply(q, k, v, group, None if ranks is None else tuple(int(r) for r in ranks),
                                     causal, token_layout, scale, backend, cu, w, int(kv_chunks))


def _registered_allgather(q, k, v, *, groups, ranks, causal, token_layout, scale, backend=None, cu_seqlens=None,
                          window=None, kv_chunks: int = 1):
    """The registry's entry: all-gather K/V over the context (ring) group, inside Ulysses' all-to-all where the
    ulysses degree is over 1 (the hybrid), its KV heads in ``kv_chunks`` chunks (those each rank holds after the
    all-to-all); degree 1 attends locally, under masks in tiles (``masked_ulysses``)."""
    uly, ring = groups.get("ulysses"), groups.get("ring")
    if degree(uly) == 1 and degree(ring) == 1 and (cu_seqlens is not None or window is not None):
        cu, w = check_masks(cu_seqlens, window, None)
        return masked_ulysses(q, k, v, None, causal=causal, scale=scale, backend=backend, token_layout=token_layout,
                              cu_seqlens=cu, window=w)
    if degree(uly) == 1:
        return allgather_attention(q, k, v, groups.get("ring"), causal=causal, token_layout=token_layout,
                                   scale=scale, ranks=ranks.get("ring"), backend=backend, cu_seqlens=cu_seqlens,
                                   window=window, kv_chunks=kv_chunks)
    check_ulysses_ranks(uly, ranks.get("ulysses"))
    return usp_attention(q, k, v, uly, ring if degree(ring) > 1 else None, causal=causal, token_layout=token_layout,
                         scale=scale, ring_ranks=ranks.get("ring"), backend=backend, cu_seqlens=cu_seqlens,
                         window=window, inner=partial(allgather_attention, kv_chunks=kv_chunks))


register("allgather", _registered_allgather)
