"""TokenRing (seeds/001) and TokenRing x Ring across nodes in the planner: schedule, buffers, variants, checks.

Schedule of one layer's attention (runtime/variants/tokenring.py has the algorithm). A ring of P ranks is
cut into N = P / C teams of C consecutive ranks (``degrees["team"]`` = C for ``tokenring_ring``;
plain ``tokenring`` is C = P). Each of the N rounds runs C TokenRing steps on the ``team`` group
(the ``ring`` group for plain TokenRing); in step i every rank computes one block (the busiest
rank's causal fraction) while
- the Q block goes one way (step 0 .. C - 2), and
- the previous step's block out + LSE go the other way to their owner (steps 2 .. C - 1, and
  step 0 of the next round), the last one in a final hop after the compute ends.
Across teams the K, V blocks travel the ``team_ring`` (Ring attention, one hop per round),
overlapped with the round's C steps (its volume spread over them).

Both directions at once: the engine prices each phase of a step on its own and takes the max,
so a "shift" of Q and a "shift_back" of out in one step would never meet on a link. Where Q
and out run side by side they are priced as one "shift_bi" phase of the larger volume, which
loads every link each way at the same time: on a full mesh (HCCS) the two go over different
links and cost one block, on an NVSwitch port or a PCIe uplink both leave the device on the
same link direction and cost two. Steps with only Q (shift_back) or only out (shift) keep
their one-way pattern.

Backward: (Q, dO, O, LSE) travel as Q did, dQ partials (fp32) as out did; dK, dV stay with their
K, V (local inside a team); across teams dK, dV follow K, V one round behind, the last hop home
after the compute. Volumes per rank in bytes, e = the model's element size, accumulators fp32.
"""
from __future__ import annotations

from functools import lru_cache
from math import isqrt

from .algorithms import Algorithm, Variant, register
from .errors import PlanError
from .layout import BALANCE_MAX_RING, ring_balance, tokenring_step_work
from .masks import has_mask, refuse_masks
from .schedules import Comm, Compute, Shape, Step, attention_flops, merge_bytes


def _divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending, from the pairs (d, n / d) with d up to sqrt(n) (rings of 65,536 ranks)."""
    small = [d for d in range(1, isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def _volumes(c: Shape, backward: bool) -> tuple[float, float, float, float]:
    """(Q side, partial side, K, V across teams, dK, dV across teams) bytes per rank per step."""
    m, e = c.model, c.e
    n, h, d, b = c.n_ring, c.heads_local, m.head_dim, c.b
    acc = c.acc
    blk = b * n * h * d
    lse = b * h * n * 4
    kv = b * n * c.kv_local * d
    if backward:
        return 3 * blk * e + lse, blk * acc, 2 * kv * e, 2 * kv * acc
    return blk * e, blk * e + lse, 2 * kv * e, 0.0


def segments(n: int, cuts: tuple[int, ...]) -> list[tuple[int, int]]:
    """(first index, count) of the runs of 0..n-1 between ``cuts``: the classes of rounds or steps whose
    phases are alike, so a schedule of n items is built from a few representatives."""
    bounds = sorted({0, n} | {x for x in cuts if 0 < x < n})
    return [(lo, hi - lo) for lo, hi in zip(bounds, bounds[1:])]


def _step_key(i: int, j: int, C: int, N: int) -> tuple[bool, bool, bool, bool, bool]:
    """What step i of round j does (``step_classes``' key): the first step, Q sent, partial sent, K, V across
    teams, dK, dV across teams; constant over each of ``segments``' runs of i and j."""
    return i == j == 0, i < C - 1, C > 1 and (i >= 2 or (i == 0 and j >= 1)), j < N - 1, j >= 2


@lru_cache(maxsize=4096)
def step_classes(ring: int, team: int) -> tuple[tuple[bool, bool, bool, bool, bool, int], ...]:
    """TokenRing's N x C steps (seeds/001 Alg. 1, Sec. 3.3.3) grouped by what they do: (the first step, Q
    sent, partial sent, K, V across teams, dK, dV across teams, how many such steps), from a few
    representatives of the rounds j (0, 1, 2..N-2, N-1) and steps i (0, 1, 2..C-2, C-1)."""
    C, N = team, ring // team
    classes: dict[tuple, int] = {}
    for j, nj in segments(N, (1, 2, N - 1)):
        for i, ni in segments(C, (1, 2, C - 1)):
            key = _step_key(i, j, C, N)
            classes[key] = classes.get(key, 0) + nj * ni
    return tuple((*k, n) for k, n in classes.items())


def class_balance(token_layout: str, ring: int, team: int, seq_len: int, causal: bool) -> dict[tuple, tuple]:
    """Pure TokenRing (team = ring, one round): ``step_classes``' key -> the per-step balance of its steps
    (``layout.ring_balance`` with the Q travelling: step i pairs rank r's K, V with rank r - i's Q), for rings of
    up to BALANCE_MAX_RING; else {} (even: Compute.balance is read only where ranks share cores)."""
    C, N = team, ring // team
    if N != 1 or ring > BALANCE_MAX_RING:
        return {}
    bal = ring_balance(token_layout, ring, seq_len, causal, q_travels=True)
    out: dict[tuple, tuple] = {}
    for i, ni in segments(C, (1, 2, C - 1)):  # step_classes' keys at j = 0
        key = _step_key(i, 0, C, N)
        out[key] = out.get(key, ()) + bal[i:i + ni]
    return out


def tokenring_steps(c: Shape, backward: bool) -> list[Step]:
    """TokenRing (seeds/001 Alg. 1) and TokenRing x Ring (Sec. 3.3.3): Q one way, out + LSE the other, per step.

    Round j of N and step i of C fall into a few classes (j = 0, 1, 2..N-2, N-1; i = 0, 1, 2..C-2, C-1) with
    the same phases, so the schedule has O(1) steps for any ring (``segments``); equal steps are summed."""
    P = c.ring
    C = c.team if c.algorithm == "tokenring_ring" else P
    N = P // C
    inner = ("team",) if N > 1 else ("ring",)
    tag = "bwd" if backward else "fwd"
    mult = 2.5 if backward else 1.0  # FlashAttention backward: 5 block matmuls vs 2
    blk = attention_flops(c.n_ring, c.n_ring, c.heads_local, c.model.head_dim, c.b)
    qv, pv, kv, dkv = _volumes(c, backward)
    work = tokenring_step_work(c.token_layout, P, c.work.seq_len, c.work.causal)
    balance = class_balance(c.token_layout, P, C, c.work.seq_len, c.work.causal)
    steps = []
    for first, sends_q, sends_part, kv_across, dkv_across, n in step_classes(P, C):
        outer = kv * kv_across + dkv * dkv_across
        f = work[0 if first else 1]
        b = balance.get((first, sends_q, sends_part, kv_across, dkv_across), ())
        phases: list = [Compute(f"attention {tag}", mult * blk * f, "attention", c.n_ring, fill=f,
                                balance=b if b and min(b) < 1.0 else (),  # masked: the diagonal, striped's all
                                masked=c.work.causal and (first or c.token_layout == "striped"),
                                trimmed=True)]  # only the Q rows a later holder uses travel (runtime/variants/tokenring.py)
        if P > 1:  # the owner folds a partial out + LSE into its accumulator (or dQ into its own)
            phases.append(Compute(f"tokenring merge {tag}", 0.0, "memory", nbytes=merge_bytes(c, backward)))
        if sends_q and sends_part:
            phases.append(Comm(f"tokenring q <-> out,lse {tag}", "shift_bi", inner, max(qv, pv)))
        elif sends_q:
            phases.append(Comm(f"tokenring q {tag}", "shift_back", inner, qv))
        elif sends_part:
            phases.append(Comm(f"tokenring out,lse {tag}", "shift", inner, pv))
        if outer:
            phases.append(Comm(f"ring k,v across teams {tag}", "shift", ("team_ring",), outer / C))
        steps.append(Step(tuple(phases), n, overlap=len(phases) > 1))
    if C > 1:
        steps.append(Step((Comm(f"tokenring out,lse {tag}", "shift", inner, pv),)))
    if backward and N > 1:
        steps.append(Step((Comm(f"ring k,v across teams {tag}", "shift", ("team_ring",), dkv),)))
    return steps


def tokenring_buffers(c: Shape, training: bool) -> float:
    """Transient bytes: Q and partial double buffers, fp32 out/LSE accumulators; training adds the (Q, dO,
    O, LSE) and dQ buffers and dQ, dK, dV accumulators; the hybrid adds Ring's K, V (and dK, dV) buffers."""
    qv, pv, kv, _ = _volumes(c, False)
    bq, bp, _, dkv = _volumes(c, True)
    m = c.model
    acc = c.b * c.n_ring * c.heads_local * (m.head_dim + 1) * 4
    buf = 2 * qv + 2 * pv + acc
    if training:
        buf += 2 * bq + 2 * bp + bp + dkv
    if c.algorithm == "tokenring_ring" and c.ring // max(c.team, 1) > 1:
        buf += 2 * kv + (2 * dkv if training else 0.0)
    return buf


def _variants(d, model, work) -> list[Variant]:
    """TokenRing on a ring of two or more without Ulysses, documents or a window."""
    if d.ring < 2 or d.ulysses != 1 or has_mask(work):
        return []
    return [Variant("tokenring")]


def _hybrid_variants(d, model, work) -> list[Variant]:
    """TokenRing x Ring: every proper team size of a ring of four or more, without Ulysses, documents or a window."""
    if d.ring < 4 or d.ulysses != 1 or has_mask(work):
        return []
    return [Variant("tokenring_ring", team=t) for t in _divisors(d.ring) if 1 < t < d.ring]


def _check(cand, model, work) -> None:
    """No documents or window, ulysses 1, and for the hybrid a proper team size of the ring."""
    refuse_masks(cand.algorithm, work)
    if cand.ulysses != 1:
        raise PlanError("degrees.ulysses", f"{cand.algorithm} runs on the ring alone, got ulysses {cand.ulysses}",
                        "set ulysses to 1 (or use usp for ulysses x ring)")
    if cand.algorithm == "tokenring_ring":
        C, P = cand.team, cand.ring
        if P < 4:
            raise PlanError("degrees.ring", f"tokenring_ring splits the ring into teams of 2 or more, got ring {P}",
                            "set ring to 4 or more, or use algorithm tokenring")
        if C < 2 or P % C or C >= P:
            raise PlanError("degrees.team", f"team {C} must divide the ring {P} and lie between 2 and {P // 2}",
                            "set team to the ranks per node of the ring (a proper divisor of ring), "
                            "or use algorithm tokenring")


register(Algorithm("tokenring", tokenring_steps, tokenring_buffers, variants=_variants, check=_check))
register(Algorithm("tokenring_ring", tokenring_steps, tokenring_buffers, variants=_hybrid_variants, check=_check))
