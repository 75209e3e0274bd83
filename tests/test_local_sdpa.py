"""Degree-1 attention on a backend that is one of SDPA's runs as SDPA held to that backend (one fused autograd
node) and agrees with the block kernels' path, GQA and causal included."""
from __future__ import annotations

import pytest
import torch

from sp_plan.runtime.kernels import _LocalAttention, _sdpa_kernel, local_attention


def _qkv(heads: int, kv_heads: int, n: int = 48, d: int = 16):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, n, h, d, generator=g, dtype=torch.float64, requires_grad=True)
            for h in (heads, kv_heads, kv_heads)]


@pytest.mark.parametrize("scale", [None, 0.3])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_sdpa_path_matches_the_block_kernels_path(causal, kv_heads, scale):
    q, k, v = _qkv(4, kv_heads)
    out = local_attention(q, k, v, causal=causal, backend="math", scale=scale)
    assert "_LocalAttention" not in type(out.grad_fn).__name__
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), do)
    ref = _LocalAttention.apply(q, k, v, causal, scale, "math")
    ref_grads = torch.autograd.grad(ref, (q, k, v), do)
    assert torch.allclose(out, ref, atol=1e-10)
    for g, r in zip(grads, ref_grads):
        assert g.shape == r.shape and torch.allclose(g, r, atol=1e-10)


def test_cpu_flash_is_sdpas_own_fused_node():
    q, k, v = (x.detach().float().requires_grad_() for x in _qkv(4, 2))
    out = local_attention(q, k, v, causal=True, backend="cpu_flash")
    assert type(out.grad_fn.next_functions[0][0]).__name__.startswith("ScaledDotProductFlashAttention")


def test_which_backends_go_through_sdpa():
    assert _sdpa_kernel("cudnn", gqa=True) is not None and _sdpa_kernel("cpu_flash", gqa=False) is not None
    assert _sdpa_kernel("efficient", gqa=True) is None  # SDPA's memory-efficient kernel takes no GQA
    assert _sdpa_kernel("flash_attn", gqa=False) is None  # the flash-attn package: the block kernels' path
    assert _sdpa_kernel(None, gqa=False) is None


def test_the_held_backend_leaves_sdpas_switches_as_it_found_them():
    cb = torch.backends.cuda
    before = (cb.flash_sdp_enabled(), cb.mem_efficient_sdp_enabled(), cb.math_sdp_enabled(), cb.cudnn_sdp_enabled())
    q, k, v = (x.detach().float().requires_grad_() for x in _qkv(4, 2))  # float32: SDPA's own choice is flash
    out = local_attention(q, k, v, causal=True, backend="math")
    assert "Flash" not in type(out.grad_fn.next_functions[0][0]).__name__  # held to math: its decomposition ran
    with pytest.raises(RuntimeError):  # SDPA refuses the call: the switches come back all the same
        local_attention(q, k[:, :, :1].expand(-1, -1, 3, -1), v[:, :, :1].expand(-1, -1, 3, -1), backend="math")
    after = (cb.flash_sdp_enabled(), cb.mem_efficient_sdp_enabled(), cb.math_sdp_enabled(), cb.cudnn_sdp_enabled())
    assert after == before


@pytest.mark.parametrize("kv_heads", [8, 2])
def test_cuda_flash_is_one_autograd_node_on_the_callers_layout(kv_heads):
    """CUDA's flash runs aten::_flash_attention_forward on (batch, seq, heads, dim) as given (shapes checked on the
    meta device, which has the op and its backward): one node, no transposes, GQA K/V unrepeated, and gradients
    of the inputs' shapes."""
    q, k, v = (torch.empty(1, 64, h, 128, device="meta", dtype=torch.bfloat16, requires_grad=True)
               for h in (8, kv_heads, kv_heads))
    out = local_attention(q, k, v, causal=True, backend="flash")
    assert type(out.grad_fn).__name__ == "FlashAttentionBackward0" and out.shape == q.shape
    out.backward(torch.empty_like(out))
    assert (q.grad.shape, k.grad.shape, v.grad.shape) == (q.shape, k.shape, v.shape)


def test_cuda_flash_takes_sdpa_where_a_last_dimension_is_strided_or_the_op_differs(monkeypatch):
    """A strided last dimension (the kernel reads contiguous rows), or a torch whose op has another schema, goes
    through SDPA held to flash, as before."""
    from sp_plan.runtime import kernels

    q, k, v = (torch.empty(1, 64, 8, 128, device="meta", dtype=torch.bfloat16) for _ in range(3))
    assert kernels._flash_bshd(q, k, v, True, None) is not None
    strided = torch.empty(1, 64, 8, 256, device="meta", dtype=torch.bfloat16)[..., ::2]
    assert kernels._flash_bshd(strided, k, v, True, None) is None
    monkeypatch.setattr(kernels, "FLASH_BSHD_SCHEMA", "aten::_flash_attention_forward(Tensor q, Tensor k")
    kernels.flash_bshd_op.cache_clear()
    try:
        assert kernels.flash_bshd_op() is None and kernels._flash_bshd(q, k, v, True, None) is None
    finally:
        monkeypatch.undo()
        kernels.flash_bshd_op.cache_clear()
    assert kernels.flash_bshd_op() is not None
