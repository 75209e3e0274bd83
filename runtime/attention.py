"""One entry point for every attention variant of the runtime, chosen by the plan's algorithm name."""
from __future__ import annotations

import math
import numbers

import torch
import torch.distributed as dist

from sp_plan.planner.errors import PlanError
from sp_plan.planner.layout import check_balance_policy, check_token_layout
from sp_plan.planner.plan import check_kv_chunks_algorithm

from .variants import VARIANTS, load_all, register  # noqa: F401 - register: the registry's, re-exported

#: the variants that honour packed documents (cu_seqlens) and sliding windows exactly; the others refuse them
MASKED = ("ring", "ulysses", "usp", "allgather")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, algorithm: str,
              groups: dict[str, dist.ProcessGroup] | None, ranks: dict[str, list[int]] | None = None,
              causal: bool = False, token_layout: str = "contiguous", scale: float | None = None,
              backend: str | None = None, cu_seqlens=None, window: int | None = None,
              kv_chunks: int = 1) -> torch.Tensor:
    """Sequence-parallel attention of (batch, local seq, heads, dim) shards by algorithm name.

    ``groups`` maps "ring" and "ulysses" to process groups (missing or None = degree 1);
    ``ranks`` may give the ring's global ranks in ring order under "ring", and the ulysses
    group's ranks under "ulysses" (checked: the all-to-all follows the group's rank order, which
    must be the ulysses coordinate). With every degree 1 this is plain local attention.
    ``backend`` names the block kernel (``runtime.backends``; None = the unmeasured default). ``cu_seqlens``
    (packed documents over the global sequence) and ``window`` (a sliding window) go to the variants that take
    them (``MASKED``); ``kv_chunks`` over 1 (all-gather's chunks of KV heads) to ``allgather`` alone.
    """
    check_inputs(q, k, v, scale)
    return checked_attention(q, k, v, algorithm=algorithm, groups=groups, ranks=ranks, causal=causal,
                             token_layout=token_layout, scale=scale, backend=backend, cu_seqlens=cu_seqlens,
                             window=window, kv_chunks=kv_chunks)


def checked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, algorithm: str,
                      groups: dict[str, dist.ProcessGroup] | None, ranks: dict[str, list[int]] | None = None,
                      causal: bool = False, token_layout: str = "contiguous", scale: float | None = None,
                      backend: str | None = None, cu_seqlens=None, window: int | None = None,
                      kv_chunks: int = 1) -> torch.Tensor:
    """``attention`` of shards that ``check_inputs`` has passed: ``ctx.attention`` checks them before it reads
    their lengths, and checking twice costs every layer's call host time."""
    variants = load_all()
    if algorithm not in variants:
        raise PlanError("algorithm", f"unknown algorithm {algorithm!r}", f"use one of {sorted(variants)}")
    (check_token_layout if cu_seqlens is None else check_balance_policy)(token_layout)  # balanced needs documents
    masks = {n: x for n, x in (("cu_seqlens", cu_seqlens), ("window", window)) if x is not None}
    if masks and algorithm not in MASKED:
        name = next(iter(masks))
        raise PlanError(name, f"algorithm {algorithm} does not honour {name} (packed documents and sliding windows)",
                        f"use a plan with algorithm {', '.join(MASKED[:-1])} or {MASKED[-1]}, which do")
    check_kv_chunks_algorithm(kv_chunks, algorithm)
    if kv_chunks != 1:
        masks["kv_chunks"] = kv_chunks
    return variants[algorithm].fn(q, k, v, groups=groups or {}, ranks=ranks or {}, causal=causal,
                                  token_layout=token_layout, scale=scale, backend=backend, **masks)


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> None:
    """Self-attention's shards: q, k and v hold the same (batch, local seq) tokens, and a scale is a positive
    number (a NaN or zero scale would give NaN or uniform weights without an error)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise PlanError(name, f"{name} is a {type(x).__name__}, not a tensor",
                            "pass torch tensors of (batch, local seq, heads, head dim)")
    qs, ks, vs = q.shape, k.shape, v.shape  # read once: each read builds a torch.Size, and this runs every layer
    if len(qs) != 4 or len(ks) != 4 or len(vs) != 4:
        raise PlanError("q", f"q, k, v have {len(qs)}, {len(ks)}, {len(vs)} dimensions",
                        "pass (batch, local seq, heads, head dim) tensors")
    if not qs[:2] == ks[:2] == vs[:2]:
        raise PlanError("k", f"q holds (batch, tokens) {tuple(qs[:2])}, k {tuple(ks[:2])}, v {tuple(vs[:2])}",
                        "pass q, k and v of the same tokens (this is self-attention)")
    check_heads(q, k, v)
    if scale is not None and not (isinstance(scale, numbers.Real) and not isinstance(scale, bool)
                                  and math.isfinite(scale) and scale > 0):  # a numpy float32 is a Real, not a float
        raise PlanError("scale", f"{scale!r} is not a positive number", "pass scale=None (1/sqrt(head dim)) or a value > 0")


def check_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """q, k and v of one dtype and device; k and v of the same KV heads, which divide q's (GQA: query head h reads KV
    head h // (q heads / KV heads)); q, k and v of one head dim."""
    if not q.dtype == k.dtype == v.dtype or not q.device == k.device == v.device:
        raise PlanError("k", f"q is {q.dtype} on {q.device}, k {k.dtype} on {k.device}, v {v.dtype} on {v.device}",
                        "pass q, k and v of one dtype on one device")
    (*_, q_heads, q_dim), (*_, k_heads, k_dim), (*_, v_heads, v_dim) = q.shape, k.shape, v.shape
    if k_heads != v_heads or q_heads % k_heads:
        raise PlanError("k", f"q has {q_heads} heads, k {k_heads}, v {v_heads}",
                        "pass k and v of the same KV heads, a divisor of q's (GQA), or as many as q's")
    if q_dim != k_dim:
        raise PlanError("k", f"q's head dim is {q_dim}, k's {k_dim}", "pass q and k of one head dim")
    if v_dim != q_dim:  # the fused kernels and Ulysses' one all-to-all buffer take one head dim
        raise PlanError("v", f"v's head dim is {v_dim}, q's {q_dim}", "pass v of q's head dim (pad it)")
