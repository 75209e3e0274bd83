"""Shared by the exactness tests: put every rank's shard back at its global token positions."""
import numpy as np
import torch


def assemble(templates: list[torch.Tensor], pieces, seq_len: int, what: str = "") -> list[torch.Tensor]:
    """Scatter (token indices, tensors) pieces along dim 1 into float64 tensors shaped like ``templates``;
    every token must come from exactly one piece."""
    full = [torch.zeros_like(t, dtype=torch.float64) for t in templates]
    seen = np.zeros(seq_len, dtype=int)
    for tok, vals in pieces:
        seen[tok] += 1
        for dst, val in zip(full, vals):
            dst[:, torch.as_tensor(tok)] = val.to(torch.float64)
    assert (seen == 1).all(), f"{what}: ranks do not hold every token exactly once"
    return full


DTYPES = {"float64": torch.float64, "float32": torch.float32}
TOLERANCE = {"float64": 1e-10, "float32": 1e-5}  # against a float64 single-process reference


def sdpa_reference(q, k, v, dout, causal: bool) -> list[torch.Tensor]:
    """Single-process attention on the full (batch, seq, heads, dim) sequence: out, dq, dk, dv (GQA aware)."""
    import torch.nn.functional as F

    qt, kt, vt = (x.transpose(1, 2).clone().requires_grad_() for x in (q, k, v))
    out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=True)
    out.backward(dout.transpose(1, 2))
    return [x.transpose(1, 2) for x in (out.detach(), qt.grad, kt.grad, vt.grad)]
