"""Schedules: each algorithm as a short list of steps of per-rank compute and communication phases.

A Step runs its phases ``repeat`` times; an overlapped step (double buffering) costs the max of
its phases, a plain one their sum. Volumes are per rank and in bytes; FLOPs per rank.
Notation (papers'): B sequences per data-parallel rank, N tokens, H hidden, heads a, KV heads kv,
head dim d, ulysses degree U, ring degree R, element size e.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from .algorithms import ALGORITHMS
from .masks import MASKED_ALGORITHMS, has_mask, mask_fraction, mask_tiles
from .merges import MERGES, MergeBytes
from .model import ModelSpec, Workload, micro_batches


class Compute(NamedTuple):
    """Per-rank compute: FLOPs and, for attention, the block length that sets its efficiency; for a GEMM the
    rows (tokens) it runs on, which a calibrated matmul curve reads (0: unknown, the curve's largest size).
    Kind "memory": a memory-bound pass of ``nbytes`` device-memory traffic (no FLOPs counted).
    (Phases and steps are named tuples: the search builds ~10^4 of them, and a tuple is made 3x faster than a
    frozen dataclass.)"""

    name: str
    flops: float
    kind: str = "matmul"  # "matmul", "attention" or "memory"
    block: float = 0.0
    rows: float = 0.0
    fill: float = 1.0  # attention: fraction of the block's query x key pairs computed (causal diagonal, zigzag half)
    nbytes: float = 0.0  # memory: bytes read + written
    balance: tuple = ()  # attention: per round, ranks' mean work over the busiest's (() = even; layout.ring_balance)
    masked: bool = False  # attention: one block under a causal mask (a diagonal, striped's shifted one), not dense
    calls: float = 1  # attention: kernel calls it stands for (each pays Params.round_overhead_s; under a mask the
    # expected tiles, ``tiled``), ``block`` long each
    # attention: the calls' fixed cost follows the work's balance (a rank with no block in a round gets no message
    # either: TokenRing's trimmed Q); False: every rank pays every round's (Ring passes K, V to all each round)
    trimmed: bool = False


class Comm(NamedTuple):
    """A communication phase: ``pattern`` over every group of ``dim``, ``nbytes`` per rank."""

    name: str
    pattern: str
    dim: tuple[str, ...]
    nbytes: float


class Step(NamedTuple):
    """Phases run ``repeat`` times; overlapped (double-buffered): the max of its phases, else their sum."""

    phases: tuple
    repeat: int = 1
    overlap: bool = False


@dataclass(frozen=True, init=False)
class Shape:
    """Sizes of one candidate that the schedules need (per micro-batch of ``mbs`` sequences).

    (Its own __init__: the search makes ~10^4 of them, and a frozen dataclass's generated one sets each
    field through object.__setattr__, 2.5x slower.)"""

    model: ModelSpec
    work: Workload
    dp: int
    ulysses: int
    ring: int
    token_layout: str
    tp: int = 1
    pp: int = 1
    mbs: int = 1
    algorithm: str = "usp"
    team: int = 1
    placement: str | None = None
    stage_layers: tuple[int, ...] | None = None  # layers per pipeline stage; None: layers / pp on each
    kv_chunks: int = 1  # all-gather's chunks of KV heads (planner/allgather.py)
    merge: MergeBytes = MERGES["sp-plan"]  # the ring merge of the runtime priced (Params.ring_merge)

    def __init__(self, model: ModelSpec, work: Workload, dp: int, ulysses: int, ring: int, token_layout: str,
                 tp: int = 1, pp: int = 1, mbs: int = 1, algorithm: str = "usp", team: int = 1,
                 placement: str | None = None, stage_layers: tuple[int, ...] | None = None, kv_chunks: int = 1,
                 merge: MergeBytes = MERGES["sp-plan"]):
        self.__dict__.update(model=model, work=work, dp=dp, ulysses=ulysses, ring=ring, token_layout=token_layout,
                             tp=tp, pp=pp, mbs=mbs, algorithm=algorithm, team=team, placement=placement,
                             stage_layers=stage_layers, kv_chunks=kv_chunks, merge=merge)
        self.__post_init__()

    def __post_init__(self):
        """Derived sizes, computed once (plain attributes: the search reads them in its hot loop)."""
        m, w = self.model, self.work
        d = self.__dict__
        d["b"] = self.mbs  # sequences in one micro-batch
        d["micro_batches"] = micro_batches(w.batch, self.dp, self.mbs)
        d["e"] = m.dtype_bytes
        d["acc"] = self.merge.carried_bytes(d["e"])  # bytes per element of a gradient accumulator sent on
        d["sp"] = self.ulysses * self.ring
        # the largest stage's layers (memory; the step prices each stage: Estimator.pipeline_stage)
        d["layers_per_stage"] = m.layers // self.pp if self.stage_layers is None else max(self.stage_layers)
        d["n_local"] = w.seq_len / d["sp"]  # tokens per sequence rank per sequence
        d["n_ring"] = w.seq_len / self.ring  # tokens per ring rank after the Ulysses all-to-all (one ring block)
        d["heads_local"] = m.heads / (self.tp * self.ulysses)
        d["kv_tp"] = max(m.kv_heads // self.tp, 1)  # KV heads per TP rank; replicated when fewer than tp (Megatron)
        # KV heads sent through the Ulysses all-to-all: replicated up to U when fewer (priced)
        d["kv_exchanged"] = max(d["kv_tp"], self.ulysses) if self.ulysses > 1 else d["kv_tp"]
        d["kv_local"] = d["kv_exchanged"] / self.ulysses
        # one micro-batch's hidden states on this sequence rank: b (N/sp) H e (what TP-sp gathers)
        d["hidden_bytes"] = self.mbs * d["n_local"] * m.hidden * d["e"]
        # the fields after model and workload, in order (the Estimator's cache key of this shape)
        d["key"] = (self.dp, self.ulysses, self.ring, self.token_layout, self.tp, self.pp, self.mbs, self.algorithm,
                    self.team, self.placement, self.stage_layers, self.kv_chunks)
        d["keys"] = {}  # schedule part -> the Estimator's schedule key of this shape (estimate.schedule_key)

    def sibling(self, token_layout: str, algorithm: str, team: int, placement: str | None, kv_chunks: int) -> Shape:
        """This shape's sizes under another variant and token layout: ``__post_init__``'s derived sizes read none of
        these fields, so they are copied, not derived again (the search makes thousands of such siblings)."""
        c = object.__new__(Shape)
        object.__setattr__(c, "__dict__", {
            **self.__dict__, "token_layout": token_layout, "algorithm": algorithm, "team": team,
            "placement": placement, "kv_chunks": kv_chunks, "keys": {},
            "key": (self.dp, self.ulysses, self.ring, token_layout, self.tp, self.pp, self.mbs, algorithm, team,
                    placement, self.stage_layers, kv_chunks)})
        return c


def scaled(steps: list[Step], k: int) -> list[Step]:
    """``steps`` for k times the sequences of a micro-batch: every FLOP count, GEMM row count and byte volume
    of a schedule is linear in ``b`` (the sizes above), block lengths and repeats are not."""
    return [Step(tuple(Compute(p.name, p.flops * k, p.kind, p.block, p.rows * k, p.fill, p.nbytes * k, p.balance,
                               p.masked, p.calls, p.trimmed)
                       if type(p) is Compute else Comm(p.name, p.pattern, p.dim, p.nbytes * k) for p in st.phases),
                 st.repeat, st.overlap)
            for st in steps]


def attention_flops(sq: float, sk: float, heads: float, d: int, b: int) -> float:
    """FLOPs of a full (unmasked) attention block forward: QK^T and PV, 2 FLOPs per MAC."""
    return 4.0 * b * sq * sk * heads * d


def a2a_packing(p: Comm) -> Compute:
    """The copies around an all-to-all (USP's SeqAllToAll4D: a transpose to contiguous per-destination chunks
    before, the inverse after): two passes that read and write the volume, 4 x its bytes of device memory."""
    return Compute(p.name.replace("a2a", "a2a packing"), 0.0, "memory", nbytes=4.0 * p.nbytes)


def merge_bytes(c: Shape, backward: bool) -> float:
    """Device-memory bytes of one ring round's merge as the shape's runtime runs it (planner/merges.MERGES,
    ``Params.ring_merge``): forward, per local out element and per LSE element; backward, per dQ, dK, dV
    element accumulated."""
    m, e, mb = c.model, c.e, c.merge
    q = c.b * c.n_ring * c.heads_local * m.head_dim
    if not backward:
        return q * mb.forward(e) + c.b * c.n_ring * c.heads_local * mb.lse
    kv = c.b * c.n_ring * c.kv_local * m.head_dim
    return (q + 2 * kv) * mb.backward(e)


def attention_blocks(c: Shape) -> tuple[float, ...]:
    """Every block length a registered attention schedule runs at for these degrees: the ring block N/R
    times a team size C dividing R (Ring, USP, TokenRing: C = 1; WallFacer's team block C N/R; all-gather's N,
    C = R), and METP's N/tp."""
    return _blocks(c.ring, c.work.seq_len, c.tp)


@lru_cache(maxsize=4096)
def _blocks(R: int, N: int, tp: int) -> tuple[float, ...]:
    small = [C for C in range(1, math.isqrt(R) + 1) if R % C == 0]  # the divisors C of R, in pairs (C, R / C)
    return tuple(sorted({N / R * C for C in small} | {N / R * (R // C) for C in small} | {N / tp}))


def balanced_attention(c: Shape, backward: bool, block: float) -> Compute:
    """A floor under any algorithm's attention compute on one rank: the layer's attention FLOPs (causal:
    N(N+1)/2 of N^2 pairs) shared evenly over the tp x ulysses x ring ranks, as one call at ``block``.
    Every schedule's busiest rank computes at least its even share (each round's busiest rank is at least
    the average; WallFacer eqs. 2-4, TokenRing and METP move the same pairs); priced at the most
    efficient of ``attention_blocks`` it costs no more than any of them. With documents or a window, the mask's
    expected pairs over the layers (``masks.mask_fraction``) replace the causal N(N+1)/2."""
    N = c.work.seq_len
    if c.work.documents is None and c.work.mask_window is None:
        frac = (N + 1) / (2 * N) if c.work.causal else 1.0
    else:  # the mask's share of the N^2 pairs: documents and windows cut it (planner/masks/)
        frac = mask_fraction(c.work, c.model.layers)
    mult = 2.5 if backward else 1.0  # FlashAttention backward: 5 block matmuls vs 2
    flops = mult * attention_flops(N, N, c.model.heads / c.tp, c.model.head_dim, c.b) * frac / (c.ulysses * c.ring)
    return Compute(f"attention {'bwd' if backward else 'fwd'}", flops, "attention", block)


def attention_steps(c: Shape, backward: bool) -> list[Step]:
    """Attention of one layer: the registered algorithm's schedule (planner/algorithms.py), its blocks run as
    tiles under documents or a window (``tiled``)."""
    steps = ALGORITHMS[c.algorithm].steps(c, backward)
    return tiled(c, steps) if has_mask(c.work) and c.algorithm in MASKED_ALGORITHMS else steps


def tiled(c: Shape, steps: list[Step]) -> list[Step]:
    """``steps`` with their attention blocks run as the mask's tiles (``masks.mask_tiles``): each block at most as
    long as the tiles' work-weighted harmonic length (a document's piece runs at the kernel's efficiency for its
    own size, not the block's), and its calls (each paying Params.round_overhead_s) times the tiles the mask cuts
    over those of one unmasked document, which the blocks' calls already stand for, never fewer. On efficiency
    curves that never fall with the length, never cheaper than the blocks; on any curve, no cheaper than the even
    share at the best block and curve point (``Bounds.balanced_time``), which the search prunes with. A ring's or
    USP's one document per sequence prices as none (its pieces are the blocks)."""
    t = mask_tiles(c.work, c.token_layout, c.ring, c.model.layers, c.ulysses)
    if not t.pairs:
        return steps
    more, length = max(1.0, t.tiles / t.plain) if t.plain else 1.0, t.length
    return [Step(tuple([tile_phase(p, length, more) if type(p) is Compute and p.kind == "attention" else p
                        for p in st.phases]), st.repeat, st.overlap) for st in steps]


def tile_phase(p: Compute, length: float, more: float) -> Compute:
    """An attention phase whose calls run tiles of ``length`` tokens, ``more`` of them for each call: the block
    no longer than ``length``, and the length its efficiency reads (``block x sqrt(fill)`` for a part-filled
    block) no longer than either, so every efficiency curve reads it at most where it read the block."""
    if length < p.block * (1 - 1e-12):
        read = p.block * math.sqrt(p.fill) if 0 < p.fill < 1 else p.block
        fill = min(1.0, (read / length) ** 2)
        if more > 1.0:  # one _replace, not two
            return p._replace(block=length, fill=fill, calls=p.calls * more)
        return p._replace(block=length, fill=fill)
    return p._replace(calls=p.calls * more) if more > 1.0 else p


def linear_steps(c: Shape, backward: bool) -> list[Step]:
    """QKV/O projections and MLP of one layer on this rank's tokens (2 FLOPs per weight per token), and
    Megatron TP-sp around them: all-gather before attention and MLP, reduce-scatter after (USP Table 2:
    4 all-gathers + 4 reduce-scatters of bs L d per layer, forward and backward together)."""
    f = 2.0 * c.b * c.n_local * c.model.layer_params() / c.tp
    tag = "bwd" if backward else "fwd"
    steps = [Step((Compute("linear " + tag, 2 * f if backward else f, rows=c.b * c.n_local),))]
    if c.tp > 1 and ALGORITHMS[c.algorithm].tp_sp:
        dim = ("tp",)
        steps += [Step((Comm(f"tp all-gather {tag}", "all_gather", dim, c.hidden_bytes),), 2),
                  Step((Comm(f"tp reduce-scatter {tag}", "reduce_scatter", dim, c.hidden_bytes),), 2)]
    return steps


def layer_schedule(c: Shape, backward: bool, attention: bool = True) -> list[Step]:
    """One Transformer block, forward or backward (``attention=False``: its linear part only)."""
    return linear_steps(c, backward) + (attention_steps(c, backward) if attention else [])


def head_steps(c: Shape, training: bool) -> list[Step]:
    """Output projection (logits) on this rank's tokens, forward and, in training, backward."""
    f = 2.0 * c.b * c.n_local * c.model.hidden * c.model.vocab / c.tp
    return [Step((Compute("lm head", 3 * f if training else f, rows=c.b * c.n_local),))] if f else []


def pipeline_p2p(c: Shape, training: bool) -> list[Step]:
    """1F1B stage boundary: activations forward and their gradients back, per micro-batch."""
    if c.pp == 1:
        return []
    nbytes = c.hidden_bytes / c.tp
    steps = [Step((Comm("pp send activations", "shift", ("pp",), nbytes),))]
    if training:
        steps.append(Step((Comm("pp send gradients", "shift_back", ("pp",), nbytes),)))
    return steps


def shard_params(model: ModelSpec, tp: int, pp: int, stage_layers: tuple[int, ...] | None = None) -> float:
    """Weights on the most loaded rank (Megatron): its 1/pp of the blocks plus the embedding, over tp; with
    ``stage_layers``, the largest stage's blocks with the embedding on the first and the LM head on the last."""
    emb = model.vocab * model.hidden
    if stage_layers is None:
        return (model.layers * model.layer_params() / pp + emb * (2 if pp == 1 else 1)) / tp
    last = len(stage_layers) - 1
    return max(n * model.layer_params() + emb * ((i == 0) + (i == last)) for i, n in enumerate(stage_layers)) / tp


#: torch DistributedDataParallel's gradient bucket, which ZeRO-0 runs on (bucket_cap_mb=25): a bucket is all-reduced
#: once all its gradients exist, the buckets one after another
DDP_BUCKET_BYTES = float(25 << 20)


def bucket_share(grad_bytes: float, layers: int, bucket_bytes: float | None = DDP_BUCKET_BYTES) -> float:
    """The share of a rank's gradients in one sync bucket: a stage layer's (a layer's gradients come at once; ZeRO's
    per-block wrappers, ``bucket_bytes`` None), or DDP's bucket where that is larger, at most all of them."""
    f = 1.0 / max(layers, 1)
    if bucket_bytes and grad_bytes > 0:
        f = max(f, min(1.0, bucket_bytes / grad_bytes))
    return f


def bucketed_exposure(total, backward, share: float):
    """Seconds of a gradient sync of ``total`` seconds left after ``backward`` seconds of backward compute, in
    buckets of ``share`` of the gradients produced at an even rate, bucket i sent once full and after bucket i-1:
    max_i((1 - (i-1) f) total - (1 - i f) backward) over i = 1..1/f, linear in i, so the first or the last:
    max(f total, total - (1 - f) backward). Its floor, a long backward, is the last bucket, f total; it is reached
    once backward >= total. ``total`` may be an array."""
    return np.maximum(share * total, total - (1.0 - share) * backward)


def grad_sync(c: Shape, zero_stage: int, params: float) -> list[Comm]:
    """Gradient/parameter collectives over dp x sp per step (USP Table 2 rows DP, ZeRO-1/2/3)."""
    dim = ("ulysses", "ring", "dp")
    g = params * c.e
    if zero_stage == 0:
        return [Comm("grad all-reduce", "all_reduce", dim, g)]
    if zero_stage in (1, 2):
        return [Comm("grad reduce-scatter", "reduce_scatter", dim, g), Comm("param all-gather", "all_gather", dim, g)]
    return [Comm("param all-gather fwd", "all_gather", dim, g), Comm("param all-gather bwd", "all_gather", dim, g),
            Comm("grad reduce-scatter", "reduce_scatter", dim, g)]
