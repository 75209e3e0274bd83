"""The memory-efficient kernel's mask bias is (batch, heads, rows, keys), 0 where attended and -inf elsewhere,
laid out with its key dimension padded to a multiple of 16 elements."""
import torch

from sp_plan.runtime import backends as B


def test_bias_shape_values_and_row_stride():
    q = torch.randn(2, 5, 3, 8)
    mask = torch.rand(5, 21) < 0.5
    b = B._cuda_bias(mask, q)
    assert b.shape == (2, 3, 5, 21)
    assert b.stride(-2) % 16 == 0 and b.stride(-2) >= 21
    assert torch.equal(torch.isneginf(b[1, 2]), ~mask) and (b[0, 0][mask] == 0).all()
    assert B._cuda_bias(None, q) is None
