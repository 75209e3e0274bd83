"""DeepSpeed-Ulysses attention (Jacobs et al. 2023): all-to-all sequence <-> heads around local attention.

Each of the U ranks of the ulysses group holds S/U tokens of all heads. One all-to-all (q, k and
v packed in a single exchange) gives every rank all S tokens of H/U query heads and of the KV
heads those query heads use; it runs attention locally, and a second all-to-all returns the
output to the sequence shards. Both all-to-alls are autograd functions whose backward is the
reverse all-to-all. GQA: when the KV heads do not split evenly over U (fewer KV heads than U),
KV heads are replicated so that each rank receives the ones its query heads need, and the
gradients of the replicas are summed back onto their KV head.

Masks. With packed documents (``cu_seqlens``) the members' local lengths may differ (``ring.member_pieces``): the
all-to-alls then exchange pieces of different lengths (all_to_all_single with split sizes, exact both ways). After
the all-to-all a rank holds the whole sequence in token order for its heads, so the mask applies directly: each
document is cut into tiles, and only the tile pairs inside one document and within the window's reach are computed
(``tiled_attention``), with no mask matrix but for a window's band.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch
import torch.distributed as dist

from sp_plan.planner.errors import PlanError

from ..kernels import MIN_TILE, BlockMask, attended, local_attention, lse_dtype, reduce_mask
from .ring import attend_chunks, attend_chunks_backward, check_masks, check_share, member_pieces
from . import degree, register


def check_heads(q_heads: int, kv_heads: int, degree: int) -> None:
    """Ulysses splits query heads over its degree; GQA needs whole groups of query heads per KV head."""
    if q_heads % degree:
        raise PlanError("ulysses", f"{q_heads} query heads are not divisible by the ulysses degree {degree}",
                        "choose a ulysses degree that divides the query heads and put the rest of the "
                        "sequence parallelism on ring (usp)")
    if q_heads % kv_heads:
        raise PlanError("kv_heads", f"{q_heads} query heads are not a multiple of {kv_heads} KV heads",
                        "use a KV head count that divides the query heads")


@lru_cache(maxsize=256)
def kv_split(q_heads: int, kv_heads: int, degree: int) -> tuple[int, tuple[int, ...] | None]:
    """(KV heads per rank, KV head sent to each rank's slots in order, or None for an even split).

    Query head h uses KV head h // (q_heads / kv_heads). Rank u gets query heads
    [u * q_heads/degree, (u + 1) * q_heads/degree); its local query head j then uses local KV head
    j // (q_heads/degree / local KV heads), the same GQA rule on the rank.
    """
    if kv_heads % degree == 0:
        return kv_heads // degree, None
    local_q, group = q_heads // degree, q_heads // kv_heads
    if degree % kv_heads == 0:  # several ranks share one KV head: replicate it
        return 1, tuple(u * local_q // group for u in range(degree))
    return local_q, tuple(h // group for h in range(q_heads))  # no common split: one KV head per query head


def all_to_all(send: torch.Tensor, group) -> torch.Tensor:
    """all_to_all_single on dim 0 (one slice per rank of ``group``)."""
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv


def exchange(pieces: list[torch.Tensor], shapes: list[tuple[int, ...]], group) -> list[torch.Tensor]:
    """All-to-all of one piece to each member (group rank order) and one piece shaped ``shapes[u]`` from each:
    all_to_all_single with split sizes, so pieces may differ in length."""
    sizes = [math.prod(s) for s in shapes]
    send = torch.cat([p.reshape(-1) for p in pieces])
    recv = send.new_empty(sum(sizes))
    dist.all_to_all_single(recv, send, output_split_sizes=sizes, input_split_sizes=[p.numel() for p in pieces],
                           group=group)
    return [r.view(s) for r, s in zip(recv.split(sizes), shapes)]


def gather_sequence(send: torch.Tensor, group, lengths) -> torch.Tensor:
    """(degree, b, s, h, d) head slices of this rank's tokens, one per member -> (b, S, h, d): every member's
    tokens of this rank's heads, in member order (``lengths``: each member's tokens, or None if all are s)."""
    degree, b, s, h, d = send.shape
    if lengths is None:
        return all_to_all(send, group).transpose(0, 1).reshape(b, degree * s, h, d)
    return torch.cat(exchange(list(send.unbind(0)), [(b, n, h, d) for n in lengths], group), dim=1)


def scatter_sequence(full: torch.Tensor, group, lengths, s: int) -> torch.Tensor:
    """Inverse of ``gather_sequence``: (b, S, h, d) -> (degree, b, s, h, d), member u's tokens sent back to u."""
    b, _, h, d = full.shape
    degree = len(lengths)
    pieces = [p.contiguous() for p in full.split(list(lengths), dim=1)]
    return torch.stack(exchange(pieces, [(b, s, h, d)] * degree, group))


class _SeqToHeads(torch.autograd.Function):
    """Ulysses all-to-all: q, k, v from (B, S/U, H, D) sequence shards to (B, S, H/U, D) head shards."""

    @staticmethod
    def forward(ctx, q, k, v, group, degree, lengths=None):
        b, s, q_heads, d = q.shape
        kv_heads = k.shape[2]
        kv_local, kv_index = kv_split(q_heads, kv_heads, degree)
        hq = q_heads // degree
        idx = None if kv_index is None else torch.tensor(kv_index, device=q.device)
        send = q.new_empty(degree, b, s, hq + 2 * kv_local, d)
        send[..., :hq, :].copy_(q.reshape(b, s, degree, hq, d).permute(2, 0, 1, 3, 4))
        for j, x in enumerate((k, v)):
            x = x if idx is None else x.index_select(2, idx)
            lo = hq + j * kv_local
            send[..., lo:lo + kv_local, :].copy_(x.reshape(b, s, degree, kv_local, d).permute(2, 0, 1, 3, 4))
        full = gather_sequence(send, group, lengths)
        ctx.group, ctx.degree, ctx.idx, ctx.shapes, ctx.lengths = group, degree, idx, (q.shape, k.shape), lengths
        return full[..., :hq, :], full[..., hq:hq + kv_local, :], full[..., hq + kv_local:, :]

    @staticmethod
    def backward(ctx, dq, dk, dv):
        (b, s, q_heads, d), k_shape = ctx.shapes
        degree, idx = ctx.degree, ctx.idx
        hq = q_heads // degree
        kv_local = k_shape[2] // degree if idx is None else len(idx) // degree
        ref = next(g for g in (dq, dk, dv) if g is not None)
        alloc = torch.empty if all(g is not None for g in (dq, dk, dv)) else torch.zeros
        grads = [(lo, n, g) for lo, n, g in ((0, hq, dq), (hq, kv_local, dk), (hq + kv_local, kv_local, dv))
                 if g is not None]
        if ctx.lengths is None:  # straight into the all-to-all's (degree, b, s, ...) layout: one copy
            send = alloc(degree, b, s, hq + 2 * kv_local, d, dtype=ref.dtype, device=ref.device)
            for lo, n, g in grads:
                send[..., lo:lo + n, :].copy_(g.reshape(b, degree, s, n, d).transpose(0, 1))
            recv = all_to_all(send, ctx.group)
        else:
            full = alloc(b, sum(ctx.lengths), hq + 2 * kv_local, d, dtype=ref.dtype, device=ref.device)
            for lo, n, g in grads:
                full[..., lo:lo + n, :].copy_(g)
            recv = scatter_sequence(full, ctx.group, ctx.lengths, s)
        recv = recv.permute(1, 2, 0, 3, 4)  # (b, s, degree, heads, d)
        grad_q = recv[..., :hq, :].reshape(b, s, q_heads, d)
        grads_kv = []
        for lo in (hq, hq + kv_local):
            g = recv[..., lo:lo + kv_local, :].reshape(b, s, degree * kv_local, d)
            if idx is not None:  # sum the gradients of replicated KV heads onto their head
                g = g.new_zeros(k_shape).index_add_(2, idx, g)
            grads_kv.append(g)
        return grad_q, grads_kv[0], grads_kv[1], None, None, None


class _HeadsToSeq(torch.autograd.Function):
    """Ulysses all-to-all back: output from (B, S, H/U, D) head shards to (B, S/U, H, D) sequence shards."""

    @staticmethod
    def forward(ctx, out, group, degree, lengths=None):
        b, n, h, d = out.shape
        ctx.group, ctx.degree, ctx.lengths = group, degree, lengths
        if lengths is None:
            s = n // degree
            recv = all_to_all(out.reshape(b, degree, s, h, d).transpose(0, 1).contiguous(), group)
        else:
            s = lengths[dist.get_rank(group)]
            recv = scatter_sequence(out, group, lengths, s)
        return recv.permute(1, 2, 0, 3, 4).reshape(b, s, degree * h, d)

    @staticmethod
    def backward(ctx, dout):
        b, s, heads, d = dout.shape
        degree = ctx.degree
        send = dout.reshape(b, s, degree, heads // degree, d).permute(2, 0, 1, 3, 4).contiguous()
        return gather_sequence(send, ctx.group, ctx.lengths), None, None, None


def _degree(group) -> int:
    return dist.get_world_size(group) if group is not None else dist.get_world_size()


def _even(lengths) -> tuple[int, ...] | None:
    """``lengths`` as a tuple, or None where every member holds as many tokens (the equal all-to-all)."""
    return None if lengths is None or len(set(lengths)) == 1 else tuple(int(n) for n in lengths)


def seq_to_heads(q, k, v, group, lengths=None):
    """Ulysses all-to-all of q, k, v (one exchange); returns the head shards of the full sequence. ``lengths``:
    every member's local tokens (group rank order) where they differ."""
    degree = _degree(group)
    check_heads(q.shape[2], k.shape[2], degree)
    if degree == 1:
        return q, k, v
    return _SeqToHeads.apply(q, k, v, group, degree, _even(lengths))


def heads_to_seq(out, group, lengths=None):
    """Ulysses all-to-all of the attention output back to sequence shards (``lengths`` as ``seq_to_heads``)."""
    degree = _degree(group)
    return out if degree == 1 else _HeadsToSeq.apply(out, group, degree, _even(lengths))




@lru_cache(maxsize=64)
def span_tiles(seq_len: int, ulysses: int, cu_seqlens: tuple[int, ...] | None,
               window: int | None) -> tuple[tuple[int, int], ...]:
    """Tiles [start, stop) of a whole sequence in token order: each document cut into tiles of at most S/U tokens
    (the window's length where shorter, so a windowed tile's mask stays small); no tile crosses a document."""
    size = max(1, -(-seq_len // ulysses))
    if window is not None:
        size = min(size, max(window, MIN_TILE))
    bounds = cu_seqlens or (0, seq_len)
    return tuple((a, min(a + size, e)) for s, e in zip(bounds[:-1], bounds[1:]) for a in range(s, e, size))


def tile_mask(q: tuple[int, int], k: tuple[int, int], causal: bool, window: int | None) -> BlockMask | None:
    """Mask of two tiles of one document: full, the causal diagonal, or (windowed) the band from
    ``kernels.attended`` over the two tiles alone; None = empty."""
    (a, b), (c0, c1) = q, k
    if window is None:
        if not causal or c1 <= a + 1:
            return BlockMask(0, b - a, 0, c1 - c0)
        return BlockMask(0, b - a, 0, c1 - c0, causal_offset=a - c0) if c0 <= a else None
    return reduce_mask(attended(np.arange(a, b), np.arange(c0, c1), causal=causal, window=window))


@lru_cache(maxsize=64)
def span_masks(seq_len: int, ulysses: int, causal: bool, cu_seqlens: tuple[int, ...] | None,
               window: int | None) -> tuple[tuple[tuple[int, BlockMask], ...], ...]:
    """For each query tile (``span_tiles``), the key tiles of its document within causal and window reach with their
    masks (``tile_mask``); pairs across documents or out of reach are never visited, empty ones are dropped."""
    tiles = span_tiles(seq_len, ulysses, cu_seqlens, window)
    starts, stops = np.array(tiles).T
    doc = np.searchsorted(np.asarray(cu_seqlens or (0, seq_len)), starts, side="right")
    reach = seq_len if window is None else window - 1
    out = []
    for i, (a, b) in enumerate(tiles):
        near = np.flatnonzero((doc == doc[i]) & (stops > a - reach) & (starts < (b if causal else b + reach)))
        masks = ((int(j), tile_mask((a, b), tiles[j], causal, window)) for j in near)
        out.append(tuple((j, m) for j, m in masks if m is not None))
    return tuple(out)


class _TiledAttention(torch.autograd.Function):
    """Attention of a whole sequence in token order, tile by tile under ``span_masks`` (lse merge per query tile;
    the FlashAttention-2 backward per pair from the global out and lse): only the pairs the mask leaves are computed."""

    @staticmethod
    def forward(ctx, q, k, v, tiles, masks, scale, backend):
        outs, lses = [], []
        for (a, b), pairs in zip(tiles, masks):
            ks, vs = [k[:, slice(*tiles[j])] for j, _ in pairs], [v[:, slice(*tiles[j])] for j, _ in pairs]
            o, m = attend_chunks(q[:, a:b], ks, vs, [bm for _, bm in pairs], scale, backend)
            outs.append(o)
            lses.append(m)
        out, lse = torch.cat(outs, dim=1), torch.cat(lses, dim=-1)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.tiles, ctx.masks, ctx.scale, ctx.backend = tiles, masks, scale, backend
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        tiles, acc = ctx.tiles, lse_dtype(q.dtype)
        dk, dv = torch.zeros(k.shape, dtype=acc, device=k.device), torch.zeros(v.shape, dtype=acc, device=v.device)
        dqs = []
        for (a, b), pairs in zip(tiles, ctx.masks):
            ks, vs = [k[:, slice(*tiles[j])] for j, _ in pairs], [v[:, slice(*tiles[j])] for j, _ in pairs]
            dq, dks, dvs = attend_chunks_backward(dout[:, a:b], q[:, a:b], ks, vs, out[:, a:b], lse[..., a:b],
                                                  [bm for _, bm in pairs], ctx.scale, ctx.backend)
            dqs.append(dq)
            for (j, _), gk, gv in zip(pairs, dks, dvs):
                dk[:, slice(*tiles[j])] += gk
                dv[:, slice(*tiles[j])] += gv
        return torch.cat(dqs, dim=1).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


def tiled_attention(q, k, v, *, causal: bool, cu_seqlens, window, ulysses: int = 1, scale=None,
                    backend=None) -> torch.Tensor:
    """Masked attention of a whole (batch, S, heads, dim) sequence in token order, by ``span_tiles`` of at most S/U
    tokens, computing only the tile pairs the mask leaves (``span_masks``)."""
    seq_len = q.shape[1]
    return _TiledAttention.apply(q, k, v, span_tiles(seq_len, ulysses, cu_seqlens, window),
                                 span_masks(seq_len, ulysses, bool(causal), cu_seqlens, window), scale, backend)


def check_local_tokens(n_local: int, lengths, me: int, token_layout: str) -> None:
    """This rank holds the tokens the layout gives it (``lengths[me]``), or a clear error."""
    if n_local != lengths[me]:
        raise PlanError("q", f"this rank holds {n_local} tokens; the {token_layout} layout gives it {lengths[me]}",
                        "shard the inputs with ctx.shard(x, cu_seqlens=...)")


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: dist.ProcessGroup | None = None, *,
                      causal: bool = False, scale: float | None = None, backend: str | None = None,
                      token_layout: str = "contiguous", cu_seqlens=None, window: int | None = None) -> torch.Tensor:
    """DeepSpeed-Ulysses attention on contiguous sequence shards (batch, seq/U, heads, dim). ``cu_seqlens`` (0, ...,
    S) packs documents, laid out per document (``ring.member_pieces`` with one ring member: local lengths may
    differ); ``window`` is a sliding window."""
    cu, w = check_masks(cu_seqlens, window, None)
    if cu is None and w is None:
        q_l, k_l, v_l = seq_to_heads(q, k, v, group)
        return heads_to_seq(local_attention(q_l, k_l, v_l, causal=causal, scale=scale, backend=backend), group)
    return masked_ulysses(q, k, v, group if _degree(group) > 1 else None, causal=causal, scale=scale,
                          backend=backend, token_layout=token_layout, cu_seqlens=cu, window=w)


def masked_ulysses(q, k, v, group, *, causal, scale, backend, token_layout, cu_seqlens, window) -> torch.Tensor:
    """Ulysses under checked masks (``check_masks``) over ``group`` (None = degree 1: no all-to-all): the pieces'
    all-to-all, ``tiled_attention`` of the whole sequence, the all-to-all back."""
    u = 1 if group is None else dist.get_world_size(group)
    seq_len = q.shape[1] * u if cu_seqlens is None else cu_seqlens[-1]
    check_share(q.shape[1], token_layout, 1, u, seq_len)
    pieces = member_pieces(token_layout, u, 1, seq_len, bool(causal), cu_seqlens, window)[0]
    lengths = [len(p) for p in pieces]
    check_local_tokens(q.shape[1], lengths, 0 if group is None else dist.get_rank(group), token_layout)
    if not np.array_equal(np.concatenate(pieces), np.arange(seq_len)):  # every policy keeps one member's in order
        raise PlanError("token_layout", f"{token_layout} does not keep a single ring member's tokens in order",
                        "use contiguous, zigzag, striped or balanced")
    q_l, k_l, v_l = (q, k, v) if group is None else seq_to_heads(q, k, v, group, lengths)
    out = tiled_attention(q_l, k_l, v_l, causal=causal, cu_seqlens=cu_seqlens, window=window, ulysses=u,
                          scale=scale, backend=backend)
    return out if group is None else heads_to_seq(out, group, lengths)


def check_ulysses_ranks(group, ranks) -> None:
    """The all-to-all follows the group's rank order, which must be the ulysses coordinate order ``ranks``."""
    if degree(group) == 1 or ranks is None:
        return
    members = dist.get_process_group_ranks(group)
    if list(ranks) != members:
        raise PlanError("ranks.ulysses", f"order {list(ranks)} differs from the group's rank order "
                        f"{members}", "list the ulysses group's ranks by ulysses coordinate, as the layout does")


def _registered_ulysses(q, k, v, *, groups, ranks, causal, token_layout, scale, backend=None, cu_seqlens=None,
                        window=None):
    """The registry's entry: Ulysses over groups["ulysses"] (degree 1: local attention, under the masks if any)."""
    group = groups.get("ulysses")
    masked = cu_seqlens is not None or window is not None
    if degree(group) == 1 and not masked:
        return local_attention(q, k, v, causal=causal, scale=scale, backend=backend)
    check_ulysses_ranks(group, ranks.get("ulysses"))
    if degree(group) == 1:
        cu, w = check_masks(cu_seqlens, window, None)
        return masked_ulysses(q, k, v, None, causal=causal, scale=scale, backend=backend, token_layout=token_layout,
                              cu_seqlens=cu, window=w)
    return ulysses_attention(q, k, v, group, causal=causal, scale=scale, backend=backend, token_layout=token_layout,
                             cu_seqlens=cu_seqlens, window=window)


register("ulysses", _registered_ulysses)
