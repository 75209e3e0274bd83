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
