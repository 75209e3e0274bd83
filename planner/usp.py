"""Ring, Ulysses and USP (seeds/003) in the planner: one schedule (USP with degree-1 sides), its buffers.

Registers "ring", "ulysses" and "usp" with the registry (planner/algorithms.py); Ulysses' all-to-alls
around the ring rounds (USP Sec. 3), the rounds double-buffered (WallFacer eq. 2).
"""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from .algorithms import Algorithm, Variant, algorithm_for, register
from .layout import BALANCE_MAX_RING, ring_balance, round_work_runs
from .masks import has_mask, layer_windows, round_arrays
from .model import Workload
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
    together, the accumulators as the runtime keeps them (``Shape.acc``: fp32 for sp-plan's and yunchang's);
    after the last round dK, dV take one more hop home. With documents or a window the rounds follow the mask
    (``masked_ring_steps``).
    """
    if has_mask(c.work):
        return masked_ring_steps(c, backward)
    R = c.ring
    blk = attention_flops(c.n_ring, c.n_ring, c.heads_local, c.model.head_dim, c.b)
    mult = 2.5 if backward else 1.0  # FlashAttention backward: 5 block matmuls vs 2
    kv = c.b * c.n_ring * c.kv_local * c.model.head_dim  # elements of one K (or V) block
    send = 2 * kv * c.e + (2 * kv * c.acc if backward else 0.0)
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
        steps.append(Step((Comm("ring p2p dk,dv home", "shift", ("ring",), 2 * kv * c.acc),)))
    return steps


class MaskedRounds(NamedTuple):
    """Per ring round, over the layers' windows weighted by their layer counts: the busiest rank's score entries per
    sequence, the ranks' mean, and the share of layers whose K, V travel on to the next round ((P,) read-only float64
    arrays; ``busiest``, ``mean`` and ``sends`` give them as tuples of floats)."""

    busiest_rounds: np.ndarray
    mean_rounds: np.ndarray
    sent_rounds: np.ndarray
    pooled: float = 1.0  # the ranks' mean over the busiest, summed over rounds (shared cores: layout.ring_balance)
    runs: tuple[tuple[int, int, float, float], ...] = ()  # ``round_runs``: found once, not once a schedule

    @property
    def busiest(self) -> tuple[float, ...]:
        """The busiest rank's score entries of each round."""
        return tuple(self.busiest_rounds.tolist())

    @property
    def mean(self) -> tuple[float, ...]:
        """The ranks' mean score entries of each round."""
        return tuple(self.mean_rounds.tolist())

    @property
    def sends(self) -> tuple[float, ...]:
        """The share of layers whose K, V travel on after each round."""
        return tuple(self.sent_rounds.tolist())


def _sequential_sum(x: np.ndarray) -> float:
    """sum(x.tolist()): the floats added left to right (``np.add.accumulate``), not numpy's pairwise sum."""
    return float(np.add.accumulate(x)[-1]) if len(x) else 0.0


@lru_cache(maxsize=1024)
def masked_rounds(work, token_layout: str, ring: int, layers: int) -> MaskedRounds:
    """``masks.ring_round_pairs`` averaged over ``masks.layer_windows``; a layer's K, V go no further than its last
    round that some pack's mask fills (runtime ring.needed_rounds): the far rounds of a window send nothing."""
    busiest, mean, sends = np.zeros(ring), np.zeros(ring), np.zeros(ring)
    mix = layer_windows(work, layers)
    total = sum(n for _, n in mix)
    for w, n in mix:  # elementwise, in the same order of operations per round as a scalar loop
        hi, avg, empty = round_arrays(work, token_layout, ring, w)
        filled = np.flatnonzero(empty < 1.0)
        last = int(filled[-1]) if len(filled) else 0  # the last round any pack fills
        busiest += n * hi / total
        mean += n * avg / total
        sends += np.where(np.arange(ring) < last, n / total, 0.0)
    top = _sequential_sum(busiest)
    pooled = _sequential_sum(mean) / top if top else 1.0
    for x in (busiest, mean, sends):
        x.flags.writeable = False  # cached: shared by every caller
    return MaskedRounds(busiest, mean, sends, pooled, round_runs(busiest, sends))


class RingSizes(NamedTuple):
    """What a masked ring's steps read of a shape (``masked_ring_steps``): its mask and layout, the ring, and the
    sizes of one block, one send and one merge."""

    work: Workload
    token_layout: str
    ring: int
    layers: int
    head_dim: int
    b: int
    n_ring: float
    kv_local: float
    heads_local: float
    e: float
    merge: float  # ``merge_bytes`` of the shape and direction
    acc: float = 4.0  # bytes per element of the dK, dV accumulators sent on (``Shape.acc``)


def masked_ring_steps(c: Shape, backward: bool) -> list[Step]:
    """Ring (and Ulysses, R = 1) attention under documents or a window: round i costs its busiest rank's score
    entries under the mask and the token layout (``masked_rounds``: 4 b pairs h d FLOPs forward, 2.5x backward),
    a round no layer's mask fills computes nothing, and K, V (with dK, dV backward) travel only as far as the
    layers' masks need them; dK, dV go home from the last round reached. Equal rounds after the first run as one
    step. Built once per the sizes they read (``RingSizes``): shapes that differ only elsewhere share them."""
    m = c.model
    sizes = RingSizes(c.work, c.token_layout, c.ring, m.layers, m.head_dim, c.b, c.n_ring, c.kv_local,
                      c.heads_local, c.e, merge_bytes(c, backward) if c.ring > 1 else 0.0, c.acc)
    return list(_masked_steps(sizes, backward))


@lru_cache(maxsize=4096)
def _masked_steps(s: RingSizes, backward: bool) -> tuple[Step, ...]:
    """``masked_ring_steps`` of the sizes ``s``."""
    mr = masked_rounds(s.work, s.token_layout, s.ring, s.layers)
    steps: list[Step] = []
    for i, k, phases in _round_phases(s, backward, mr):
        last = steps[-1] if steps and i > 1 else None  # the first ring round (the diagonal) stands alone
        if last is not None and last.phases == phases:
            steps[-1] = Step(phases, last.repeat + k, last.overlap)
        elif phases:
            steps.append(Step(phases, k, overlap=any(type(p) is Comm for p in phases)))
    home = float(mr.sent_rounds[0])
    if backward and home > 0:  # the layers whose K, V left home
        kv = s.b * s.n_ring * s.kv_local * s.head_dim
        steps.append(Step((Comm("ring p2p dk,dv home", "shift", ("ring",), home * 2 * kv * s.acc),)))
    return tuple(steps)


def round_runs(pairs: np.ndarray, share: np.ndarray) -> tuple[tuple[int, int, float, float], ...]:
    """(first round, rounds, busiest pairs, share sent) of each run of equal rounds after the first (the diagonal,
    a run of its own): what ``_round_phases`` builds once a run, not once a round."""
    new = np.ones(len(pairs), dtype=bool)
    new[2:] = (pairs[2:] != pairs[1:-1]) | (share[2:] != share[1:-1])
    first = np.flatnonzero(new)
    counts = np.diff(np.append(first, len(pairs)))
    return tuple(zip(first.tolist(), counts.tolist(), pairs[first].tolist(), share[first].tolist()))


def _round_phases(s: RingSizes, backward: bool, mr: MaskedRounds) -> list[tuple[int, int, tuple]]:
    """(first round, rounds, phases) of each run of equal masked ring rounds (``round_runs``): its busiest rank's
    block (and merge) where the mask fills it, beside the send of K, V (dK, dV backward) onward, scaled by the share
    of layers whose K, V travel on."""
    tag, mult = ("bwd", 2.5) if backward else ("fwd", 1.0)  # FlashAttention backward: 5 block matmuls vs 2
    kv = s.b * s.n_ring * s.kv_local * s.head_dim
    send = 2 * kv * s.e + (2 * kv * s.acc if backward else 0.0)
    full = attention_flops(s.n_ring, s.n_ring, s.heads_local, s.head_dim, s.b)
    balance = (mr.pooled,) if mr.pooled < 1.0 and s.ring <= BALANCE_MAX_RING else ()
    merge = (Compute(f"ring merge {tag}", 0.0, "memory", nbytes=s.merge),) if s.ring > 1 else ()
    out = []
    for i, k, pairs, share in mr.runs:
        f = pairs / (s.n_ring * s.n_ring)
        masked = s.work.causal and (i == 0 or s.token_layout == "striped")  # a (shifted) diagonal
        comp = (Compute(f"attention {tag}", mult * full * f, "attention", s.n_ring, fill=f, balance=balance,
                        masked=masked),) + merge if pairs else ()
        out.append((i, k, comp + ((Comm(f"ring p2p {tag}", "shift", ("ring",), share * send),) if share else ())))
    return out


def usp_steps(c: Shape, backward: bool) -> list[Step]:
    """Attention of one layer for ring, ulysses and usp: all-to-alls around ring rounds (USP Sec. 3)."""
    pre, post = ulysses_a2a(c, backward)
    return [Step((a2a_packing(p), p)) for p in pre] + ring_steps(c, backward) + [Step((a2a_packing(p), p)) for p in post]


def usp_buffer_bytes(c: Shape, training: bool) -> float:
    """Transient buffers of ring / ulysses / usp attention for one layer.

    Ring: double buffers for K, V (and in backward for the dK, dV accumulators), fp32 out/LSE accumulators.
    Ulysses: the head-sharded copies of q, k, v and the output after the all-to-all.
    """
    m = c.model
    kv_block = c.b * c.n_ring * c.kv_local * m.head_dim * c.e
    q_ring = c.b * c.n_ring * c.heads_local * m.head_dim
    buf = 0.0
    if c.ring > 1:
        buf += 2 * 2 * kv_block + q_ring * 4 + c.b * c.n_ring * c.heads_local * 4
        if training:
            buf += 2 * 2 * kv_block * c.acc / c.e + q_ring * 4  # dK, dV accumulators' double buffers, dQ's
    if c.ulysses > 1:
        buf += (2 * q_ring + 2 * c.b * c.n_ring * c.kv_local * m.head_dim) * c.e
    return buf


def _usp_variants(d, model, work) -> list[Variant]:
    return [Variant(algorithm_for(d.ulysses, d.ring))]


for _name in ("ring", "ulysses", "usp"):
    register(Algorithm(_name, usp_steps, usp_buffer_bytes,
                       variants=_usp_variants if _name == "usp" else (lambda d, model, work: [])))
