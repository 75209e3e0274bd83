"""All-gather with its KV heads gathered in chunks (``kv_chunks``): exact against single-device masked attention,
and each chunk's gather is in flight while the previous chunk attends, in forward and in the backward's second
gather."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from exact import assemble, attention_terms, mismatches
from sp_plan.planner.errors import PlanError
from sp_plan.runtime.variants import allgather as ag
from sp_plan.runtime.variants.ring import member_tokens
from harness.worlds import run_world
from test_masked_exact import HEAD_DIM, HEADS, KV_HEADS, Case, inputs, reference

#: (mask, KV heads, chunks): MHA in 4 chunks, GQA in 2, and one chunk
CASES = [("document+window", "MHA", 4), ("causal", "GQA", 2), ("document", "GQA", 1), ("full", "MHA", 2)]


def _case(mask: str, heads: str) -> Case:
    return Case("allgather", 1, 4, "zigzag", mask, heads)


def _run(rank: int, world: int):
    events = []
    gather, attend, attend_bwd = dist.all_gather, ag.attend_chunks, ag.attend_chunks_backward
    dist.all_gather = lambda *a, **kw: events.append("gather") or gather(*a, **kw)
    ag.attend_chunks = lambda *a, **kw: events.append("attend") or attend(*a, **kw)
    ag.attend_chunks_backward = lambda *a, **kw: events.append("attend") or attend_bwd(*a, **kw)
    out = []
    for i, (mask, heads, chunks) in enumerate(CASES):
        case = _case(mask, heads)
        seq, causal, cu, window = case.spec
        tok = member_tokens("zigzag", world, seq, causal, cu, window)[rank]
        q, k, v, do = (x[:, torch.as_tensor(tok)].clone() for x in inputs(case, i))
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        events.clear()
        o = ag.allgather_attention(q, k, v, dist.group.WORLD, causal=causal, token_layout="zigzag", cu_seqlens=cu,
                                   window=window, kv_chunks=chunks)
        order, saved = list(events), [tuple(t.shape) for t in o.grad_fn.saved_tensors]
        events.clear()
        o.backward(do)
        out.append((tok, [t.detach() for t in (o, q.grad, k.grad, v.grad)], (order, list(events)), saved,
                    [tuple(t.shape) for t in (q, k, v, o)]))
    out.append(_in_ring_order(rank, world))
    return out


#: a ring order other than the group's (sorted) one: the gather fills in group order, the reduce-scatter must too
RING_ORDER = (0, 2, 3, 1)


def _in_ring_order(rank: int, world: int):
    """The GQA document+window case over the ring ``RING_ORDER``: this rank holds its ring position's tokens."""
    case = _case("document+window", "GQA")
    seq, causal, cu, window = case.spec
    tok = member_tokens("zigzag", world, seq, causal, cu, window)[RING_ORDER.index(rank)]
    q, k, v, do = (x[:, torch.as_tensor(tok)].clone() for x in inputs(case, len(CASES)))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    o = ag.allgather_attention(q, k, v, dist.group.WORLD, causal=causal, token_layout="zigzag", cu_seqlens=cu,
                               window=window, ranks=RING_ORDER, kv_chunks=2)
    o.backward(do)
    return tok, [t.detach() for t in (o, q.grad, k.grad, v.grad)]


def test_chunked_allgather_is_exact_and_overlaps_each_gather_with_the_previous_attention():
    results = run_world(_run, 4, timeout=120)
    for i, (mask, heads, chunks) in enumerate(CASES):
        case = _case(mask, heads)
        want = reference(*inputs(case, i), *case.spec)
        got = assemble(want, [(r[i][0], r[i][1]) for r in results], case.spec[0], str(case))
        terms = attention_terms(case.spec[0], HEAD_DIM, HEADS // KV_HEADS[heads])
        wrong = mismatches(got, want, ("out", "dq", "dk", "dv"), case.dtype, terms, f"{case} in {chunks} chunks")
        assert not wrong, "\n".join(wrong)
        # K and V of chunk c + 1 are posted before chunk c attends
        want_order = ["gather", "gather"] + ["gather", "gather", "attend"] * (chunks - 1) + ["attend"]
        assert all(r[i][2] == (want_order, want_order) for r in results), (chunks, results[0][i][2])
        # only the local shards are kept for the backward, which gathers K and V again
        assert all(r[i][3][:4] == r[i][4] and len(r[i][3]) == 5 for r in results), results[0][i][3]
    case, i = _case("document+window", "GQA"), len(CASES)
    want = reference(*inputs(case, i), *case.spec)
    got = assemble(want, [r[i] for r in results], case.spec[0], f"{case} in ring order {RING_ORDER}")
    terms = attention_terms(case.spec[0], HEAD_DIM, HEADS // KV_HEADS["GQA"])
    wrong = mismatches(got, want, ("out", "dq", "dk", "dv"), case.dtype, terms, f"{case} in ring order {RING_ORDER}")
    assert not wrong, "\n".join(wrong)


def test_a_ring_order_without_a_group_is_refused():
    q = torch.randn(1, 8, 4, 8)
    with pytest.raises(PlanError, match="ranks: a ring order \\[1, 0\\] without a group"):
        ag.allgather_attention(q, q, q, ranks=(1, 0))


def test_kv_chunks_must_divide_the_kv_heads():
    q, k = torch.randn(1, 8, 8, 4), torch.randn(1, 8, 2, 4)
    with pytest.raises(PlanError, match="kv_chunks"):
        ag.allgather_attention(q, k, k, kv_chunks=3)
    assert ag.head_chunks(8, 2, 2) == [(slice(0, 4), slice(0, 1)), (slice(4, 8), slice(1, 2))]
