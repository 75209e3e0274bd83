"""All-gather K/V context parallelism (Llama 3, arXiv 2407.21783, Sec. 3.3.2) in the planner: schedule, volume,
buffers, variants and checks (runtime/variants/allgather.py runs it).

Forward: the context (``ring``) group all-gathers K and V, exposed; each rank then attends its local queries, in
any token layout, to the K, V their documents and window let them see, in one call. Backward, as
TransformerEngine's AttnFuncWithCPAndKVAllGather: K and V are gathered again (only the local shards are kept for
the backward), the rank computes dQ and a full-length dK, dV in the model's dtype, and a reduce-scatter returns
each rank its shard. With Ulysses inside (ulysses U > 1), its all-to-alls wrap the whole (USP Sec. 3) and the
gather moves the head-sharded K, V. GQA's K, V are gathered unrepeated, so the volume is the sequence's K, V
bytes for the KV heads alone: (P - 1)/P of 2 B S kv d e reaches each rank.

The attention work is the busiest rank's under the mask and the token layout (planner/masks.py), in expectation
over seeded packs of the workload's documents, averaged over the layers' windows (a local:global pattern): the
compute of a layer stack is the sum of its layers', and every layer gathers the same K, V.
"""
from __future__ import annotations

from .algorithms import Algorithm, Variant, register
from .errors import PlanError
from .masks import busiest_rank_pairs, has_mask, layer_windows
from .schedules import Comm, Compute, Shape, Step, a2a_packing
from .usp import ulysses_a2a

CONTEXT = ("ring",)


def gathered_kv_bytes(c: Shape) -> float:
    """K and V of the whole sequence for this rank's KV heads, b sequences: 2 b S kv_local d e (the gather's output,
    and in backward the full-length dK, dV before their reduce-scatter)."""
    return 2.0 * c.b * c.work.seq_len * c.kv_local * c.model.head_dim * c.e


def received_bytes(c: Shape, backward: bool = False) -> float:
    """Bytes each rank receives: the gather's (P - 1)/P of ``gathered_kv_bytes``, and in backward that again for
    the reduce-scatter of dK, dV (a ring collective's n - 1 steps of 1/n, planner/engine.py)."""
    P = c.ring
    share = (P - 1) / P * gathered_kv_bytes(c)
    return 2 * share if backward else share


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


def allgather_steps(c: Shape, backward: bool) -> list[Step]:
    """One layer's attention: [Ulysses all-to-all] all-gather K, V | attention [| reduce-scatter dK, dV]
    [all-to-all], each step exposed (the gather is not chunked to overlap the compute)."""
    tag = "bwd" if backward else "fwd"
    pre, post = ulysses_a2a(c, backward)
    steps = [Step((a2a_packing(p), p)) for p in pre]
    kv = gathered_kv_bytes(c)
    if c.ring > 1:
        steps.append(Step((Comm(f"allgather k,v {tag}", "all_gather", CONTEXT, kv),)))
    steps.append(Step((attention_phase(c, backward),)))
    if backward and c.ring > 1:
        steps.append(Step((Comm("allgather reduce-scatter dk,dv", "reduce_scatter", CONTEXT, kv),)))
    return steps + [Step((a2a_packing(p), p)) for p in post]


def buffer_parts(c: Shape, training: bool) -> dict[str, dict[str, float]]:
    """Transient bytes of one layer's attention, forward and backward: the gathered K, V (and in backward the
    full-length dK, dV beside them), and Ulysses' head-sharded copies of q, k, v and the output."""
    kv = gathered_kv_bytes(c) if c.ring > 1 else 0.0
    ulysses = 0.0
    if c.ulysses > 1:
        d = c.model.head_dim
        ulysses = (2 * c.b * c.n_ring * c.heads_local * d + 2 * c.b * c.n_ring * c.kv_local * d) * c.e
    out = {"forward": {"gathered k,v": kv, "ulysses copies": ulysses}}
    if training:
        out["backward"] = {"gathered k,v": kv, "full-length dk,dv": kv, "ulysses copies": ulysses}
    return out


def allgather_buffer_bytes(c: Shape, training: bool) -> float:
    """Peak transient bytes: the larger of the forward and backward sets (they never coexist)."""
    return max(sum(part.values()) for part in buffer_parts(c, training).values())


def allgather_variants(d, model, work) -> list[Variant]:
    """All-gather on every context group of two or more ranks, alone or with Ulysses inside (ulysses U > 1)."""
    if d.ring < 2:
        return []
    return [Variant("allgather")]


def check_allgather(cand, model, work) -> None:
    """A context group to gather over: ring >= 2 (ring 1 with Ulysses is Ulysses itself)."""
    if cand.ring < 2:
        raise PlanError("degrees.ring", f"allgather gathers K, V over the context (ring) group, got ring {cand.ring}",
                        "set ring to 2 or more (with ring 1, use ulysses)")


ALLGATHER = register(Algorithm("allgather", allgather_steps, allgather_buffer_bytes, variants=allgather_variants,
                               check=check_allgather))
