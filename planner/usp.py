"""Ring, Ulysses and USP (seeds/003) in the planner: one schedule (USP with degree-1 sides), its buffers.

Registers "ring", "ulysses" and "usp" with the registry (planner/algorithms.py); Ulysses' all-to-alls
around the ring rounds (USP Sec. 3), the rounds double-buffered (WallFacer eq. 2).
"""
from __future__ import annotations

from .algorithms import Algorithm, Variant, algorithm_for, register
from .layout import BALANCE_MAX_RING, ring_balance, round_work_runs
from .schedules import Comm, Compute, Shape, Step, a2a_packing, attention_flops, merge_bytes


def ulysses_a2a(c: Shape, backward: bool) -> tuple[list[Comm], list[Comm]]:
    """USP Table 2 SP-Ulysses: 4 all-to-alls before/after attention forward, 4 in backward."""
    if c.ulysses == 1:
        return [], []
    qo = c.b * c.n_local * c.model.q_dim / c.tp * c.e
    kv = c.b * c.n_local * c.kv_exchanged * c.model.head_dim * c.e
    dim = ("ulysses",)
    if not backward:
        return ([Comm("ulysses a2a q,k,v", "all_to_all", dim, qo + 2 * kv)],
                [Comm("ulysses a2a out", "all_to_all", dim, qo)])
    return ([Comm("ulysses a2a dout", "all_to_all", dim, qo)],
            [Comm("ulysses a2a dq,dk,dv", "all_to_all", dim, qo + 2 * kv)])


def ring_steps(c: Shape, backward: bool) -> list[Step]:
    """Ring attention: R rounds of [block | send K,V to the next rank], double-buffered (WallFacer eq. 2).

    Backward (zhuzilin/ring-flash-attention): K, V and their gradient accumulators dK, dV travel
    together; after the last round dK, dV take one more hop home.
    """
    R = c.ring
    blk = attention_flops(c.n_ring, c.n_ring, c.heads_local, c.model.head_dim, c.b)
    mult = 2.5 if backward else 1.0  # FlashAttention backward: 5 block matmuls vs 2
    kv_block = c.b * c.n_ring * c.kv_local * c.model.head_dim * c.e
    send = (4 if backward else 2) * kv_block
    runs = list(round_work_runs(c.token_layout, R, c.work.seq_len, c.work.causal))
    balance = (ring_balance(c.token_layout, R, c.work.seq_len, c.work.causal)  # uneven rounds (Compute.balance)
               if R <= BALANCE_MAX_RING else ())
    tag = "bwd" if backward else "fwd"
    f_last, k_last = runs[-1]
    runs[-1:] = ([(f_last, k_last - 1)] if k_last > 1 else []) + [(f_last, 0)]  # the last round sends nothing
    steps = []
    merge = (Compute(f"ring merge {tag}", 0.0, "memory", nbytes=merge_bytes(c, backward)),) if R > 1 else ()
    i = 0  # the first round of the run
    for f, k in runs:
        b = balance[i:i + max(k, 1)]
        # under a causal mask: the diagonal round, and striped's every round (a shifted diagonal); zigzag's and
        # contiguous' other rounds are dense (half) blocks
        masked = c.work.causal and (i == 0 or c.token_layout == "striped")
        i += max(k, 1)
        comp = (Compute(f"attention {tag}", mult * blk * f, "attention", c.n_ring, fill=f,
                        balance=b if b and min(b) < 1.0 else (), masked=masked),) + merge
        if k:
            steps.append(Step(comp + (Comm(f"ring p2p {tag}", "shift", ("ring",), send),), k, overlap=True))
        else:
            steps.append(Step(comp, 1))
    if backward and R > 1:
        steps.append(Step((Comm("ring p2p dk,dv home", "shift", ("ring",), 2 * kv_block),)))
    return steps


def usp_steps(c: Shape, backward: bool) -> list[Step]:
    """Attention of one layer for ring, ulysses and usp: all-to-alls around ring rounds (USP Sec. 3)."""
    pre, post = ulysses_a2a(c, backward)
    return [Step((a2a_packing(p), p)) for p in pre] + ring_steps(c, backward) + [Step((a2a_packing(p), p)) for p in post]


def usp_buffer_bytes(c: Shape, training: bool) -> float:
    """Transient buffers of ring / ulysses / usp attention for one layer.

    Ring: double buffers for K, V (and in backward for dK, dV in fp32), fp32 out/LSE accumulators.
    Ulysses: the head-sharded copies of q, k, v and the output after the all-to-all.
    """
    m = c.model
    kv_block = c.b * c.n_ring * c.kv_local * m.head_dim * c.e
    q_ring = c.b * c.n_ring * c.heads_local * m.head_dim
    buf = 0.0
    if c.ring > 1:
        buf += 2 * 2 * kv_block + q_ring * 4 + c.b * c.n_ring * c.heads_local * 4
        if training:
            buf += 2 * 2 * kv_block * 2 + q_ring * 4  # dK, dV fp32 double buffers and dQ accumulator
    if c.ulysses > 1:
        buf += (2 * q_ring + 2 * c.b * c.n_ring * c.kv_local * m.head_dim) * c.e
    return buf


def _usp_variants(d, model, work) -> list[Variant]:
    return [Variant(algorithm_for(d.ulysses, d.ring))]


for _name in ("ring", "ulysses", "usp"):
    register(Algorithm(_name, usp_steps, usp_buffer_bytes,
                       variants=_usp_variants if _name == "usp" else (lambda d, model, work: [])))
