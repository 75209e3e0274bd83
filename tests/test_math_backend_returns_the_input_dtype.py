"""The math backend accumulates in float32 but returns out and dq, dk, dv in the input dtype (bfloat16 in,
bfloat16 out); lse stays float32."""
import torch

from sp_plan.runtime import backends as B


def test_bfloat16_in_bfloat16_out():
    be = B.BACKENDS["math"]
    q = torch.randn(1, 8, 2, 8, dtype=torch.bfloat16)
    out, lse = be.forward(q, q, q, 0.35, True, None)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    grads = be.backward(q, q, q, q, out, lse, 0.35, True, None)
    assert [g.dtype for g in grads] == [torch.bfloat16] * 3
