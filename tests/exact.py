"""Shared by the exactness tests: one world per size, every rank's shard put back at its global token positions,
and the tolerances of a dtype."""
import functools

import numpy as np
import torch
from harness.worlds import run_world


def once(world_results):
    """Cache a module's ``world_results(world)``, its error as well: a world that failed or timed out fails every
    case that reads it with that error, rather than starting again for each."""
    outcomes: dict = {}

    @functools.wraps(world_results)
    def cached(*args):
        if args not in outcomes:
            try:
                outcomes[args] = (True, world_results(*args))
            except Exception as e:  # noqa: BLE001 - kept and raised again for every case of this world
                outcomes[args] = (False, e)
        ok, value = outcomes[args]
        if not ok:
            raise value
        return value

    return cached


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


def gathered_attention(run_cases, world: int, todo: list, inputs, seq_len: int) -> dict[str, list[torch.Tensor]]:
    """Run ``run_cases`` over ``todo`` in one gloo world of ``world`` ranks, each rank returning per case (token
    indices, out, dq, dk, dv); per case id, the global (out, dq, dk, dv) in float64 (``inputs(case)``: q, k, v,
    dout)."""
    per_rank = run_world(run_cases, world, todo, timeout=300)
    out = {}
    for i, case in enumerate(todo):
        q, k, v, _ = inputs(case)
        pieces = [(per_rank[rank][i][0], per_rank[rank][i][1:]) for rank in range(world)]
        out[case.id] = assemble([q, q, k, v], pieces, seq_len, case.id)
    return out


DTYPES = {"float64": torch.float64, "float32": torch.float32}


def tolerance(dtype: str | torch.dtype, terms: int) -> float:
    """The largest error a result computed in ``dtype`` may have against its float64 reference, relative to the
    reference's scale (``scaled_error``): gamma_n = n u / (1 - n u), the forward error bound of sums and products
    over n terms in unit roundoff u (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., section 3.1),
    with n the terms summed along the longest chain from the inputs to the result. It holds whatever order a
    core count or a kernel's blocking adds the terms in."""
    u = torch.finfo(DTYPES.get(dtype, dtype)).eps / 2
    n = terms + 1  # the rounding of the inputs to dtype
    assert n * u < 1, f"{terms} terms exceed what {dtype} can bound"
    return n * u / (1 - n * u)


def attention_terms(seq: int, head_dim: int, heads_per_kv: int = 1) -> int:
    """Terms on attention's longest chain from q, k, v to a gradient: the scores and, in the backward, dP and
    rowsum(dO * O) (head_dim each); the softmax's normaliser, the output and dq, dk or dv (seq each); dk and dv
    also add the query heads that share a key head."""
    return 3 * head_dim + 3 * seq + heads_per_kv


def scaled_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref|, relative to the reference's largest entry where that exceeds 1 (the inputs are of order 1);
    0 for empty tensors."""
    if ref.numel() == 0:
        return 0.0
    got, ref = got.detach(), ref.detach()  # a reading: no graph to keep
    return float((got.double() - ref.double()).abs().max()) / max(1.0, float(ref.abs().max()))


def mismatches(got, ref, names, dtype, terms: int, what: str) -> list[str]:
    """One line per tensor of ``got`` off its reference by more than ``tolerance(dtype, terms)``."""
    tol = tolerance(dtype, terms)
    errs = ((name, scaled_error(g, r)) for name, g, r in zip(names, got, ref))
    return [f"{what}: {name} differs from the reference by {err:.3g} > {tol:.3g}" for name, err in errs
            if not err <= tol]


def sdpa_reference(q, k, v, dout, causal: bool) -> list[torch.Tensor]:
    """Single-process attention on the full (batch, seq, heads, dim) sequence: out, dq, dk, dv (GQA aware)."""
    import torch.nn.functional as F

    qt, kt, vt = (x.transpose(1, 2).clone().requires_grad_() for x in (q, k, v))
    out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=True)
    out.backward(dout.transpose(1, 2))
    return [x.transpose(1, 2) for x in (out.detach(), qt.grad, kt.grad, vt.grad)]
