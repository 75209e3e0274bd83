"""Unit tests of the block kernels: merge, CPU flash vs reference, mask forms, block backward, mask reduction."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from exact import attention_terms, scaled_error, tolerance
from sp_plan.planner.layout import ring_tokens
from sp_plan.runtime import kernels as K


def _qkv(n_q=12, n_k=10, heads=4, kv_heads=2, dim=8, dtype=torch.float64, seed=0, batch=2):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, n_q, heads, dim, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(batch, n_k, kv_heads, dim, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(batch, n_k, kv_heads, dim, generator=g, dtype=torch.float64).to(dtype)
    return q, k, v


def _sdpa(q, k, v, allowed=None):
    """float64 reference (batch, seq, heads, dim) with autograd; rows that see nothing give 0."""
    qt, kt, vt = (x.detach().transpose(1, 2).to(torch.float64).requires_grad_() for x in (q, k, v))
    out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=allowed, enable_gqa=True)
    if allowed is not None:
        out = torch.where(allowed.any(1).view(1, 1, -1, 1), out, 0.0)
    return out, (qt, kt, vt)


def _ref_lse(q, k, allowed=None):
    kk = k.to(torch.float64).repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q.to(torch.float64), kk) / q.shape[-1] ** 0.5
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    return torch.logsumexp(s, -1)


# ---------------------------------------------------------------- merge

def test_merge_of_key_halves_equals_full_attention():
    q, k, v = _qkv(n_k=16)
    o1, l1 = K.block_attention(q, k[:, :7], v[:, :7])
    o2, l2 = K.block_attention(q, k[:, 7:], v[:, 7:])
    out, lse = K.merge(None, None, o1, l1)
    out, lse = K.merge(out, lse, o2, l2)
    ref, _ = _sdpa(q, k, v)
    assert (out - ref.transpose(1, 2)).abs().max() < 1e-13
    assert (lse - _ref_lse(q, k)).abs().max() < 1e-13


def test_merge_updates_views_in_place_and_ignores_rows_without_keys():
    q, k, v = _qkv(n_q=6, n_k=8)
    full_o, full_l = K.block_attention(q, k, v)
    out = torch.zeros_like(full_o)
    lse = torch.full_like(full_l, float("-inf"))
    K.merge(out[:, 2:], lse[..., 2:], full_o[:, 2:], full_l[..., 2:])  # rows 0, 1 never get keys
    assert torch.equal(out[:, :2], torch.zeros_like(out[:, :2]))
    assert torch.isneginf(lse[..., :2]).all()
    assert (out[:, 2:] - full_o[:, 2:]).abs().max() < 1e-15
    # a block whose rows see nothing (lse -inf) leaves the accumulator unchanged
    dead_o, dead_l = torch.zeros_like(full_o), torch.full_like(full_l, float("-inf"))
    before = out.clone()
    K.merge(out, lse, dead_o, dead_l)
    assert torch.equal(out, before) and not torch.isnan(out).any()


def test_merge_accumulates_in_float32_for_bfloat16():
    q, k, v = _qkv(dtype=torch.bfloat16)
    o, l = K.block_attention(q, k, v)
    out, lse = K.merge(None, None, o, l)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    out, lse = K.merge(out, lse, o, l)  # the same keys twice: same output, lse + log 2
    assert (out - o.float()).abs().max() < 1e-6
    assert (lse - l - np.log(2)).abs().max() < 1e-5


# ---------------------------------------------------------------- kernel paths

def test_backend_selection_on_cpu():
    assert K.select_backend(torch.zeros(1, dtype=torch.float32)) == "cpu_flash"
    assert K.select_backend(torch.zeros(1, dtype=torch.bfloat16)) == "cpu_flash"
    assert K.select_backend(torch.zeros(1, dtype=torch.float64)) == "reference"


OFFSETS = [None, 0, 3, -2, -11, -30]


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_cpu_flash_matches_float64_reference(offset, kv_heads):
    q, k, v = _qkv(kv_heads=kv_heads, dtype=torch.float32)
    o_f, l_f = K.block_attention(q, k, v, causal_offset=offset, backend="cpu_flash")
    o_r, l_r = K.block_attention(q.double(), k.double(), v.double(), causal_offset=offset, backend="reference")
    tol = tolerance("float32", attention_terms(k.shape[1], q.shape[-1], q.shape[2] // kv_heads))
    assert scaled_error(o_f, o_r) <= tol
    alive = ~torch.isneginf(l_r)
    assert torch.equal(alive, ~torch.isneginf(l_f))
    assert scaled_error(l_f[alive], l_r[alive]) <= tol
    do = torch.randn_like(o_f)
    g_f = K.block_attention_backward(do, q, k, v, o_f, l_f, causal_offset=offset, backend="cpu_flash")
    g_r = K.block_attention_backward(do.double(), q.double(), k.double(), v.double(), o_r, l_r,
                                     causal_offset=offset, backend="reference")
    for a, b in zip(g_f, g_r):
        assert a.shape == b.shape and scaled_error(a, b) <= tol


@pytest.mark.parametrize("backend", ["reference", "cpu_flash"])
@pytest.mark.parametrize("offset", OFFSETS)
def test_explicit_mask_equals_diagonal_offset(backend, offset):
    q, k, v = _qkv()
    mask = K.offset_mask(q.shape[1], k.shape[1], offset if offset is not None else 10**6)
    o_off, l_off = K.block_attention(q, k, v, causal_offset=offset, backend=backend)
    o_msk, l_msk = K.block_attention(q, k, v, mask=mask, backend=backend)
    assert (o_off - o_msk).abs().max() < 1e-13
    assert torch.equal(torch.isneginf(l_off), torch.isneginf(l_msk))
    do = torch.randn_like(o_off)
    for a, b in zip(K.block_attention_backward(do, q, k, v, o_off, l_off, causal_offset=offset, backend=backend),
                    K.block_attention_backward(do, q, k, v, o_msk, l_msk, mask=mask, backend=backend)):
        assert (a - b).abs().max() < 1e-13 and not torch.isnan(a).any()


@pytest.mark.parametrize("backend", ["reference", "cpu_flash"])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("offset", OFFSETS)
def test_block_forward_and_backward_against_autograd(backend, kv_heads, offset):
    q, k, v = _qkv(kv_heads=kv_heads)
    allowed = None if offset is None else K.offset_mask(q.shape[1], k.shape[1], offset)
    ref, leaves = _sdpa(q, k, v, allowed)
    out, lse = K.block_attention(q, k, v, causal_offset=offset, backend=backend)
    assert (out - ref.detach().transpose(1, 2)).abs().max() < 1e-12
    l_ref = _ref_lse(q, k, allowed)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(l_ref))
    alive = ~torch.isneginf(l_ref)
    assert torch.allclose(lse[alive], l_ref[alive], rtol=0, atol=1e-12)
    do = torch.randn_like(out)
    ref.backward(do.transpose(1, 2))
    for got, leaf in zip(K.block_attention_backward(do, q, k, v, out, lse, causal_offset=offset, backend=backend),
                         leaves):
        assert (got - leaf.grad.transpose(1, 2)).abs().max() < 1e-12


def test_backward_from_global_lse_sums_to_the_full_gradient():
    """Gradients of key blocks from the global (out, lse) add up to the gradient of full attention."""
    q, k, v = _qkv(n_q=8, n_k=24)
    out, lse = K.block_attention(q, k, v)
    do = torch.randn_like(out)
    full = K.block_attention_backward(do, q, k, v, out, lse)
    dq = torch.zeros_like(q)
    dks, dvs = [], []
    for lo, hi in ((0, 5), (5, 17), (17, 24)):
        g = K.block_attention_backward(do, q, k[:, lo:hi], v[:, lo:hi], out, lse)
        dq += g[0]
        dks.append(g[1])
        dvs.append(g[2])
    assert (dq - full[0]).abs().max() < 1e-13
    assert (torch.cat(dks, 1) - full[1]).abs().max() < 1e-13
    assert (torch.cat(dvs, 1) - full[2]).abs().max() < 1e-13


def test_cpu_flash_bfloat16_is_close():
    q, k, v = _qkv(dtype=torch.bfloat16, n_q=32, n_k=32)
    out, lse = K.block_attention(q, k, v, causal_offset=0)
    ref, _ = _sdpa(q, k, v, K.offset_mask(32, 32, 0))
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert (out.double() - ref.detach().transpose(1, 2)).abs().max() < 3e-2


def test_strided_inputs_need_no_copy():
    """Heads sliced from a packed buffer (as after the Ulysses all-to-all) give the same result."""
    buf = torch.randn(1, 20, 12, 8)
    q, k, v = buf[..., :8, :], buf[..., 8:10, :], buf[..., 10:, :]
    a = K.block_attention(q, k, v, causal_offset=0)
    b = K.block_attention(q.contiguous(), k.contiguous(), v.contiguous(), causal_offset=0)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_local_attention_matches_sdpa():
    q, k, v = (x.requires_grad_() for x in _qkv(n_q=16, n_k=16))
    out = K.local_attention(q, k, v, causal=True)
    ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                         enable_gqa=True).transpose(1, 2)
    assert (out - ref).abs().max() < 1e-12
    for a, b in zip(torch.autograd.grad(out.square().sum(), (q, k, v)),
                    torch.autograd.grad(ref.square().sum(), (q, k, v))):
        assert (a - b).abs().max() < 1e-12


# ---------------------------------------------------------------- causal mask reduction

def _dense(bm: K.BlockMask | None, n_q: int, n_k: int) -> np.ndarray:
    out = np.zeros((n_q, n_k), dtype=bool)
    if bm is None:
        return out
    h, w = bm.row_stop - bm.row_start, bm.col_stop - bm.col_start
    if bm.mask is not None:
        sub = bm.mask.numpy()
    elif bm.causal_offset is not None:
        sub = K.offset_mask(h, w, bm.causal_offset).numpy()
    else:
        sub = np.ones((h, w), dtype=bool)
    out[bm.row_start:bm.row_stop, bm.col_start:bm.col_stop] = sub
    return out


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
def test_causal_block_mask_is_exact_and_needs_no_explicit_mask_for_the_ring_layouts(layout):
    ring, seq = 4, 32
    tokens = ring_tokens(layout, ring, seq)
    for p in range(ring):
        for s in range(ring):
            bm = K.causal_block_mask(tokens[p], tokens[s])
            truth = tokens[p][:, None] >= tokens[s][None, :]
            assert np.array_equal(_dense(bm, 8, 8), truth)
            if bm is not None:
                assert bm.mask is None and bm.causal_offset in (None, 0)


def test_causal_block_mask_shapes_of_zigzag_and_striped():
    z = ring_tokens("zigzag", 4, 32)
    assert K.causal_block_mask(z[2], z[0]) == K.BlockMask(0, 8, 0, 4)  # earlier rank: first chunk only
    assert K.causal_block_mask(z[0], z[2]) == K.BlockMask(4, 8, 0, 8)  # later rank: second half of queries
    assert K.causal_block_mask(z[1], z[1]) == K.BlockMask(0, 8, 0, 8, causal_offset=0)
    s = ring_tokens("striped", 4, 32)
    assert K.causal_block_mask(s[0], s[3]) == K.BlockMask(1, 8, 0, 7, causal_offset=0)
    assert K.causal_block_mask(s[3], s[0]) == K.BlockMask(0, 8, 0, 8, causal_offset=0)
    c = ring_tokens("contiguous", 4, 32)
    assert K.causal_block_mask(c[0], c[1]) is None


def test_causal_block_mask_falls_back_to_an_explicit_mask():
    rng = np.random.default_rng(0)
    q_t, k_t = rng.permutation(40)[:10], rng.permutation(40)[:12]
    bm = K.causal_block_mask(q_t, k_t)
    assert bm.mask is not None
    assert np.array_equal(_dense(bm, 10, 12), q_t[:, None] >= k_t[None, :])
    q, k, v = _qkv(n_q=10, n_k=12)
    allowed = torch.from_numpy(q_t[:, None] >= k_t[None, :])
    rows, cols = slice(bm.row_start, bm.row_stop), slice(bm.col_start, bm.col_stop)
    out = torch.zeros_like(q)
    o, _ = K.block_attention(q[:, rows], k[:, cols], v[:, cols], mask=bm.mask)
    out[:, rows] = o
    ref, _ = _sdpa(q, k, v, allowed)
    assert (out - ref.detach().transpose(1, 2)).abs().max() < 1e-12


@pytest.mark.parametrize("n_q,n_k", [(4, 4), (4, 6), (6, 4)])
def test_a_diagonal_block_is_top_left_causal_without_a_mask(n_q, n_k):
    """A causal block whose diagonal starts at its corner (every ring's own block) needs no explicit mask, so the
    kernels that take no mask (flash, cuDNN) stay eligible for it."""
    r = K._region(n_q, n_k, 0, None)
    assert r.causal and r.mask is None and not r.empty and (r.row_start, r.col_stop) == (0, min(n_q, n_k))
    below = K._region(n_q, n_k, 1, None)  # one diagonal further: only a mask expresses it
    assert not below.causal and below.mask is not None
