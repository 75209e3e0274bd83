"""TP with sequence parallelism on sequence ranks that hold unequal token counts (packed documents): each sequence
rank's tokens are padded to a multiple of tp, the attention trims the padding, and the stack's output and every
gradient equal one process's under the same document mask."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from sp_plan.planner import ModelSpec, Plan, Workload
from sp_plan.profiles.tune import run_candidate
from sp_plan.profiles.tune.parallel import IGNORE, parallelize, replica_mesh, sequence_attend, tokens_of
from sp_plan.profiles.tune.stack import build_stack, random_batch
from sp_plan.runtime import init
from sp_plan.runtime.kernels import attended, document_ids
from harness.worlds import run_world

MODEL = ModelSpec(name="tiny", layers=4, hidden=64, heads=4, kv_heads=2, vocab=128, dtype="fp32", gated_mlp=True)
SEQ = 201
#: documents shorter than a rank's chunk, one spanning ranks, and odd lengths: the ranks' token counts differ
CU = (0, 7, 61, 64, 151, 171, 201)
PACKED = Workload(seq_len=SEQ, documents=[b - a for a, b in zip(CU, CU[1:])])
PLANS = [Plan(algorithm="allgather", degrees={"tp": 2, "ring": 2}, token_layout="balanced", workload=PACKED),
         Plan(algorithm="ring", degrees={"tp": 2, "ring": 2}, token_layout="zigzag"),
         Plan(algorithm="ulysses", degrees={"tp": 2, "ulysses": 2})]


def _masked(q, k, v):
    """One process's attention under the documents' causal mask."""
    allowed = torch.from_numpy(attended(np.arange(SEQ), np.arange(SEQ), causal=True, documents=document_ids(CU, SEQ),
                                        window=None))
    o = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), attn_mask=allowed, enable_gqa=True)
    return o.transpose(1, 2)


def _grads_vs_single(rank, world, plans):
    """Per plan: (sequence ranks' token counts, the largest relative gradient error, the loss's relative error)."""
    x, y = random_batch(MODEL, 1, SEQ, seed=7)
    ref = build_stack(MODEL, 2, seed=3)
    want_loss = F.cross_entropy(ref(x, _masked).flatten(0, 1), y.flatten())
    want_loss.backward()
    out = []
    for plan in plans:
        ctx = init(plan)
        mesh = replica_mesh(plan, "cpu")
        par = parallelize(build_stack(MODEL, 2, seed=3), plan, mesh)
        xs, ys = (ctx.shard(t, dim=1, cu_seqlens=CU) for t in (x, y))
        attend = sequence_attend(lambda q, k, v: ctx.attention(q, k, v, causal=True, cu_seqlens=CU), xs.shape[1])
        logits = par.module(par.shard_tokens(xs), attend)
        # every rank's share of the one process's mean, times the replicas whose gradients the sync averages
        total = F.cross_entropy(logits.flatten(0, 1), par.shard_tokens(ys, fill=IGNORE).flatten(), reduction="sum")
        (total / SEQ * mesh["dp_sp"].size()).backward()
        par.sync_grads()
        loss = total.detach().clone()
        dist.all_reduce(loss)
        errs = []
        for name, p in par.module.named_parameters():
            g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad.clone()
            if not hasattr(p.grad, "full_tensor"):  # replicated embedding, final norm, head: a TP rank's share each
                dist.all_reduce(g, group=mesh["tp"].get_group())
            want = dict(ref.named_parameters())[name].grad
            errs.append(((g - want).abs().max() / want.abs().max()).item())
        counts = [0] * world
        counts[rank] = xs.shape[1]
        dist.all_reduce(t := torch.tensor(counts))
        out.append((t.tolist(), max(errs), abs(loss.item() / SEQ - want_loss.item()) / want_loss.item()))
    return out


@pytest.mark.multiprocess
def test_tp_on_unequal_sequence_shards_equals_one_process():
    res = run_world(_grads_vs_single, 4, PLANS, timeout=120)
    for i, plan in enumerate(PLANS):
        counts, err, loss_err = res[0][i]
        assert len(set(counts)) > 1 and any(c % 2 for c in counts), (plan.summary(), counts)  # unequal and odd
        assert all(r[i][1] < 1e-5 and r[i][2] < 1e-6 for r in res), (plan.summary(), [r[i] for r in res])


def test_tokens_of_pads_to_a_multiple_of_tp_and_attention_trims_it():
    t = torch.arange(7).view(1, 7)
    shards = [tokens_of(r, 3)(t, fill=-1) for r in range(3)]
    assert [s.tolist() for s in shards] == [[[0, 1, 2]], [[3, 4, 5]], [[6, -1, -1]]]
    assert tokens_of(0, 1)(t) is t
    seen = []
    attend = sequence_attend(lambda q, k, v: seen.append(q.shape[1]) or q * 2, 7)
    q = torch.ones(1, 9, 2, 4)
    out = attend(q, q, q)
    assert seen == [7] and out.shape == q.shape
    assert out[:, :7].eq(2).all() and out[:, 7:].eq(0).all()


def _packed_candidates(rank, world, plans):
    return [run_candidate(p.model_copy(update={"workload": PACKED}), MODEL, PACKED, iters=1) for p in plans]


@pytest.mark.multiprocess
def test_tune_measures_tp_candidates_on_packed_batches():
    res = run_world(_packed_candidates, 4, PLANS[:2], timeout=120)
    assert all(r == res[0] for r in res)
    for c, plan in zip(res[0], PLANS):
        assert c.status == "ok" and c.measured_s > 0, (plan.summary(), c.reason)
        assert "sequence parallelism" in c.detail["tp"] and c.detail["attention"]["measured_s"] > 0
