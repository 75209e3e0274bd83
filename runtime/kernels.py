"""Local block attention with its log-sum-exp, the block backward, and the online-softmax merge.

Every distributed variant is built from three pieces defined here:

- ``block_attention(q, k, v)`` -> ``(out, lse)``: softmax attention of one query block against
  one key/value block, with the block's log-sum-exp per query row;
- ``block_attention_backward(dout, q, k, v, out, lse)`` -> ``(dq, dk, dv)``: the
  FlashAttention-2 backward of that block, recomputing ``P = exp(S - lse)`` from the *global*
  ``out`` and ``lse`` saved by the forward, so summing block gradients gives exact gradients;
- ``merge(out, lse, block_out, block_lse)``: the one online-softmax merge of partial results.

Tensors are (batch, seq, heads, head_dim); ``lse`` is (batch, heads, seq) in float32 (float64
for float64 input). K/V may have fewer heads than Q (GQA): they are repeated inside the kernel
and their gradients summed back. A causal mask is given either as a diagonal offset (query row
``i`` sees key column ``j`` iff ``j <= i + causal_offset``) or as an explicit boolean mask
(True = attend); ``causal_block_mask`` reduces a pair of global token lists to the smallest
(row range, column range, offset or mask) the kernel needs.

Backends: flash-attn if importable and the tensors are on CUDA; otherwise PyTorch's fused CUDA
memory-efficient attention (returns the LSE, takes a bias); on CPU the fused flash kernel
``_scaled_dot_product_flash_attention_for_cpu`` for float32/bfloat16/float16; and a plain
matmul + logsumexp reference path for float64 (and as the fallback).
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import numpy as np
import torch

try:  # pragma: no cover - flash-attn is only installed on CUDA machines
    from flash_attn import flash_attn_interface as _fa
except ImportError:  # pragma: no cover
    _fa = None

BACKENDS = ("flash_attn", "cuda_efficient", "cpu_flash", "reference")
_CPU_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_CPU_FLASH_BWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
_NEG_INF = float("-inf")


# ---------------------------------------------------------------- masks

@dataclass(frozen=True)
class BlockMask:
    """The attended part of a (query block, key block) pair: row/col ranges and the mask inside.

    ``causal_offset`` None and ``mask`` None = the sub-block is fully attended.
    """

    row_start: int
    row_stop: int
    col_start: int
    col_stop: int
    causal_offset: int | None = None
    mask: torch.Tensor | None = None

    def full_rows(self, n_rows: int) -> bool:
        return self.row_start == 0 and self.row_stop == n_rows


def full_block(n_rows: int, n_cols: int) -> BlockMask:
    """A block with no mask."""
    return BlockMask(0, n_rows, 0, n_cols)


def _span(any_: np.ndarray) -> tuple[int, int]:
    """Smallest range holding every True of ``any_`` (all of it if the Trues are not contiguous)."""
    idx = np.flatnonzero(any_)
    lo, hi = int(idx[0]), int(idx[-1]) + 1
    if hi - lo != len(idx):
        return 0, len(any_)
    return lo, hi


def causal_block_mask(q_tokens, k_tokens) -> BlockMask | None:
    """Causal mask (query token >= key token) of two global token lists, reduced; None if empty.

    Rows and columns that see nothing are cut off; what is left is described as full, as a
    diagonal offset, or as an explicit boolean mask, whichever is exact.
    """
    q_t = np.asarray(q_tokens).reshape(-1, 1)
    k_t = np.asarray(k_tokens).reshape(1, -1)
    allowed = q_t >= k_t
    if not allowed.any():
        return None
    r0, r1 = _span(allowed.any(axis=1))
    c0, c1 = _span(allowed.any(axis=0))
    sub = allowed[r0:r1, c0:c1]
    if sub.all():
        return BlockMask(r0, r1, c0, c1)
    n_r, n_c = sub.shape
    first = sub[0]
    offset = int(first.sum()) - 1  # row 0 sees columns 0..offset if the pattern is a diagonal
    diag = np.arange(n_c)[None, :] <= np.arange(n_r)[:, None] + offset
    if np.array_equal(sub, diag):
        return BlockMask(r0, r1, c0, c1, causal_offset=offset)
    return BlockMask(r0, r1, c0, c1, mask=torch.from_numpy(sub.copy()))


def offset_mask(n_rows: int, n_cols: int, offset: int, device=None) -> torch.Tensor:
    """Boolean mask (True = attend) of the diagonal offset: column j <= row i + offset."""
    rows = torch.arange(n_rows, device=device).unsqueeze(1)
    cols = torch.arange(n_cols, device=device).unsqueeze(0)
    return cols <= rows + offset


@dataclass(frozen=True)
class _Region:
    """What a backend computes: rows [row_start:], keys [:col_stop], top-left causal or a mask."""

    row_start: int
    col_stop: int
    causal: bool
    mask: torch.Tensor | None
    empty: bool = False


def _region(n_q: int, n_k: int, causal_offset: int | None, mask: torch.Tensor | None) -> _Region:
    """Turn a diagonal offset into slices plus top-left causal where possible, else a mask."""
    if mask is not None:
        if causal_offset is not None:
            raise ValueError("give either causal_offset or mask, not both")
        if tuple(mask.shape) != (n_q, n_k):
            raise ValueError(f"mask has shape {tuple(mask.shape)}, expected {(n_q, n_k)}")
        return _Region(0, n_k, False, mask.to(torch.bool))
    if causal_offset is None or causal_offset >= n_k - 1:
        return _Region(0, n_k, False, None)
    if causal_offset <= -n_q:
        return _Region(0, 0, False, None, empty=True)
    if causal_offset <= 0:
        d = -causal_offset  # rows < d see nothing; row d + i sees keys 0..i
        return _Region(d, min(n_k, n_q - d), True, None)
    c1 = min(n_k, n_q + causal_offset)  # keys past the last row's reach are never seen
    return _Region(0, c1, False, offset_mask(n_q, c1, causal_offset))


# ---------------------------------------------------------------- backend selection

def _has_flash_attn() -> bool:
    return _fa is not None


def select_backend(q: torch.Tensor, masked: bool = False) -> str:
    """Which kernel runs a block of this device/dtype (and with an explicit mask or not)."""
    if q.is_cuda and q.dtype in (torch.float32, torch.bfloat16, torch.float16):
        if _has_flash_attn() and q.dtype != torch.float32 and not masked:
            return "flash_attn"
        return "cuda_efficient"
    if q.dtype in (torch.float32, torch.bfloat16, torch.float16):
        return "cpu_flash"
    return "reference"


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype of out and lse: float64 for float64, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _repeat_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    """GQA: repeat each KV head for its group of query heads (query head h uses KV head h // g)."""
    kv_heads = x.shape[2]
    if kv_heads == heads:
        return x
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads are not a multiple of {kv_heads} KV heads")
    return x.repeat_interleave(heads // kv_heads, dim=2)


def _reduce_kv(dx: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """GQA: sum the gradients of repeated KV heads back onto their KV head."""
    b, s, h, d = dx.shape
    if h == kv_heads:
        return dx
    return dx.view(b, s, kv_heads, h // kv_heads, d).sum(dim=3)


def _bias(mask: torch.Tensor, dtype: torch.dtype, device) -> torch.Tensor:
    """Additive bias (0 where attended, -inf elsewhere) of a boolean mask."""
    bias = torch.zeros(mask.shape, dtype=dtype, device=device)
    return bias.masked_fill_(~mask.to(device), _NEG_INF)


# ---------------------------------------------------------------- reference (matmul + logsumexp)

def _ref_scores(q, k, scale, causal, mask):
    ct = lse_dtype(q.dtype)
    s = torch.matmul(q.transpose(1, 2).to(ct), k.transpose(1, 2).transpose(-1, -2).to(ct)) * scale
    if causal:
        s = s.masked_fill(~offset_mask(s.shape[-2], s.shape[-1], 0, s.device), _NEG_INF)
    elif mask is not None:
        s = s.masked_fill(~mask.to(s.device), _NEG_INF)
    return s  # (b, h, q, k)


def _finite(lse: torch.Tensor) -> torch.Tensor:
    """lse with -inf (rows that see nothing) replaced by 0 so that exp(s - lse) is 0, not nan."""
    return lse.masked_fill(torch.isneginf(lse), 0.0)


def _reference_forward(q, k, v, scale, causal, mask):
    """Plain softmax attention with explicit scores and logsumexp (float32/float64)."""
    s = _ref_scores(q, k, scale, causal, mask)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - _finite(lse).unsqueeze(-1))
    out = torch.matmul(p, v.transpose(1, 2).to(p.dtype)).transpose(1, 2)
    return out.to(q.dtype), lse


def _reference_backward(dout, q, k, v, out, lse, scale, causal, mask):
    """Attention backward from saved out and lse: dS = P * (dP - rowsum(dO * O)) (FlashAttention-2 Alg. 2)."""
    ct = lse_dtype(q.dtype)
    s = _ref_scores(q, k, scale, causal, mask)
    p = torch.exp(s - _finite(lse.to(ct)).unsqueeze(-1))
    do = dout.transpose(1, 2).to(ct)
    dv = torch.matmul(p.transpose(-1, -2), do)
    dp = torch.matmul(do, v.transpose(1, 2).to(ct).transpose(-1, -2))
    delta = (dout.to(ct) * out.to(ct)).sum(-1).transpose(1, 2).unsqueeze(-1)  # (b, h, q, 1)
    ds = p * (dp - delta) * scale
    dq = torch.matmul(ds, k.transpose(1, 2).to(ct))
    dk = torch.matmul(ds.transpose(-1, -2), q.transpose(1, 2).to(ct))
    t = lambda x: x.transpose(1, 2).to(q.dtype)  # noqa: E731
    return t(dq), t(dk), t(dv)


# ---------------------------------------------------------------- CPU fused flash kernel

def _cpu_flash_forward(q, k, v, scale, causal, mask):
    bias = None if mask is None else _bias(mask, q.dtype, q.device)
    out, lse = _CPU_FLASH(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 0.0, causal,
                          attn_mask=bias, scale=scale)
    return out.transpose(1, 2), lse


def _cpu_flash_backward(dout, q, k, v, out, lse, scale, causal, mask):
    bias = None if mask is None else _bias(mask, q.dtype, q.device)
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    dq, dk, dv = _CPU_FLASH_BWD(t(dout), t(q), t(k), t(v), t(out), lse.to(lse_dtype(q.dtype)), 0.0, causal,
                                attn_mask=bias, scale=scale)
    return t(dq), t(dk), t(dv)


# ---------------------------------------------------------------- CUDA: PyTorch memory-efficient attention

def _cuda_bias(mask, q, k):
    """Mask as a bias of the alignment the memory-efficient kernel wants (last dim padded to 16)."""
    if mask is None:
        return None
    n_q, n_k = mask.shape
    padded = torch.zeros(n_q, (n_k + 15) // 16 * 16, dtype=q.dtype, device=q.device)
    bias = padded[:, :n_k].masked_fill_(~mask.to(q.device), _NEG_INF)
    return bias.expand(q.shape[0], q.shape[2], n_q, n_k)


def _cuda_efficient_forward(q, k, v, scale, causal, mask):  # pragma: no cover - needs CUDA
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
        t(q), t(k), t(v), _cuda_bias(mask, q, k), True, 0.0, causal, scale=scale)
    return t(out), lse[..., : q.shape[1]]


def _cuda_efficient_backward(dout, q, k, v, out, lse, scale, causal, mask):  # pragma: no cover
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    n_q = q.shape[1]
    lse_p = torch.full((*lse.shape[:-1], (n_q + 31) // 32 * 32), _NEG_INF, dtype=torch.float32, device=q.device)
    lse_p[..., :n_q] = lse
    bias = _cuda_bias(mask, q, k)
    seed = torch.zeros((), dtype=torch.long, device=q.device)
    dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
        t(dout), t(q), t(k), t(v), bias, t(out), lse_p, seed, seed, 0.0,
        [True, True, True, False], causal, scale=scale)
    return t(dq), t(dk), t(dv)


# ---------------------------------------------------------------- CUDA: flash-attn

def _fa_kwargs(fn, **kw):
    """Keyword arguments for this flash-attn version (window_size became window_size_left/right)."""
    params = inspect.signature(fn).parameters
    out = {}
    for name, val in kw.items():
        if name == "window_size" and name not in params:
            out["window_size_left"], out["window_size_right"] = val
        elif name in params:
            out[name] = val
    return out


def _flash_attn_forward(q, k, v, scale, causal):  # pragma: no cover - needs CUDA + flash-attn
    fn = _fa._flash_attn_forward
    res = fn(q, k, v, **_fa_kwargs(fn, dropout_p=0.0, softmax_scale=scale, causal=causal,
                                   window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                                   return_softmax=False))
    out, lse = (res[0], res[1]) if len(res) == 4 else (res[0], res[5])
    return out, lse


def _flash_attn_backward(dout, q, k, v, out, lse, scale, causal):  # pragma: no cover
    fn = _fa._flash_attn_backward
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    fn(dout.contiguous(), q, k, v, out, lse.contiguous(), dq, dk, dv,
       **_fa_kwargs(fn, dropout_p=0.0, softmax_scale=scale, causal=causal, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=True, rng_state=None))
    return dq, dk, dv


# ---------------------------------------------------------------- public block API

def _prepare(q, k, causal_offset, mask, scale, backend):
    region = _region(q.shape[1], k.shape[1], causal_offset, mask)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if backend is None:
        backend = select_backend(q, masked=region.mask is not None)
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; use one of {BACKENDS}")
    if backend == "flash_attn" and (region.mask is not None or
                                    (region.causal and q.shape[1] - region.row_start != region.col_stop)):
        backend = "cuda_efficient"  # flash-attn aligns causal masks bottom-right and takes no mask
    return region, scale, backend


def block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
                    causal_offset: int | None = None, mask: torch.Tensor | None = None,
                    backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Block attention with log-sum-exp (FlashAttention-2 forward): returns (out, lse).

    Rows that see no key get out 0 and lse -inf, so ``merge`` ignores them.
    """
    region, scale, backend = _prepare(q, k, causal_offset, mask, scale, backend)
    b, n_q, h, d = q.shape
    if region.empty:
        return (torch.zeros(b, n_q, h, v.shape[-1], dtype=q.dtype, device=q.device),
                torch.full((b, h, n_q), _NEG_INF, dtype=lse_dtype(q.dtype), device=q.device))
    r0, c1 = region.row_start, region.col_stop
    qs = q if r0 == 0 else q[:, r0:]
    ks = k if c1 == k.shape[1] else k[:, :c1]
    vs = v if c1 == v.shape[1] else v[:, :c1]
    if backend == "flash_attn":
        out, lse = _flash_attn_forward(qs, ks, vs, scale, region.causal)
    else:
        ks, vs = _repeat_kv(ks, h), _repeat_kv(vs, h)
        fwd = {"cuda_efficient": _cuda_efficient_forward, "cpu_flash": _cpu_flash_forward,
               "reference": _reference_forward}[backend]
        out, lse = fwd(qs, ks, vs, scale, region.causal, region.mask)
    lse = lse.to(lse_dtype(q.dtype))
    if region.mask is not None:  # fused kernels report lse 0 for rows that see nothing
        dead = ~region.mask.to(q.device).any(dim=1)
        if bool(dead.any()):
            lse = lse.masked_fill(dead, _NEG_INF)
            out = out.masked_fill(dead.view(1, -1, 1, 1), 0.0)
    if r0:
        full_out = torch.zeros(b, n_q, h, out.shape[-1], dtype=out.dtype, device=out.device)
        full_out[:, r0:] = out
        full_lse = torch.full((b, h, n_q), _NEG_INF, dtype=lse.dtype, device=lse.device)
        full_lse[..., r0:] = lse
        out, lse = full_out, full_lse
    return out, lse


def block_attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             out: torch.Tensor, lse: torch.Tensor, *, scale: float | None = None,
                             causal_offset: int | None = None, mask: torch.Tensor | None = None,
                             backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Block backward from the global (out, lse), FlashAttention-2 Algorithm 2: returns (dq, dk, dv).

    ``out`` and ``lse`` are the final attention output and log-sum-exp of these query rows over
    *all* keys, so the block's probabilities exp(S - lse) are the true ones and the per-block
    gradients add up to the exact gradient. dk and dv have K/V's (possibly fewer, GQA) heads.
    """
    region, scale, backend = _prepare(q, k, causal_offset, mask, scale, backend)
    if region.empty:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    h, kv_heads, n_k = q.shape[2], k.shape[2], k.shape[1]
    r0, c1 = region.row_start, region.col_stop
    rows = slice(r0, None)
    qs, dos, outs, lses = q[:, rows], dout[:, rows], out[:, rows], _finite(lse[..., rows])
    ks, vs = k[:, :c1], v[:, :c1]
    if backend == "flash_attn":
        dq, dk, dv = _flash_attn_backward(dos, qs, ks, vs, outs, lses, scale, region.causal)
    else:
        bwd = {"cuda_efficient": _cuda_efficient_backward, "cpu_flash": _cpu_flash_backward,
               "reference": _reference_backward}[backend]
        dq, dk, dv = bwd(dos, qs, _repeat_kv(ks, h), _repeat_kv(vs, h), outs, lses, scale, region.causal,
                         region.mask)
        dk, dv = _reduce_kv(dk, kv_heads), _reduce_kv(dv, kv_heads)
    if r0:
        dq = torch.cat([torch.zeros_like(q[:, :r0]), dq], dim=1)
    if c1 != n_k:
        dk = torch.cat([dk, torch.zeros_like(k[:, c1:])], dim=1)
        dv = torch.cat([dv, torch.zeros_like(v[:, c1:])], dim=1)
    return dq, dk, dv


def merge(out: torch.Tensor | None, lse: torch.Tensor | None, block_out: torch.Tensor,
          block_lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Online softmax merge of partial attentions over disjoint keys (FlashAttention-2 eq. rescaling).

    lse' = log(e^lse + e^block_lse); out' = e^(lse - lse') out + e^(block_lse - lse') block_out.
    ``out`` (batch, seq, heads, dim) and ``lse`` (batch, heads, seq) are accumulators in float32
    (float64 for float64 input), updated in place (views are fine) and returned; with ``out``
    None they start as copies of the block. Rows with lse -inf hold no keys yet.
    """
    acc = lse_dtype(block_out.dtype)
    if out is None:
        return block_out.to(acc, copy=True), block_lse.to(acc, copy=True)
    new_lse = torch.logaddexp(lse, block_lse)
    ref = _finite(new_lse)
    w_old = torch.exp(lse - ref).transpose(1, 2).unsqueeze(-1)
    w_new = torch.exp(block_lse - ref).transpose(1, 2).unsqueeze(-1)
    out.mul_(w_old).add_(block_out * w_new)
    lse.copy_(new_lse)
    return out, lse


# ---------------------------------------------------------------- local attention (degree 1)

class _LocalAttention(torch.autograd.Function):
    """Single-device attention on the block kernels (forward with lse, FlashAttention-2 backward)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        offset = 0 if causal else None
        out, lse = block_attention(q, k, v, scale=scale, causal_offset=offset)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.offset, ctx.scale = offset, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = block_attention_backward(dout, q, k, v, out, lse, scale=ctx.scale, causal_offset=ctx.offset)
        return dq, dk, dv, None, None


def local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    scale: float | None = None) -> torch.Tensor:
    """Plain single-device attention (the degree-1 path), differentiable, (batch, seq, heads, dim)."""
    return _LocalAttention.apply(q, k, v, causal, scale)
