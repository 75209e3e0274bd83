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

Backends (``runtime.backends``): flash-attn, cuDNN and flash SDPA, PyTorch's memory-efficient CUDA
kernel, the fused CPU flash kernel and a plain matmul + logsumexp path (``math``, the reference).
Without an explicit ``backend`` the long-standing default of ``select_backend`` runs; the measured
choice lives in ``runtime.choice``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from sp_plan.planner.documents import check_cu_seqlens
from sp_plan.planner.masks.tiling import MIN_TILE  # the planner counts the tiles this module cuts

from . import backends as B
from .backends import bias as _bias  # noqa: F401 - kept importable from here
from .backends import finite as _finite
from .backends import lse_dtype, offset_mask  # noqa: F401 - part of this module's API

BACKENDS = tuple(B.BACKENDS) + tuple(B.ALIASES)
_NEG_INF = float("-inf")
_LEGACY = {"math": "reference", "efficient": "cuda_efficient"}


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
    """Causal mask (query token >= key token) of two global token lists, reduced; None if empty."""
    return reduce_mask(np.asarray(q_tokens).reshape(-1, 1) >= np.asarray(k_tokens).reshape(1, -1))


def document_ids(cu_seqlens, seq_len: int) -> np.ndarray:
    """Document index of each of ``seq_len`` global tokens from ``cu_seqlens`` (0, l0, l0 + l1, ..., seq_len)."""
    cu = check_cu_seqlens(cu_seqlens, seq_len)
    return np.searchsorted(cu, np.arange(seq_len), side="right") - 1


def attended(q_tokens, k_tokens, *, causal: bool, documents: np.ndarray | None = None,
             window: int | None = None) -> np.ndarray:
    """Which keys each query sees (True = attend), from global token indices: causal (key <= query), the same
    document (``documents``: ``document_ids`` of every token), and a sliding window (query - key < window;
    both ways when not causal)."""
    q_t = np.asarray(q_tokens).reshape(-1, 1)
    k_t = np.asarray(k_tokens).reshape(1, -1)
    ok = (q_t >= k_t) if causal else np.ones((q_t.shape[0], k_t.shape[1]), dtype=bool)
    if documents is not None:
        ok &= documents[q_t] == documents[k_t]
    if window is not None:
        ok &= (q_t - k_t < window) & (k_t - q_t < (1 if causal else window))
    return ok


def reduce_mask(allowed: np.ndarray) -> BlockMask | None:
    """A boolean (query, key) mask reduced to what a kernel needs; None if empty.

    Rows and columns that see nothing are cut off; what is left is described as full, as a
    diagonal offset, or as an explicit boolean mask, whichever is exact.
    """
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


# ---------------------------------------------------------------- tiles of a masked block
#
# A member's tokens (``ring.member_tokens``) fall into runs: arithmetic progressions of global tokens inside one
# document, of step 1 (contiguous, zigzag, balanced) or P (striped), at consecutive local positions. A block of
# queries against keys is the set of (query run, key run) pairs of one document within the window's reach. Two runs
# of one step attend each other fully or along a diagonal (query i sees key j iff j <= i + offset), so no mask matrix
# is built; only where a window's edge crosses a pair is an explicit mask built, over tiles cut to about a window's
# length, so it stays small. A block costs O(its attended work), not (S/P)^2.



def layout_step(token_layout: str, size: int) -> int:
    """The step of a member's runs of global tokens: P for the striped layout, 1 for the others."""
    return size if token_layout == "striped" else 1


def member_runs(tokens, cu_seqlens, step: int, window: int | None) -> np.ndarray:
    """(runs, 4) int64 rows (local start, local stop, first global token, document) of ``tokens``: maximal
    progressions of ``step`` inside one document, cut into tiles of a window's reach (at least ``MIN_TILE``)."""
    t = np.asarray(tokens, dtype=np.int64)
    if len(t) == 0:
        return np.zeros((0, 4), dtype=np.int64)
    doc = np.zeros_like(t) if cu_seqlens is None else np.searchsorted(np.asarray(cu_seqlens), t, side="right") - 1
    breaks = np.flatnonzero((np.diff(t) != step) | (doc[1:] != doc[:-1])) + 1
    starts, stops = np.concatenate([[0], breaks]), np.concatenate([breaks, [len(t)]])
    if window is not None:
        size = max(-(-window // step), MIN_TILE)
        pieces = -(-(stops - starts) // size)
        first = np.repeat(starts, pieces)
        starts = first + size * (np.arange(pieces.sum()) - np.repeat(np.cumsum(pieces) - pieces, pieces))
        stops = np.minimum(starts + size, np.repeat(stops, pieces))
    return np.stack([starts, stops, t[starts], doc[starts]], axis=1)


def diagonal_tile(rows: tuple[int, int], cols: tuple[int, int], offset: int | None) -> BlockMask | None:
    """A tile where query row i sees key column j iff j <= i + ``offset`` (None: all), trimmed to the rows that see
    something and the columns some row sees; None = empty."""
    (r0, r1), (c0, c1) = rows, cols
    n, m = r1 - r0, c1 - c0
    if offset is None or offset >= m - 1:
        return BlockMask(r0, r1, c0, c1)
    if n - 1 + offset < 0:
        return None
    skip = max(0, -offset)
    offset += skip
    stop = min(m, n - skip + offset)
    return BlockMask(r0 + skip, r1, c0, c0 + stop, causal_offset=None if offset >= stop - 1 else offset)


@lru_cache(maxsize=4096)
def window_band(n: int, m: int, shift: int, step: int, causal: bool, window: int) -> BlockMask | None:
    """The window's band of ``n`` queries at ``shift`` + step * i against ``m`` keys at step * j, reduced
    (``kernels.reduce_mask``); one per geometry, shared by the tiles that have it. None = empty."""
    return reduce_mask(attended(shift + step * np.arange(n), step * np.arange(m), causal=causal, window=window))


def pair_tile(q_run, k_run, step: int, causal: bool, window: int | None) -> BlockMask | None:
    """Mask of a query run against a key run of one document and one ``step``, in local positions: full or diagonal
    where the window does not bind, else the window's band over the two tiles alone; None = empty."""
    (r0, r1, a, _), (c0, c1, c, _) = q_run, k_run
    low, high = a - (c + step * (c1 - c0 - 1)), a + step * (r1 - r0 - 1) - c  # least and most query - key
    if causal and high < 0 or window is not None and (low >= window or not causal and high <= -window):
        return None
    if window is None or high < window and (causal or low > -window):
        return diagonal_tile((r0, r1), (c0, c1), (a - c) // step if causal else None)
    band = window_band(r1 - r0, c1 - c0, a - c, step, causal, window)
    if band is None:
        return None
    return BlockMask(r0 + band.row_start, r0 + band.row_stop, c0 + band.col_start, c0 + band.col_stop,
                     band.causal_offset, band.mask)


def block_tiles(q_runs: np.ndarray, k_runs: np.ndarray, step: int, causal: bool,
                window: int | None) -> tuple[BlockMask, ...] | None:
    """The tiles of a block of queries (``q_runs``) against keys (``k_runs``): pairs of runs of one document within
    causal and window reach (``pair_tile``), in query order; None where the mask empties the block."""
    if not len(q_runs) or not len(k_runs):
        return None
    k_first = k_runs[:, 2]
    k_last = k_first + step * (k_runs[:, 1] - k_runs[:, 0] - 1)
    reach = np.inf if window is None else window
    tiles = []
    for run in q_runs.tolist():
        a, last = run[2], run[2] + step * (run[1] - run[0] - 1)
        near = (k_runs[:, 3] == run[3]) & (a - k_last < reach) & (k_first - last < (1 if causal else reach))
        tiles += [bm for bm in (pair_tile(run, k_runs[j].tolist(), step, causal, window) for j in np.flatnonzero(near))
                  if bm is not None]
    return tuple(tiles) or None


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

def select_backend(q: torch.Tensor, masked: bool = False) -> str:
    """The unmeasured default kernel of this device/dtype (and with an explicit mask or not), ``backends.STATIC`` order."""
    for name in B.STATIC:
        if B.BACKENDS[name].available(q.device.type, q.dtype, q.shape[-1], masked):
            return _LEGACY.get(name, name)
    return "reference"


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


# ---------------------------------------------------------------- public block API

def _prepare(q, k, causal_offset, mask, scale, backend):
    """The region to compute, the scale, and the backend that takes it (a masked or non-square causal
    region the named backend cannot take goes to the unmeasured default for a mask)."""
    region = _region(q.shape[1], k.shape[1], causal_offset, mask)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if backend is None:
        backend = select_backend(q, masked=region.mask is not None)
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; use one of {BACKENDS}")
    be = B.get(backend)
    if ((region.mask is not None and not be.masks) or
            (region.causal and be.square_causal and q.shape[1] - region.row_start != region.col_stop)):
        be = B.get(select_backend(q, masked=True))  # e.g. flash-attn aligns causal masks bottom-right
    return region, scale, be


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
    if not backend.gqa:
        ks, vs = _repeat_kv(ks, h), _repeat_kv(vs, h)
    out, lse = backend.forward(qs, ks, vs, scale, region.causal, region.mask)
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
    qs, dos, outs, lses = (q, dout, out, lse) if r0 == 0 else (q[:, r0:], dout[:, r0:], out[:, r0:], lse[..., r0:])
    if region.mask is not None:  # only a mask leaves rows that see no key (lse -inf); elsewhere every row sees one
        lses = _finite(lses)
    ks, vs = (k, v) if c1 == n_k else (k[:, :c1], v[:, :c1])
    if backend.gqa:
        dq, dk, dv = backend.backward(dos, qs, ks, vs, outs, lses, scale, region.causal, region.mask)
    else:
        dq, dk, dv = backend.backward(dos, qs, _repeat_kv(ks, h), _repeat_kv(vs, h), outs, lses, scale,
                                      region.causal, region.mask)
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
    def forward(ctx, q, k, v, causal, scale, backend):
        offset = 0 if causal else None
        out, lse = block_attention(q, k, v, scale=scale, causal_offset=offset, backend=backend)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.offset, ctx.scale, ctx.backend = offset, scale, backend
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = block_attention_backward(dout, q, k, v, out, lse, scale=ctx.scale, causal_offset=ctx.offset,
                                              backend=ctx.backend)
        return dq, dk, dv, None, None, None


#: the block kernels that are PyTorch SDPA backends, as ``torch.nn.attention.SDPBackend`` names
_SDPA = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "cpu_flash": "FLASH_ATTENTION",
         "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}
#: SDPA's switches in ``torch.backends.cuda`` (flash, mem_efficient, math, cudnn; they hold for CPU tensors too)
#: that hold it to one backend, by SDPBackend name
_ONLY = {"FLASH_ATTENTION": (True, False, False, False), "EFFICIENT_ATTENTION": (False, True, False, False),
         "MATH": (False, False, True, False), "CUDNN_ATTENTION": (False, False, False, True)}


def _sdpa_kernel(backend: str | None, gqa: bool) -> str | None:
    """The SDPBackend name that runs ``backend`` inside ``F.scaled_dot_product_attention`` (None: it is not one, or
    it takes no GQA there: the memory-efficient kernel, or a torch before ``enable_gqa``)."""
    name = _SDPA.get(B.ALIASES.get(backend, backend) if backend else "")
    if name is None or (gqa and (name == "EFFICIENT_ATTENTION" or not _HAS_GQA)):
        return None
    return name


_HAS_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)


def _sdp_switches() -> tuple[bool, ...]:
    """SDPA's backend switches as they stand: flash, mem_efficient, math, cudnn (``_ONLY``'s order)."""
    cb = torch.backends.cuda
    return cb.flash_sdp_enabled(), cb.mem_efficient_sdp_enabled(), cb.math_sdp_enabled(), cb.cudnn_sdp_enabled()


def _set_sdp_switches(on: tuple[bool, ...]) -> None:
    """Set SDPA's backend switches to ``on`` (``_sdp_switches``' order)."""
    cb = torch.backends.cuda
    cb.enable_flash_sdp(on[0])
    cb.enable_mem_efficient_sdp(on[1])
    cb.enable_math_sdp(on[2])
    cb.enable_cudnn_sdp(on[3])


#: the part of ``aten::_flash_attention_forward``'s schema that the degree-1 path calls (later torch adds keywords)
FLASH_BSHD_SCHEMA = ("aten::_flash_attention_forward(Tensor query, Tensor key, Tensor value, Tensor? cum_seq_q, "
                     "Tensor? cum_seq_k, SymInt max_q, SymInt max_k, float dropout_p, bool is_causal, "
                     "bool return_debug_mask, *, float? scale=None")


@lru_cache(maxsize=None)
def flash_bshd_op():
    """``aten::_flash_attention_forward`` where this torch has it as ``_flash_bshd`` calls it, else None."""
    op = getattr(torch.ops.aten, "_flash_attention_forward", None)
    return op.default if op is not None and str(op.default._schema).startswith(FLASH_BSHD_SCHEMA) else None


def _flash_bshd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None):
    """Flash attention on (batch, seq, heads, dim) as the kernel reads them, GQA K/V unrepeated; None where this
    torch lacks the op or a last dimension is strided. SDPA's flash backend transposes its (batch, heads, seq, dim)
    inputs back to this layout and calls the same op, whose autograd node is its backward: called directly, the
    degree-1 call is one autograd node, without the four transposes (about 0.055 ms of host time a call on an H200,
    docs/benchmarks/gpu.md) or SDPA's backend selection."""
    op = flash_bshd_op()
    if op is None or q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        return None
    return op(q, k, v, None, None, q.shape[1], k.shape[1], 0.0, causal, False, scale=scale)[0]


def local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    scale: float | None = None, backend: str | None = None) -> torch.Tensor:
    """Plain single-device attention (the degree-1 path), differentiable, (batch, seq, heads, dim).

    On a backend that is one of SDPA's, this is ``F.scaled_dot_product_attention`` held to that backend: one fused
    autograd node, where the block kernels' Python autograd Function costs host time every call (on an H200, 0.3-0.5
    ms a call, 1.4-1.9x SDPA's time below 8k tokens; benchmarks/bench_gpu.py). The backend is held by SDPA's four
    public switches, set and restored around the call: ``torch.nn.attention.sdpa_kernel`` does the same through
    enum lookups at several times the host cost, and this runs every layer. CUDA's flash runs its op directly
    (``_flash_bshd``)."""
    gqa = k.shape[2] != q.shape[2]
    kernel = _sdpa_kernel(backend, gqa)
    if kernel is None:
        return _LocalAttention.apply(q, k, v, causal, scale, backend)
    if backend == "flash" and q.device.type != "cpu":  # CUDA's (cpu_flash holds SDPA's flash backend on the CPU)
        out = _flash_bshd(q, k, v, causal, scale)
        if out is not None:
            return out
    saved, want = _sdp_switches(), _ONLY[kernel]
    if saved != want:
        _set_sdp_switches(want)
    try:
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, scale=scale,
            **({"enable_gqa": True} if gqa else {}))
    finally:
        if saved != want:
            _set_sdp_switches(saved)
    return out.transpose(1, 2)
