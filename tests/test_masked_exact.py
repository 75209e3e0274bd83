"""All-gather K/V and ring attention against single-process attention: output and every gradient, with document
masks and sliding windows.

On worlds of 1, 2 and 4 gloo ranks, each token layout, causal and not, MHA and GQA (8 query heads with 2 and 1 KV
heads), no mask / packed documents whose lengths are not multiples of anything (7, 23, 1, 33: what per-document
zigzag in other stacks must pad) / a sliding window / both, float64 and float32. Each rank takes its tokens of
the global sequence (``member_tokens``: with documents, laid out per document, so ranks may hold different
numbers of tokens), runs forward and backward, and returns output and gradients of its tokens;
the parent puts them back and compares with F.scaled_dot_product_attention in float64 under the same boolean
mask. One world per size; the configurations loop inside it.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from exact import DTYPES, TOLERANCE, assemble
from sp_plan.planner.errors import PlanError
from sp_plan.planner.layout import TOKEN_LAYOUTS
from sp_plan.runtime.allgather import allgather_attention
from sp_plan.runtime.kernels import attended, document_ids
from sp_plan.runtime.ring import member_tokens, ring_attention
from sp_plan.runtime.spawn import run_world

BATCH, SEQ, HEADS, HEAD_DIM = 2, 64, 8, 8
DOCS = (0, 7, 30, 31, 64)
MASKS = {"none": (None, None), "documents": (DOCS, None), "window": (None, 9), "documents+window": (DOCS, 9)}


ALGORITHMS = {"allgather": allgather_attention, "ring": ring_attention}


def configs():
    """Every algorithm, token layout (``balanced`` with documents), causality, KV heads, mask and dtype."""
    return [c for c in itertools.product(ALGORITHMS, TOKEN_LAYOUTS + ("balanced",), (True, False), (8, 2, 1), MASKS,
                                         DTYPES) if c[1] != "balanced" or MASKS[c[4]][0] is not None]


def tokens_of(layout: str, world: int, causal: bool, mask: str, rank: int):
    """The tokens a rank holds: the layout over the whole sequence, or per document (members' lengths may differ)."""
    cu, window = MASKS[mask]
    return member_tokens(layout, world, SEQ, causal, cu, window)[rank]


def full_inputs(kv: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(BATCH, SEQ, h, HEAD_DIM, generator=g, dtype=torch.float64).to(dtype)
            for h in (HEADS, kv, kv, HEADS)]


def _worker(rank: int, world: int):
    group = dist.group.WORLD if world > 1 else None
    out = []
    for i, (alg, layout, causal, kv, mask, dt) in enumerate(configs()):
        tok = tokens_of(layout, world, causal, mask, rank)
        q, k, v, do = (x[:, torch.as_tensor(tok)].clone() for x in full_inputs(kv, DTYPES[dt], i))
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        cu, window = MASKS[mask]
        o = ALGORITHMS[alg](q, k, v, group, causal=causal, token_layout=layout, cu_seqlens=cu, window=window)
        o.backward(do)
        out.append((tok, [t.detach() for t in (o, q.grad, k.grad, v.grad)]))
    return out


def reference(q, k, v, do, causal: bool, cu, window):
    """float64 single-process attention under the boolean mask of (causal, documents, window)."""
    docs = None if cu is None else document_ids(cu, SEQ)
    allowed = torch.from_numpy(attended(np.arange(SEQ), np.arange(SEQ), causal=causal, documents=docs, window=window))
    qt, kt, vt = (x.to(torch.float64).transpose(1, 2).clone().requires_grad_() for x in (q, k, v))
    o = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=allowed, enable_gqa=True)
    o.backward(do.to(torch.float64).transpose(1, 2))
    return [x.transpose(1, 2) for x in (o.detach(), qt.grad, kt.grad, vt.grad)]


@pytest.mark.parametrize("world", [1, 2, 4])
def test_masked_attention_matches_single_process_attention(world):
    results = run_world(_worker, world, timeout=300)
    for i, (alg, layout, causal, kv, mask, dt) in enumerate(configs()):
        full = full_inputs(kv, DTYPES[dt], i)
        want = reference(*full, causal, *MASKS[mask])
        got = assemble(want, [r[i] for r in results], SEQ, f"config {i}")
        for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
            err = float((g - w).abs().max())
            assert err <= TOLERANCE[dt], (world, alg, layout, causal, kv, mask, dt, name, err)


def test_a_window_leaves_a_ring_only_its_neighbours():
    """A sliding window shorter than a rank's block: each rank's queries need only its own and its predecessor's
    keys, so the ring's other rounds are skipped (``round_masks`` None)."""
    from sp_plan.runtime.ring import round_masks

    masks = round_masks("contiguous", 4, 64, 2, True, None, 9)
    assert [m is not None for m in masks] == [True, True, False, False]


def test_a_mask_that_empties_a_chunk_skips_it():
    """Packed documents that stay inside one rank's tokens leave the other chunks fully masked: no kernel runs on
    them (``chunk_masks`` gives None), which is what makes all-gather cheap on short documents."""
    from sp_plan.runtime.allgather import chunk_masks

    masks = chunk_masks("contiguous", 4, 64, 1, True, (0, 16, 32, 48, 64), None)
    assert [m is not None for m in masks] == [False, True, False, False]


def test_bad_masks_name_their_field():
    q = torch.randn(1, 8, 2, 4)
    with pytest.raises(PlanError, match="window"):
        allgather_attention(q, q, q, window=0)
    with pytest.raises(PlanError, match="cu_seqlens"):
        allgather_attention(q, q, q, cu_seqlens=[0, 5, 5, 8])
    with pytest.raises(PlanError, match="holds 8 tokens"):
        allgather_attention(q, q, q, cu_seqlens=[0, 5, 7])


def _ctx_worker(rank: int, world: int):
    from sp_plan.planner import Plan
    from sp_plan.runtime import init

    ctx = init(Plan(algorithm="allgather", degrees={"ring": world}, order=["ring"], token_layout="zigzag"))
    q, k, v, do = (ctx.shard(x, cu_seqlens=DOCS, window=9) for x in full_inputs(2, torch.float64, 7))
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    out = ctx.attention(q, k, v, causal=True, cu_seqlens=DOCS, window=9)
    out.backward(do)
    try:
        init(Plan(algorithm="ulysses", degrees={"ulysses": world}, order=["ulysses"])).attention(q, k, v,
                                                                                               cu_seqlens=DOCS)
        refused = None
    except PlanError as e:
        refused = e.field
    grads = [t.detach() for t in (out, q.grad, k.grad, v.grad)]
    return member_tokens("zigzag", world, SEQ, True, DOCS, 9)[rank], grads, refused


def test_an_allgather_plan_runs_through_ctx_attention_with_its_masks():
    """init(plan) + ctx.shard / ctx.attention(..., cu_seqlens, window) of an allgather plan (zigzag per document) is
    exact; a plan whose algorithm takes no masks yet refuses them by name rather than ignoring them."""
    results = run_world(_ctx_worker, 2, timeout=120)
    want = reference(*full_inputs(2, torch.float64, 7), True, DOCS, 9)
    got = assemble(want, [(t, vals) for t, vals, _ in results], SEQ)
    for g, w in zip(got, want):
        assert float((g - w).abs().max()) <= 1e-10
    assert {r for _, _, r in results} == {"cu_seqlens"}


def test_a_balanced_plan_needs_documents():
    """``balanced`` assigns packed documents by their work: a plan without documents cannot use it, and says so."""
    from sp_plan.planner import Plan
    from sp_plan.planner.model import Workload

    with pytest.raises(PlanError, match="token_layout"):
        Plan(algorithm="allgather", degrees={"ring": 4}, order=["ring"], token_layout="balanced")
    plan = Plan(algorithm="allgather", degrees={"ring": 4}, order=["ring"], token_layout="balanced",
                workload=Workload(seq_len=4096, documents=[100, 900, 3000]))
    assert plan.token_layout == "balanced"
