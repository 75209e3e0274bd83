"""DeepSpeed-Ulysses attention (Jacobs et al. 2023): all-to-all sequence <-> heads around local attention.

Each of the U ranks of the ulysses group holds S/U tokens of all heads. One all-to-all (q, k and
v packed in a single exchange) gives every rank all S tokens of H/U query heads and of the KV
heads those query heads use; it runs attention locally, and a second all-to-all returns the
output to the sequence shards. Both all-to-alls are autograd functions whose backward is the
reverse all-to-all. GQA: when the KV heads do not split evenly over U (fewer KV heads than U),
KV heads are replicated so that each rank receives the ones its query heads need, and the
gradients of the replicas are summed back onto their KV head.
"""
from __future__ import annotations

from functools import lru_cache

import torch
import torch.distributed as dist

from sp_plan.planner.errors import PlanError

from .kernels import local_attention
from .variants import degree, register


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


class _SeqToHeads(torch.autograd.Function):
    """Ulysses all-to-all: q, k, v from (B, S/U, H, D) sequence shards to (B, S, H/U, D) head shards."""

    @staticmethod
    def forward(ctx, q, k, v, group, degree):
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
        full = all_to_all(send, group).transpose(0, 1).reshape(b, degree * s, hq + 2 * kv_local, d)
        ctx.group, ctx.degree, ctx.idx, ctx.shapes = group, degree, idx, (q.shape, k.shape)
        return full[..., :hq, :], full[..., hq:hq + kv_local, :], full[..., hq + kv_local:, :]

    @staticmethod
    def backward(ctx, dq, dk, dv):
        (b, s, q_heads, d), k_shape = ctx.shapes
        degree, idx = ctx.degree, ctx.idx
        hq = q_heads // degree
        kv_local = k_shape[2] // degree if idx is None else len(idx) // degree
        ref = next(g for g in (dq, dk, dv) if g is not None)
        alloc = torch.empty if all(g is not None for g in (dq, dk, dv)) else torch.zeros
        send = alloc(degree, b, s, hq + 2 * kv_local, d, dtype=ref.dtype, device=ref.device)
        for lo, n, g in ((0, hq, dq), (hq, kv_local, dk), (hq + kv_local, kv_local, dv)):
            if g is not None:
                send[..., lo:lo + n, :].copy_(g.reshape(b, degree, s, n, d).transpose(0, 1))
        recv = all_to_all(send, ctx.group).permute(1, 2, 0, 3, 4)  # (b, s, degree, heads, d)
        grad_q = recv[..., :hq, :].reshape(b, s, q_heads, d)
        grads_kv = []
        for lo in (hq, hq + kv_local):
            g = recv[..., lo:lo + kv_local, :].reshape(b, s, degree * kv_local, d)
            if idx is not None:  # sum the gradients of replicated KV heads onto their head
                g = g.new_zeros(k_shape).index_add_(2, idx, g)
            grads_kv.append(g)
        return grad_q, grads_kv[0], grads_kv[1], None, None


class _HeadsToSeq(torch.autograd.Function):
    """Ulysses all-to-all back: output from (B, S, H/U, D) head shards to (B, S/U, H, D) sequence shards."""

    @staticmethod
    def forward(ctx, out, group, degree):
        b, n, h, d = out.shape
        s = n // degree
        send = out.reshape(b, degree, s, h, d).transpose(0, 1).contiguous()
        ctx.group, ctx.degree = group, degree
        return all_to_all(send, group).permute(1, 2, 0, 3, 4).reshape(b, s, degree * h, d)

    @staticmethod
    def backward(ctx, dout):
        b, s, heads, d = dout.shape
        degree = ctx.degree
        send = dout.reshape(b, s, degree, heads // degree, d).permute(2, 0, 1, 3, 4).contiguous()
        recv = all_to_all(send, ctx.group)
        return recv.transpose(0, 1).reshape(b, degree * s, heads // degree, d), None, None


def _degree(group) -> int:
    return dist.get_world_size(group) if group is not None else dist.get_world_size()


def seq_to_heads(q, k, v, group):
    """Ulysses all-to-all of q, k, v (one exchange); returns the head shards of the full sequence."""
    degree = _degree(group)
    check_heads(q.shape[2], k.shape[2], degree)
    if degree == 1:
        return q, k, v
    return _SeqToHeads.apply(q, k, v, group, degree)


def heads_to_seq(out, group):
    """Ulysses all-to-all of the attention output back to sequence shards."""
    degree = _degree(group)
    return out if degree == 1 else _HeadsToSeq.apply(out, group, degree)


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: dist.ProcessGroup | None = None, *,
                      causal: bool = False, scale: float | None = None, backend: str | None = None) -> torch.Tensor:
    """DeepSpeed-Ulysses attention on contiguous sequence shards (batch, seq/U, heads, dim)."""
    q_l, k_l, v_l = seq_to_heads(q, k, v, group)
    return heads_to_seq(local_attention(q_l, k_l, v_l, causal=causal, scale=scale, backend=backend), group)


def check_ulysses_ranks(group, ranks) -> None:
    """The all-to-all follows the group's rank order, which must be the ulysses coordinate order ``ranks``."""
    if degree(group) == 1 or ranks is None:
        return
    members = dist.get_process_group_ranks(group)
    if list(ranks) != members:
        raise PlanError("ranks.ulysses", f"order {list(ranks)} differs from the group's rank order "
                        f"{members}", "list the ulysses group's ranks by ulysses coordinate, as the layout does")


def _registered_ulysses(q, k, v, *, groups, ranks, causal, token_layout, scale, backend=None):
    """The registry's entry: Ulysses over groups["ulysses"] (degree 1: local attention)."""
    group = groups.get("ulysses")
    if degree(group) == 1:
        return local_attention(q, k, v, causal=causal, scale=scale, backend=backend)
    check_ulysses_ranks(group, ranks.get("ulysses"))
    return ulysses_attention(q, k, v, group, causal=causal, scale=scale, backend=backend)


register("ulysses", _registered_ulysses)
