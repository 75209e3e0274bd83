"""WallFacer (Liu et al. 2024) as a schedule: teams of C inside a ring of P, P/C^2 rounds on sub-rings.

Forward (Algorithm 1): all-gather Q, K, V in the team; Algorithm 2 sends the team's K, V to seed
the sub-rings; P/C^2 double-buffered rounds of [team block | send K, V to the next sub-ring rank];
the partial outputs combine by their LSE (all-gather of the LSE, reduce-scatter of the scaled
outputs). Backward (Sec. 3.2.1): all-gather Q, K, V, O, dO in the team; K, V take Algorithm 2's
places again and stay; the Q bundle (Q, O, dO, LSE) and its dQ go round the sub-ring, dQ takes a
final hop home; dK, dV return to their team (Algorithm 2 reversed); reduce-scatter dQ, dK, dV.

Volumes follow the paper's count (eqs. 3-4): tensors in the model's dtype; the team block is
C N/P tokens. Algorithm 2's placement is a permutation of the ring's ranks; it is priced as an
all-to-all over the ring with the same bytes per rank (the same NIC load when, as here, the
permutation spreads evenly over the nodes). The sub-ring and team phases use the pseudo-dimensions
("sub_ring",) and ("team",) that ``estimate.Orders`` places inside the ring by the placement.
"""
from __future__ import annotations

from math import isqrt

from .algorithms import Algorithm, Variant, register
from .errors import PlanError
from .layout import PLACEMENTS, check_team, team_group_size, wallfacer_round_runs
from .masks import has_mask, refuse_masks
from .schedules import Comm, Compute, Shape, Step, attention_flops, merge_bytes

TEAM, SUB_RING, RING = ("team",), ("sub_ring",), ("ring",)


def sizes(c: Shape) -> dict[str, float]:
    """Bytes of one team's gathered Q (and O, dO), K (or V) and fp32 LSE, and the team block length C N/P."""
    d = c.model.head_dim
    n_team = c.team * c.n_ring
    return {"n_team": n_team,
            "q": c.b * n_team * c.heads_local * d * c.e,
            "kv": c.b * n_team * c.kv_local * d * c.e,
            "lse": c.b * n_team * c.heads_local * 4.0}


def _rounds(c: Shape, backward: bool) -> list[tuple[float, int]]:
    """Per-round block fraction (the busiest rank's, from the layout) run-length encoded over P/C^2 rounds."""
    return list(wallfacer_round_runs(c.token_layout, c.ring, c.team, c.placement, c.work.seq_len, c.work.causal,
                                     backward))


def wallfacer_steps(c: Shape, backward: bool) -> list[Step]:
    """One layer's WallFacer attention, forward (Algorithm 1, eqs. 3-4) or backward (Sec. 3.2.1)."""
    C, s = c.team, sizes(c)
    q, kv, lse = s["q"], s["kv"], s["lse"]
    g = c.acc / c.e  # the gradient accumulators (and the forward's partial out) travel as the runtime keeps them
    blk = attention_flops(s["n_team"], s["n_team"], c.heads_local, c.model.head_dim, c.b)
    tag = "bwd" if backward else "fwd"
    mult = 2.5 if backward else 1.0  # FlashAttention backward: 5 block matmuls vs 2
    # per overlapped round: forward K, V to the next sub-ring rank; backward the Q bundle ahead, dQ behind
    send = q * 3 + lse + q * g if backward else 2 * kv
    steps: list[Step] = []
    if C > 1:
        gathered = 3 * q + 2 * kv if backward else q + 2 * kv
        name = "wallfacer all-gather q,k,v,out,dout" if backward else "wallfacer all-gather q,k,v"
        steps.append(Step((Comm(name, "all_gather", TEAM, gathered),)))
        steps.append(Step((Comm(f"wallfacer kv placement {tag}", "all_to_all", RING, 2 * kv),)))  # Algorithm 2
    runs = _rounds(c, backward)
    f_last, k_last = runs[-1]
    runs[-1:] = ([(f_last, k_last - 1)] if k_last > 1 else []) + [(f_last, 0)]  # the last round sends nothing
    merge = ((Compute(f"wallfacer merge {tag}", 0.0, "memory", nbytes=C * merge_bytes(c, backward)),)  # team block
             if c.ring > 1 else ())
    # causal: the runtime reduces a team block as its C^2 ring blocks (runtime.variants.wallfacer.round_masks), one kernel
    # call each, n_team / C long; full attention: the whole team block in one call
    pieces = C * C if c.work.causal else 1
    for f, k in runs:
        comp = (Compute(f"attention {tag}", mult * blk * f, "attention", s["n_team"] / (C if pieces > 1 else 1),
                        fill=f, calls=pieces),) + merge
        if k:
            steps.append(Step(comp + (Comm(f"wallfacer sub-ring p2p {tag}", "shift", SUB_RING, send),), k,
                              overlap=True))
        else:
            steps.append(Step(comp))
    if backward:
        if team_group_size(c.ring, C) > 1:
            steps.append(Step((Comm("wallfacer sub-ring dq home", "shift", SUB_RING, q * g),)))
        if C > 1:
            steps.append(Step((Comm("wallfacer dk,dv return", "all_to_all", RING, 2 * kv * g),)))  # Alg. 2 reversed
            grads = (q + 2 * kv) * g
            steps.append(Step((Comm("wallfacer reduce-scatter dq,dk,dv", "reduce_scatter", TEAM, grads),)))
    elif C > 1:
        steps.append(Step((Comm("wallfacer all-gather lse", "all_gather", TEAM, lse),)))
        steps.append(Step((Comm("wallfacer reduce-scatter out", "reduce_scatter", TEAM, q * g),)))
    return steps


def buffer_parts(c: Shape, training: bool) -> dict[str, dict[str, float]]:
    """Transient bytes of one layer's attention, forward and backward; eq. 7's C copies of Q, K, V.

    The all-gather's output holds the rank's own shard, so the copies add (C-1)/C of the team's
    Q, K, V beyond the layer's activations: 3(C-1)A for MHA, A = B N H / P (eq. 5).
    """
    C, s = c.team, sizes(c)
    q, kv, lse = s["q"], s["kv"], s["lse"]
    acc = c.acc / c.e  # the accumulators' bytes per element over the input's
    extra = (C - 1) / C
    fwd = {"q,k,v team copies": extra * (q + 2 * kv),
           "k,v sub-ring double buffers": 2 * 2 * kv,
           "out, lse accumulators": q * acc + lse + (C * lse if C > 1 else 0.0)}
    out = {"forward": fwd}
    if training:
        out["backward"] = {"q,k,v,out,dout team copies": extra * (3 * q + 2 * kv),
                           "k,v placement": 2 * kv,
                           "q bundle double buffer": 3 * q + lse,
                           "dq accumulators": 2 * q * acc,
                           "dk, dv accumulators": 2 * kv * acc + (2 * kv * acc if C > 1 else 0.0)}
    return out


def wallfacer_buffer_bytes(c: Shape, training: bool) -> float:
    """Peak transient bytes: the larger of the forward and backward sets (they never coexist)."""
    return max(sum(part.values()) for part in buffer_parts(c, training).values())


def wallfacer_variants(d, model, work) -> list[Variant]:
    """WallFacer eq. 8's space: every C >= 2 with C^2 | P (C = 1 is Ring), both placements; no Ulysses, no masks."""
    if d.ulysses != 1 or d.ring < 4 or has_mask(work):
        return []
    return [Variant("wallfacer", team=C, placement=pl)
            for C in range(2, isqrt(d.ring) + 1) if d.ring % (C * C) == 0 for pl in PLACEMENTS]


def check_wallfacer(cand, model, work) -> None:
    """WallFacer's constraints: no documents or window, ulysses 1, 1 <= C with C^2 | P, a placement of eq. 8."""
    refuse_masks(cand.algorithm, work)
    if cand.ulysses != 1:
        raise PlanError("degrees.ulysses", f"wallfacer runs on a ring, got ulysses {cand.ulysses}",
                        "set ulysses 1 (WallFacer x Ulysses is future work in the paper)")
    check_team(cand.ring, cand.team, cand.placement)


register(Algorithm("wallfacer", wallfacer_steps, wallfacer_buffer_bytes, variants=wallfacer_variants,
                   check=check_wallfacer))
