"""cpu_flash's backward takes the global lse in whatever float dtype the caller holds it (e.g. float64 after a
float64 merge) and gives the same gradients as with float32 lse."""
import torch

from sp_plan.runtime import backends as B


def test_float64_lse_gives_the_float32_gradients():
    be = B.BACKENDS["cpu_flash"]
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 16, 2, 8, generator=g) for _ in range(4))
    out, lse = be.forward(q, k, v, 0.35, True, None)
    ref = be.backward(do, q, k, v, out, lse, 0.35, True, None)
    got = be.backward(do, q, k, v, out, lse.double(), 0.35, True, None)
    assert all(torch.equal(a, b) for a, b in zip(got, ref))
