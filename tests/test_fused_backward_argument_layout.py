"""The fused CUDA backward ops get the layout their kernels read: cuDNN's lse as (batch, heads, rows, 1), max_q /
max_k as the row and key counts (in that order) for cuDNN and flash, and the memory-efficient kernel's lse padded
with -inf to a multiple of 32 rows."""
import torch

from sp_plan.runtime import backends as B


def _record(monkeypatch):
    calls = []

    def op(*args, **kwargs):
        calls.append(args)
        out = [args[1].clone(), args[2].clone(), args[3].clone()]
        return out + [None] if len(args) > 10 and isinstance(args[10], list) else out
    monkeypatch.setattr(B, "_op", lambda name: op)
    return calls


def _blocks(n_q=16, n_k=24):
    q = torch.randn(1, n_q, 2, 8)
    k = torch.randn(1, n_k, 2, 8)
    return q, k, torch.zeros(1, 2, n_q)


def test_cudnn_backward_layout(monkeypatch):
    calls = _record(monkeypatch)
    q, k, lse = _blocks()
    B.get("cudnn").backward(q, q, k, k, q, lse, 0.5, False, None)
    args = calls[0]
    assert args[5].shape == (1, 2, 16, 1) and args[5].dtype == torch.float32
    assert (args[11], args[12]) == (16, 24)


def test_flash_backward_layout(monkeypatch):
    calls = _record(monkeypatch)
    q, k, lse = _blocks()
    B.get("flash").backward(q, q, k, k, q, lse, 0.5, False, None)
    args = calls[0]
    assert args[5].shape == (1, 2, 16) and (args[8], args[9]) == (16, 24)


def test_efficient_backward_pads_lse(monkeypatch):
    calls = _record(monkeypatch)
    q, k, lse = _blocks(n_q=40)
    B.get("efficient").backward(q, q, k, k, q, lse, 0.5, False, None)
    lse_p = calls[0][6]
    assert lse_p.shape == (1, 2, 64)
    assert (lse_p[..., :40] == 0).all() and torch.isneginf(lse_p[..., 40:]).all()
