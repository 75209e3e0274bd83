"""Block-kernel backends: forward (out, lse) and backward from (out, lse), each with its availability check.

A backend computes one region that ``kernels`` has already reduced to "top-left causal or not,
or an explicit boolean mask" on (batch, seq, heads, head_dim) tensors:

- ``forward(q, k, v, scale, causal, mask)`` -> ``(out, lse)``, lse (batch, heads, seq) float32
  (float64 for float64 input);
- ``backward(dout, q, k, v, out, lse, scale, causal, mask)`` -> ``(dq, dk, dv)`` with the
  backend's own backward op, given the *global* out and lse (FlashAttention-2 Algorithm 2);
- ``unavailable(device_type, dtype, head_dim, masked)`` -> None, or why it cannot run there.

Fused torch ops are checked against the schema this module was written for (torch 2.13,
``torch.ops.aten.<op>.default._schema``); a different schema makes the backend unavailable with
that reason instead of calling the op wrongly. Names: ``math`` (plain matmul + logsumexp, the
reference), ``cpu_flash``, ``efficient``, ``cudnn``, ``flash`` (PyTorch's SDPA ops) and
``flash_attn`` (the flash-attn package). ``reference`` and ``cuda_efficient`` are older aliases.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

import torch

try:  # pragma: no cover - flash-attn is only installed on CUDA machines
    from flash_attn import flash_attn_interface as _fa
except ImportError:  # pragma: no cover
    _fa = None

_NEG_INF = float("-inf")
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_HALF = (torch.bfloat16, torch.float16)


# ---------------------------------------------------------------- helpers shared with kernels.py

def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype of out and lse: float64 for float64, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def offset_mask(n_rows: int, n_cols: int, offset: int, device=None) -> torch.Tensor:
    """Boolean mask (True = attend) of the diagonal offset: column j <= row i + offset."""
    rows = torch.arange(n_rows, device=device).unsqueeze(1)
    cols = torch.arange(n_cols, device=device).unsqueeze(0)
    return cols <= rows + offset


def finite(lse: torch.Tensor) -> torch.Tensor:
    """lse with -inf (rows that see nothing) replaced by 0 so that exp(s - lse) is 0, not nan."""
    return lse.masked_fill(torch.isneginf(lse), 0.0)


def bias(mask: torch.Tensor, dtype: torch.dtype, device) -> torch.Tensor:
    """Additive bias (0 where attended, -inf elsewhere) of a boolean mask."""
    out = torch.zeros(mask.shape, dtype=dtype, device=device)
    return out.masked_fill_(~mask.to(device), _NEG_INF)


def _t(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(1, 2)


# ---------------------------------------------------------------- op schemas

#: the schemas of the fused ops as this module calls them (torch 2.13)
SCHEMAS = {
    "_scaled_dot_product_flash_attention_for_cpu":
        "aten::_scaled_dot_product_flash_attention_for_cpu(Tensor query, Tensor key, Tensor value, "
        "float dropout_p=0., bool is_causal=False, *, Tensor? attn_mask=None, float? scale=None) "
        "-> (Tensor output, Tensor logsumexp)",
    "_scaled_dot_product_flash_attention_for_cpu_backward":
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward(Tensor grad_out, Tensor query, Tensor key, "
        "Tensor value, Tensor out, Tensor logsumexp, float dropout_p, bool is_causal, *, Tensor? attn_mask=None, "
        "float? scale=None) -> (Tensor grad_query, Tensor grad_key, Tensor grad_value)",
    "_scaled_dot_product_efficient_attention":
        "aten::_scaled_dot_product_efficient_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_bias, "
        "bool compute_log_sumexp, float dropout_p=0., bool is_causal=False, *, float? scale=None) "
        "-> (Tensor output, Tensor log_sumexp, Tensor philox_seed, Tensor philox_offset)",
    "_scaled_dot_product_efficient_attention_backward":
        "aten::_scaled_dot_product_efficient_attention_backward(Tensor grad_out_, Tensor query, Tensor key, "
        "Tensor value, Tensor attn_bias, Tensor out, Tensor logsumexp, Tensor philox_seed, Tensor philox_offset, "
        "float dropout_p, bool[4] grad_input_mask, bool is_causal=False, *, float? scale=None) "
        "-> (Tensor, Tensor, Tensor, Tensor)",
    "_scaled_dot_product_cudnn_attention":
        "aten::_scaled_dot_product_cudnn_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_bias, "
        "bool compute_log_sumexp, float dropout_p=0., bool is_causal=False, bool return_debug_mask=False, *, "
        "float? scale=None) -> (Tensor output, Tensor logsumexp, Tensor cum_seq_q, Tensor cum_seq_k, "
        "SymInt max_q, SymInt max_k, Tensor philox_seed, Tensor philox_offset, Tensor debug_attn_mask)",
    "_scaled_dot_product_cudnn_attention_backward":
        "aten::_scaled_dot_product_cudnn_attention_backward(Tensor grad_out, Tensor query, Tensor key, "
        "Tensor value, Tensor out, Tensor logsumexp, Tensor philox_seed, Tensor philox_offset, Tensor attn_bias, "
        "Tensor cum_seq_q, Tensor cum_seq_k, SymInt max_q, SymInt max_k, float dropout_p, bool is_causal, *, "
        "float? scale=None) -> (Tensor, Tensor, Tensor)",
    "_scaled_dot_product_flash_attention":
        "aten::_scaled_dot_product_flash_attention(Tensor query, Tensor key, Tensor value, float dropout_p=0., "
        "bool is_causal=False, bool return_debug_mask=False, *, float? scale=None) -> (Tensor output, "
        "Tensor logsumexp, Tensor cum_seq_q, Tensor cum_seq_k, SymInt max_q, SymInt max_k, Tensor rng_state, "
        "Tensor unused, Tensor debug_attn_mask)",
    "_scaled_dot_product_flash_attention_backward":
        "aten::_scaled_dot_product_flash_attention_backward(Tensor grad_out, Tensor query, Tensor key, "
        "Tensor value, Tensor out, Tensor logsumexp, Tensor cum_seq_q, Tensor cum_seq_k, SymInt max_q, "
        "SymInt max_k, float dropout_p, bool is_causal, Tensor philox_seed, Tensor philox_offset, *, "
        "float? scale=None) -> (Tensor grad_query, Tensor grad_key, Tensor grad_value)",
}


@lru_cache(maxsize=None)
def schema_problem(op_name: str, expected: str) -> str | None:
    """None if ``torch.ops.aten.<op_name>`` exists with the ``expected`` schema, else why not (cached per pair)."""
    try:
        actual = str(getattr(torch.ops.aten, op_name).default._schema)
    except (AttributeError, RuntimeError):
        return f"torch {torch.__version__} has no aten::{op_name}"
    if actual != expected:
        return f"aten::{op_name} has schema {actual!r} in torch {torch.__version__}, expected {expected!r}"
    return None


def _op(name: str):
    return getattr(torch.ops.aten, name).default


# ---------------------------------------------------------------- the registry

@dataclass(frozen=True)
class Backend:
    """One block kernel: forward with lse, its own backward, and where it runs.

    ``gqa``: takes K/V with fewer heads than Q itself (else kernels repeats them);
    ``masks``: takes an explicit boolean mask; ``square_causal``: causal only when rows == keys
    (its causal mask is not top-left otherwise); ``ops``: the fused ops whose schema it needs.
    """

    name: str
    forward: Callable
    backward: Callable
    devices: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...]
    max_head_dim: int = 256
    head_dim_multiple: int = 1
    gqa: bool = False
    masks: bool = True
    square_causal: bool = False
    ops: tuple[str, ...] = ()
    needs: Callable[[], str | None] = field(default=lambda: None)  # extra check (package, hardware)

    def unavailable(self, device_type: str, dtype: torch.dtype, head_dim: int, masked: bool = False,
                    schemas: dict[str, str] | None = None) -> str | None:
        """None if this backend can run (device, dtype, head dim, mask) here, else the reason.

        ``schemas``: the expected op schemas (default ``SCHEMAS``, read at each call)."""
        if device_type not in self.devices:
            return f"{self.name} runs on {'/'.join(self.devices)}, not {device_type}"
        if dtype not in self.dtypes:
            names = ", ".join(str(d).replace("torch.", "") for d in self.dtypes)
            return f"{self.name} takes {names}, not {str(dtype).replace('torch.', '')}"
        if head_dim > self.max_head_dim or head_dim % self.head_dim_multiple:
            return (f"{self.name} takes head dims that are multiples of {self.head_dim_multiple} up to "
                    f"{self.max_head_dim}, not {head_dim}")
        if masked and not self.masks:
            return f"{self.name} takes no explicit mask"
        for op in self.ops:
            why = schema_problem(op, (schemas or SCHEMAS)[op])
            if why:
                return why
        return self.needs()

    def available(self, device_type: str, dtype: torch.dtype, head_dim: int, masked: bool = False) -> bool:
        return self.unavailable(device_type, dtype, head_dim, masked) is None


BACKENDS: dict[str, Backend] = {}
ALIASES = {"reference": "math", "cuda_efficient": "efficient"}


def register(backend: Backend) -> Backend:
    BACKENDS[backend.name] = backend
    return backend


def get(name: str) -> Backend:
    """The backend of a name or alias (KeyError if unknown)."""
    return BACKENDS[ALIASES.get(name, name)]


# ---------------------------------------------------------------- math: matmul + logsumexp (the reference)

def _ref_scores(q, k, scale, causal, mask):
    ct = lse_dtype(q.dtype)
    s = torch.matmul(_t(q).to(ct), _t(k).transpose(-1, -2).to(ct)) * scale
    if causal:
        s = s.masked_fill(~offset_mask(s.shape[-2], s.shape[-1], 0, s.device), _NEG_INF)
    elif mask is not None:
        s = s.masked_fill(~mask.to(s.device), _NEG_INF)
    return s  # (b, h, q, k)


def _math_forward(q, k, v, scale, causal, mask):
    """Plain softmax attention with explicit scores and logsumexp (float32/float64)."""
    s = _ref_scores(q, k, scale, causal, mask)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - finite(lse).unsqueeze(-1))
    out = _t(torch.matmul(p, _t(v).to(p.dtype)))
    return out.to(q.dtype), lse


def _math_backward(dout, q, k, v, out, lse, scale, causal, mask):
    """Attention backward from saved out and lse: dS = P * (dP - rowsum(dO * O)) (FlashAttention-2 Alg. 2)."""
    ct = lse_dtype(q.dtype)
    s = _ref_scores(q, k, scale, causal, mask)
    p = torch.exp(s - finite(lse.to(ct)).unsqueeze(-1))
    do = _t(dout).to(ct)
    dv = torch.matmul(p.transpose(-1, -2), do)
    dp = torch.matmul(do, _t(v).to(ct).transpose(-1, -2))
    delta = (dout.to(ct) * out.to(ct)).sum(-1).transpose(1, 2).unsqueeze(-1)  # (b, h, q, 1)
    ds = p * (dp - delta) * scale
    dq = torch.matmul(ds, _t(k).to(ct))
    dk = torch.matmul(ds.transpose(-1, -2), _t(q).to(ct))
    return _t(dq).to(q.dtype), _t(dk).to(q.dtype), _t(dv).to(q.dtype)


register(Backend("math", _math_forward, _math_backward, devices=("cpu", "cuda"),
                 dtypes=(torch.float64, *_FLOATS), max_head_dim=1 << 16))


# ---------------------------------------------------------------- cpu_flash: PyTorch's fused CPU flash kernel

def _cpu_flash_forward(q, k, v, scale, causal, mask):
    b = None if mask is None else bias(mask, q.dtype, q.device)
    out, lse = _op("_scaled_dot_product_flash_attention_for_cpu")(_t(q), _t(k), _t(v), 0.0, causal,
                                                                   attn_mask=b, scale=scale)
    return _t(out), lse


def _cpu_flash_backward(dout, q, k, v, out, lse, scale, causal, mask):
    b = None if mask is None else bias(mask, q.dtype, q.device)
    dq, dk, dv = _op("_scaled_dot_product_flash_attention_for_cpu_backward")(
        _t(dout), _t(q), _t(k), _t(v), _t(out), lse.to(lse_dtype(q.dtype)), 0.0, causal, attn_mask=b, scale=scale)
    return _t(dq), _t(dk), _t(dv)


register(Backend("cpu_flash", _cpu_flash_forward, _cpu_flash_backward, devices=("cpu",), dtypes=_FLOATS,
                 max_head_dim=1 << 16, ops=("_scaled_dot_product_flash_attention_for_cpu",
                                           "_scaled_dot_product_flash_attention_for_cpu_backward")))


# ---------------------------------------------------------------- efficient: PyTorch's memory-efficient CUDA kernel

def _cuda_bias(mask, q):
    """Mask as a bias of the alignment the memory-efficient kernel wants (last dim padded to 16)."""
    if mask is None:
        return None
    n_q, n_k = mask.shape
    padded = torch.zeros(n_q, (n_k + 15) // 16 * 16, dtype=q.dtype, device=q.device)
    b = padded[:, :n_k].masked_fill_(~mask.to(q.device), _NEG_INF)
    return b.expand(q.shape[0], q.shape[2], n_q, n_k)


def _efficient_forward(q, k, v, scale, causal, mask):  # pragma: no cover - needs CUDA
    out, lse, _, _ = _op("_scaled_dot_product_efficient_attention")(
        _t(q), _t(k), _t(v), _cuda_bias(mask, q), True, 0.0, causal, scale=scale)
    return _t(out), lse[..., : q.shape[1]]


def _efficient_backward(dout, q, k, v, out, lse, scale, causal, mask):  # pragma: no cover
    n_q = q.shape[1]
    lse_p = torch.full((*lse.shape[:-1], (n_q + 31) // 32 * 32), _NEG_INF, dtype=torch.float32, device=q.device)
    lse_p[..., :n_q] = lse
    seed = torch.zeros((), dtype=torch.long, device=q.device)
    dq, dk, dv, _ = _op("_scaled_dot_product_efficient_attention_backward")(
        _t(dout), _t(q), _t(k), _t(v), _cuda_bias(mask, q), _t(out), lse_p, seed, seed, 0.0,
        [True, True, True, False], causal, scale=scale)
    return _t(dq), _t(dk), _t(dv)


register(Backend("efficient", _efficient_forward, _efficient_backward, devices=("cuda",), dtypes=_FLOATS,
                 ops=("_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward")))


# ---------------------------------------------------------------- cudnn: PyTorch's cuDNN SDPA

def _cudnn_forward(q, k, v, scale, causal, mask):  # pragma: no cover - needs CUDA + cuDNN
    res = _op("_scaled_dot_product_cudnn_attention")(_t(q), _t(k), _t(v), None, True, 0.0, causal, False,
                                                     scale=scale)
    lse = res[1]
    return _t(res[0]), (lse.squeeze(-1) if lse.dim() == 4 else lse)  # [B, H, S, 1] in torch 2.11


def _cudnn_backward(dout, q, k, v, out, lse, scale, causal, mask):
    # attn_bias, cum_seq_q and cum_seq_k go in undefined (None), as autograd passes them for dense inputs: a
    # defined tensor there, even an empty one, is read as a bias or as nested (varlen) offsets.
    n_q, n_k = q.shape[1], k.shape[1]
    seed = torch.zeros((), dtype=torch.long, device=q.device)
    dq, dk, dv = _op("_scaled_dot_product_cudnn_attention_backward")(
        _t(dout), _t(q), _t(k), _t(v), _t(out), lse.to(torch.float32).unsqueeze(-1).contiguous(), seed, seed,
        None, None, None, n_q, n_k, 0.0, causal, scale=scale)
    return _t(dq), _t(dk), _t(dv)


def _cudnn_needs() -> str | None:  # pragma: no cover - CPU builds say no cuDNN
    if not torch.backends.cudnn.is_available():
        return "cuDNN is not available in this torch build"
    return None


# cuDNN and flash take K/V with fewer heads than Q as they are (GQA), forward and backward: on an H200 (torch 2.11,
# cuDNN 9.19) the same results as with K/V repeated to Q's heads and 1-10 % faster (benchmarks/gpu/probe_ops.py).
register(Backend("cudnn", _cudnn_forward, _cudnn_backward, devices=("cuda",), dtypes=_HALF, max_head_dim=128,
                 head_dim_multiple=8, gqa=True, masks=False, square_causal=True, needs=_cudnn_needs,
                 ops=("_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward")))


# ---------------------------------------------------------------- flash: PyTorch's flash SDPA

def _flash_forward(q, k, v, scale, causal, mask):  # pragma: no cover - needs CUDA
    out, lse = _op("_scaled_dot_product_flash_attention")(_t(q), _t(k), _t(v), 0.0, causal, False,
                                                          scale=scale)[:2]
    return _t(out), lse  # lse [B, H, S]


def _flash_backward(dout, q, k, v, out, lse, scale, causal, mask):
    # cum_seq_q and cum_seq_k go in undefined (None) for dense inputs: defined ones select the varlen kernel.
    n_q, n_k = q.shape[1], k.shape[1]
    seed = torch.zeros(2, dtype=torch.long, device=q.device)
    dq, dk, dv = _op("_scaled_dot_product_flash_attention_backward")(
        _t(dout), _t(q), _t(k), _t(v), _t(out), lse.to(torch.float32).contiguous(), None, None, n_q, n_k, 0.0,
        causal, seed, seed, scale=scale)
    return _t(dq), _t(dk), _t(dv)


register(Backend("flash", _flash_forward, _flash_backward, devices=("cuda",), dtypes=_HALF, gqa=True, masks=False,
                 square_causal=True, head_dim_multiple=8,
                 ops=("_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward")))


# ---------------------------------------------------------------- flash_attn: the flash-attn package

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


def _flash_attn_forward(q, k, v, scale, causal, mask):  # pragma: no cover - needs CUDA + flash-attn
    fn = _fa._flash_attn_forward
    res = fn(q, k, v, **_fa_kwargs(fn, dropout_p=0.0, softmax_scale=scale, causal=causal,
                                   window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                                   return_softmax=False))
    out, lse = (res[0], res[1]) if len(res) == 4 else (res[0], res[5])
    return out, lse


def _flash_attn_backward(dout, q, k, v, out, lse, scale, causal, mask):  # pragma: no cover
    fn = _fa._flash_attn_backward
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    fn(dout.contiguous(), q, k, v, out, lse.contiguous(), dq, dk, dv,
       **_fa_kwargs(fn, dropout_p=0.0, softmax_scale=scale, causal=causal, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=True, rng_state=None))
    return dq, dk, dv


def _flash_attn_needs() -> str | None:
    return None if _fa is not None else "the flash-attn package is not installed"


register(Backend("flash_attn", _flash_attn_forward, _flash_attn_backward, devices=("cuda",), dtypes=_HALF,
                 gqa=True, masks=False, square_causal=True, head_dim_multiple=8, needs=_flash_attn_needs))


#: every backend, fastest first as a rule of thumb (the measured choice decides)
PRIORITY = ("flash_attn", "cudnn", "flash", "efficient", "cpu_flash", "math")
#: the order when nothing is measured (``kernels.select_backend``): the long-standing defaults
STATIC = ("flash_attn", "efficient", "cpu_flash", "math")


def available(device_type: str, dtype: torch.dtype, head_dim: int, masked: bool = False) -> list[str]:
    """Names of the backends that run here, in ``PRIORITY`` order."""
    return [n for n in PRIORITY if BACKENDS[n].available(device_type, dtype, head_dim, masked)]
