"""All-gather K/V context parallelism (Llama 3, arXiv 2407.21783, Sec. 3.3.2) in the planner: schedule, volume,
buffers, variants and checks (runtime/variants/allgather.py runs it).

Forward: the context (``ring``) group all-gathers K and V, exposed; each rank then attends its local queries, in
any token layout, to the K, V their documents and window let them see, in one call. With ``kv_chunks`` n over 1 (a
plan field) the KV heads go in n chunks, each chunk's gather beside the previous chunk's attention
(``chunked_gather``); ``best_kv_chunks`` picks the n that prices least. Backward, as TransformerEngine's
AttnFuncWithCPAndKVAllGather: K and V are gathered again (only the local shards are kept for the backward), the
rank computes dQ and a full-length dK, dV (in the runtime's accumulators, ``Shape.acc``: fp32 where
TransformerEngine keeps the model's dtype), and a reduce-scatter returns each rank its shard. With Ulysses inside
(ulysses U > 1), its all-to-alls wrap the whole (USP Sec. 3) and the gather moves the head-sharded K, V. GQA's K, V
are gathered unrepeated, so the volume is the sequence's K, V bytes for the KV heads alone: (P - 1)/P of 2 B S kv d
e reaches each rank.

The attention work is the busiest rank's under the mask and the token layout (planner/masks/), in expectation
over seeded packs of the workload's documents, averaged over the layers' windows (a local:global pattern): the
compute of a layer stack is the sum of its layers', and every layer gathers the same K, V.
"""
from __future__ import annotations

from dataclasses import replace

from .algorithms import Algorithm, Variant, register
from .errors import PlanError
from .masks import busiest_rank_pairs, has_mask, layer_windows
from .plan import local_kv_heads
from .schedules import Comm, Compute, Shape, Step, a2a_packing
from .usp import ulysses_a2a

CONTEXT = ("ring",)


def gathered_kv_bytes(c: Shape) -> float:
    """K and V of the whole sequence for this rank's KV heads, b sequences: 2 b S kv_local d e (the gather's
    output)."""
    return 2.0 * c.b * c.work.seq_len * c.kv_local * c.model.head_dim * c.e


def full_grad_bytes(c: Shape) -> float:
    """The full-length dK, dV before their reduce-scatter: ``gathered_kv_bytes`` in the accumulators' dtype."""
    return gathered_kv_bytes(c) * c.acc / c.e


def received_bytes(c: Shape, backward: bool = False) -> float:
    """Bytes each rank receives: the gather's (P - 1)/P of ``gathered_kv_bytes``, and in backward (P - 1)/P of
    ``full_grad_bytes`` for the reduce-scatter of dK, dV (a ring collective's n - 1 steps of 1/n,
    planner/engine.py)."""
    share = (c.ring - 1) / c.ring
    gather = share * gathered_kv_bytes(c)
    return gather + share * full_grad_bytes(c) if backward else gather


def rank_pairs(c: Shape) -> tuple[float, float]:
    """(busiest, mean) score entries of a context rank per sequence (its local queries against the keys they see),
    in expectation over the workload's packs, averaged over the layers' windows (masks.layer_windows)."""
    mix = layer_windows(c.work, c.model.layers)
    total = sum(n for _, n in mix)
    work = [(n, busiest_rank_pairs(c.work, c.token_layout, c.ring, w)) for w, n in mix]
    busiest = sum(n * r.busiest for n, r in work) / total
    mean = sum(n * r.pairs for n, r in work) / total / c.ring
    return busiest, mean


def busiest_pairs(c: Shape) -> float:
    """Score entries of the busiest context rank per sequence (``rank_pairs``)."""
    return rank_pairs(c)[0]


def attention_phase(c: Shape, backward: bool) -> Compute:
    """One call per rank of its local queries against the gathered K, V: 4 b pairs h d FLOPs forward (QK^T and PV),
    2.5x that backward (FlashAttention backward: 5 block matmuls vs 2). Its efficiency reads the curve at the square
    block of as many pairs (``Compute.fill`` of the whole sequence's S^2), a block length ``attention_blocks``
    bounds; under a causal or document mask, the masked kernel's curve (``Compute.masked``), as ring and Ulysses
    read it. Ranks that share cores work through their total, not the busiest's (``Compute.balance``: the mean
    rank's entries over the busiest's, as ``layout.ring_balance`` pools a ring's rounds)."""
    S = c.work.seq_len
    pairs, mean = rank_pairs(c)
    flops = (2.5 if backward else 1.0) * 4.0 * c.b * pairs * c.heads_local * c.model.head_dim
    ratio = mean / pairs if pairs else 1.0
    return Compute(f"attention {'bwd' if backward else 'fwd'}", flops, "attention", float(S), fill=pairs / (S * S),
                   balance=(ratio,) if ratio < 1.0 else (), masked=c.work.causal or has_mask(c.work))


def allgather_steps(c: Shape, backward: bool, chunks: int = 1) -> list[Step]:
    """One layer's attention: [Ulysses all-to-all] all-gather K, V | attention [| reduce-scatter dK, dV]
    [all-to-all]; with ``chunks`` (``kv_chunks``) over 1, the gather and attention as ``chunked_gather``'s pipeline,
    else each step exposed. The reduce-scatter stays exposed: the gathers of the next chunks hold the links."""
    tag = "bwd" if backward else "fwd"
    pre, post = ulysses_a2a(c, backward)
    steps = [Step((a2a_packing(p), p)) for p in pre]
    kv = gathered_kv_bytes(c)
    attend = attention_phase(c, backward)
    if c.ring > 1 and chunks > 1:
        steps += chunked_gather(Comm(f"allgather k,v {tag}", "all_gather", CONTEXT, kv), attend, chunks)
    else:
        if c.ring > 1:
            steps.append(Step((Comm(f"allgather k,v {tag}", "all_gather", CONTEXT, kv),)))
        steps.append(Step((attend,)))
    if backward and c.ring > 1:
        steps.append(Step((Comm("allgather reduce-scatter dk,dv", "reduce_scatter", CONTEXT, full_grad_bytes(c)),)))
    return steps + [Step((a2a_packing(p), p)) for p in post]


def chunked_gather(gather: Comm, attend: Compute, chunks: int) -> list[Step]:
    """The gather and attention in ``chunks`` chunks of KV heads (runtime/variants/allgather.allgather_forward):
    chunk 1's gather exposed, then chunk i + 1's gather beside chunk i's attention, then the last chunk's attention.
    Exposed: g + (chunks - 1) max(g, a) + a of per-chunk gather g and attention a; each chunk is its own
    collective and kernel call, so each pays the link's per-step latency and ``Params.round_overhead_s``."""
    g = gather._replace(nbytes=gather.nbytes / chunks)
    a = attend._replace(flops=attend.flops / chunks)
    return [Step((g,)), Step((g, a), chunks - 1, overlap=True), Step((a,))]


#: the most chunks the planner prices (ring-flash-attention's llama3 variant strides a few heads at a time): more
#: chunks only add a gather and an attention call each once the first chunk's gather is short
MAX_KV_CHUNKS = 8


def kv_chunk_options(c: Shape) -> list[int]:
    """The chunk counts ``best_kv_chunks`` prices: the divisors of the KV heads a rank attends, up to MAX_KV_CHUNKS
    (1 alone without a context group to gather over)."""
    if c.ring < 2:
        return [1]
    local = local_kv_heads(c.model.heads, c.model.kv_heads, c.tp, c.ulysses)
    return [n for n in range(1, min(local, MAX_KV_CHUNKS) + 1) if local % n == 0]


def best_kv_chunks(est, cand) -> int:
    """The ``kv_chunk_options`` under which ``est`` prices ``cand`` (an all-gather Candidate) fastest, the fewest
    chunks on a tie: a step's layers each gather, so the chunk count that hides the most of the gather without
    paying more in chunks' latencies and kernel calls."""
    options = kv_chunk_options(est.shape(cand))
    return min(options, key=lambda n: (est.evaluate(replace(cand, kv_chunks=n)).step_time_s, n))


def buffer_parts(c: Shape, training: bool, chunks: int = 1) -> dict[str, dict[str, float]]:
    """Transient bytes of one layer's attention, forward and backward: the gathered K, V (in ``chunks`` chunks, two
    at a time: the one attending and the next in flight; and in backward the full-length dK, dV beside them, all
    chunks' until their reduce-scatter), and Ulysses' head-sharded copies of q, k, v and the output."""
    kv = gathered_kv_bytes(c) if c.ring > 1 else 0.0
    held = kv * min(2 / chunks, 1.0)
    ulysses = 0.0
    if c.ulysses > 1:
        d = c.model.head_dim
        ulysses = (2 * c.b * c.n_ring * c.heads_local * d + 2 * c.b * c.n_ring * c.kv_local * d) * c.e
    out = {"forward": {"gathered k,v": held, "ulysses copies": ulysses}}
    if training:
        grads = full_grad_bytes(c) if c.ring > 1 else 0.0
        out["backward"] = {"gathered k,v": held, "full-length dk,dv": grads, "ulysses copies": ulysses}
    return out


def allgather_buffer_bytes(c: Shape, training: bool, chunks: int = 1) -> float:
    """Peak transient bytes: the larger of the forward and backward sets (they never coexist)."""
    return max(sum(part.values()) for part in buffer_parts(c, training, chunks).values())


def allgather_variants(d, model, work) -> list[Variant]:
    """All-gather on every context group of two or more ranks, alone or with Ulysses inside (ulysses U > 1)."""
    if d.ring < 2:
        return []
    return [Variant("allgather")]


def allgather_schedule(c: Shape, backward: bool) -> list[Step]:
    """``allgather_steps`` in the shape's ``kv_chunks``."""
    return allgather_steps(c, backward, c.kv_chunks)


def allgather_buffers(c: Shape, training: bool) -> float:
    """``allgather_buffer_bytes`` in the shape's ``kv_chunks``."""
    return allgather_buffer_bytes(c, training, c.kv_chunks)


def check_allgather(cand, model, work) -> None:
    """A context group to gather over: ring >= 2 (ring 1 with Ulysses is Ulysses itself); ``kv_chunks`` dividing
    the KV heads a rank attends (where a model is given: a plan file may name none)."""
    if cand.ring < 2:
        raise PlanError("degrees.ring", f"allgather gathers K, V over the context (ring) group, got ring {cand.ring}",
                        "set ring to 2 or more (with ring 1, use ulysses)")
    if model is None:
        return
    local = local_kv_heads(model.heads, model.kv_heads, cand.tp, cand.ulysses)
    if cand.kv_chunks < 1 or local % cand.kv_chunks:
        raise PlanError("kv_chunks", f"{cand.kv_chunks} chunks do not split the {local} KV heads a rank attends "
                        f"({model.kv_heads} KV heads over tp {cand.tp} x ulysses {cand.ulysses})",
                        f"use one of {[k for k in range(1, local + 1) if local % k == 0]}")


ALLGATHER = register(Algorithm("allgather", allgather_schedule, allgather_buffers, variants=allgather_variants,
                               check=check_allgather))
