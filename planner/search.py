"""The search space of layouts, and the grid search that ranks every valid one by predicted step time.

Space: degrees dp x pp x tp x ulysses x ring = world (tp x ulysses divides the query heads, pp the
layers, dp x micro-batch the batch, the sequence the layout's chunks), the algorithm they imply
(ring, ulysses or usp) and the variants the algorithms add (all-gather, WallFacer, TokenRing, METP), the token
layout (contiguous, zigzag, striped when causal; with documents also balanced, the balancing policies), the mesh order
of the dimensions of degree > 1, the pipeline schedule (plain 1F1B, and interleaved over the most chunks the stages
split into where the micro-batches come in groups of pp) and the memory policy (ZeRO stage, checkpointing,
micro-batch size). Memory does not depend on the mesh order or the token layout, so the policies that fit are
found once per degrees; per-layer costs are cached by group shape (estimate.py).
"""
from __future__ import annotations

import heapq
from bisect import bisect_left
from dataclasses import dataclass, field
from enum import IntEnum
from functools import lru_cache
from itertools import permutations
from math import factorial, isqrt
from typing import Callable, Iterator

import numpy as np

from .algorithms import ALGORITHMS, algorithm_for, variants
from .candidate import Candidate
from .cluster import Cluster
from .errors import PlanError, whole_number
from .equivalent import REL_TOL, distinct_prefix, top_rows
from .estimate import MEMORY_HEADROOM, Estimator, Orders
from .exchange import Exchange
from .layout import BALANCE_POLICIES, TOKEN_LAYOUTS, chunks_needed
from .model import ModelSpec, Workload, micro_batches
from .params import Params
from .measured import rank_rows
from .plan import Plan
from .profile import Profile, pure_inputs, pure_params
from .stages import resolve_stage_layers, searched_virtual_stages, virtual_stage_options
from .ranking import RankedPlans, largest_extra_cost, summarize  # noqa: F401 - their names here are public

CHECKPOINTING = ("none", "attention_boundary", "full")
ZERO_STAGES = (0, 1, 2, 3)
INF = float("inf")


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending (a copy: callers may change it)."""
    return list(_divisors(n))


@lru_cache(maxsize=256)
def _divisors(n: int) -> tuple[int, ...]:
    """``divisors`` from the pairs (d, n / d) with d up to sqrt(n): a world of 131,072 ranks is walked many times."""
    small = [d for d in range(1, isqrt(n) + 1) if n % d == 0]
    return tuple(small + [n // d for d in reversed(small) if d * d != n])


@dataclass(frozen=True)
class Degrees:
    dp: int
    pp: int
    tp: int
    ulysses: int
    ring: int

    def dims(self) -> list[str]:
        return [n for n in ("tp", "ulysses", "ring", "dp", "pp") if getattr(self, n) > 1] or ["dp"]


@dataclass
class Space:
    """Every valid layout of ``world`` ranks for a model and workload (see the module docstring)."""

    world: int
    model: ModelSpec
    work: Workload
    tp_max: int | None = None  # e.g. devices per node; None: no limit
    micro_batch_sizes: tuple[int, ...] | None = None

    def degrees(self) -> Iterator[Degrees]:
        """Every valid degrees choice (dp, pp, tp, ulysses, ring), listed once: the partition, the variant keys and
        the search's seed each walk them."""
        return iter(self._memo("degrees", (), lambda: tuple(self._degrees())))

    def variants(self, d: Degrees) -> list:
        """``algorithms.variants`` of the degrees ``d``'s tensor and sequence split, made once per (tp, ulysses, ring):
        an algorithm's variants (teams, placements, token layouts) split those ranks alone, so it is asked at dp and
        pp 1 (the partition's variant keys and the seed ask for every degrees choice)."""
        split = (d.tp, d.ulysses, d.ring)
        return list(self._memo("variants", split, lambda: tuple(variants(Degrees(1, 1, *split), self.model,
                                                                         self.work))))

    def _degrees(self) -> Iterator[Degrees]:
        """``degrees``, generated."""
        m, w = self.model, self.work
        for dp in divisors(self.world):
            if w.batch % dp:
                continue
            for pp in divisors(self.world // dp):
                if pp > m.layers:  # uneven stages where pp does not divide the layers (Estimator.stages_of)
                    continue
                rest = self.world // (dp * pp)
                for tp in divisors(rest):
                    if m.tp_problem(tp) or (self.tp_max and tp > self.tp_max):
                        continue
                    for u in divisors(rest // tp):
                        if m.heads % (tp * u):
                            continue
                        r = rest // (tp * u)
                        if w.seq_len % (chunks_needed("contiguous", r, u) * tp):
                            continue
                        yield Degrees(dp, pp, tp, u, r)

    def layouts(self, d: Degrees) -> list[str]:
        """Token layouts of a ring of the degrees: with documents the balancing policies (their work is uneven
        causal or not), else contiguous, zigzag and striped under a causal mask; those the length divides."""
        return list(self._memo("layouts", (d.ring, d.ulysses, d.tp), lambda: tuple(self._layouts(d))))

    def _layouts(self, d: Degrees) -> list[str]:
        """``layouts``, listed; not ``balanced`` where the layers mix windows: one placement serves every layer, and
        balanced places by one mask's work (runtime/placement.py)."""
        documents = self.work.documents is not None
        if d.ring == 1 or not (self.work.causal or documents):
            return ["contiguous"]
        policies = BALANCE_POLICIES if documents and not self.work.mixes_windows else TOKEN_LAYOUTS
        return [t for t in policies if self.work.seq_len % (chunks_needed(t, d.ring, d.ulysses) * d.tp) == 0]

    def orders(self, d: Degrees) -> list[tuple[str, ...]]:
        return list(permutations(d.dims()))

    def policies(self, d: Degrees, v: int = 1) -> list[tuple[int, str, int]]:
        """(ZeRO stage, checkpointing, micro-batch size) choices for these degrees under ``v`` virtual stages."""
        mbs = self._mbs(d) if v == 1 else self.interleaved_mbs(d, v)
        if not self.work.training:
            return [(0, "none", b) for b in mbs]
        return [(z, ck, b) for b in mbs for ck in CHECKPOINTING for z in ZERO_STAGES]

    def virtual_stages(self, d: Degrees) -> list[int]:
        """The pipeline schedules offered for the degrees (``stages.searched_virtual_stages``): 1 alone without a
        pipeline or where no micro-batch size makes the micro-batches a multiple of pp."""
        if d.pp == 1:
            return [1]
        return list(self._memo("virtual stages", (d.pp, d.dp), lambda: tuple(searched_virtual_stages(
            d.pp, {micro_batches(self.work.batch, d.dp, b) for b in self._mbs(d)}, self.model.layers, self.stage_layers(d.pp)))))

    def interleaved_mbs(self, d: Degrees, v: int) -> list[int]:
        """The micro-batch sizes under which ``v`` > 1 virtual stages run (micro-batches in groups of pp)."""
        return list(self._memo("interleaved", (d.pp, d.dp, v), lambda: tuple(
            b for b in self._mbs(d) if v in virtual_stage_options(d.pp, micro_batches(self.work.batch, d.dp, b),
                                                                 self.model.layers, self.stage_layers(d.pp)))))

    def _memo(self, kind: str, key: tuple, make: Callable[[], tuple]) -> tuple:
        """``make()`` once per (kind, key): what the degrees' pipeline sizes give, asked per degrees choice and stage."""
        cache = self.__dict__.setdefault("_memos", {})
        value = cache.get((kind, key))
        if value is None:
            value = cache[kind, key] = make()
        return value

    def sharing_memos(self, other: Space) -> Space:
        """``other``, a space of the same fields (a share of this one), reading and filling this space's memos."""
        other.__dict__["_memos"] = self.__dict__.setdefault("_memos", {})
        return other

    def stage_layers(self, pp: int) -> tuple[int, ...] | None:
        """Layers per stage the search prices for ``pp`` (``Estimator.stages_of`` of a candidate without its own)."""
        cache = self.__dict__.setdefault("_stages", {})
        if pp not in cache:
            cache[pp] = resolve_stage_layers(self.model, pp, None, self.work)
        return cache[pp]

    def _mbs(self, d: Degrees) -> list[int]:
        """The micro-batch sizes of the degrees' per-replica batch (a copy: callers may change it), once per dp."""
        return list(self._memo("micro-batches", (d.dp,), lambda: tuple(
            [b for b in divisors(self.work.batch // d.dp) if not self.micro_batch_sizes or b in self.micro_batch_sizes]
            or [1])))


@dataclass
class SearchResult:
    ranked: list[tuple[float, Candidate]]  # fitting layouts, fastest first (each with its best memory policy)
    evaluated: int  # candidates priced (degrees x order x layout x fitting policy)
    space: int  # candidates in the space
    rejected: int  # variants of the expanded degrees with no memory policy that fits
    estimator: Estimator
    profile: str | None = None  # the profile whose params priced it (its id, or "file"); None: uncalibrated
    profile_line: str = ""  # profiles.resolve.resolve_params' line, for the user (set by the pipeline)
    predicted: dict = field(default_factory=dict)  # Candidate -> Prediction made where its share was searched


CKPT_COST = {c: i for i, c in enumerate(CHECKPOINTING)}
#: a share of a split search (``exchange``) reads the other shares' bounds every this many pops, and after each price
TRADE_EVERY = 32


def zero_no_slower(q: int, k: int) -> bool:
    """Whether ZeRO stage ``q`` never exposes more gradient sync than ``k`` (``Estimator.sync_exposed``): ZeRO-1 no
    more than ZeRO-2 (the same buckets; the reduce-scatter once a step, not every micro-batch), ZeRO-2 no more than
    ZeRO-3 (which gathers the weights every micro-batch too). ZeRO-0 is neither: its all-reduce rides DDP's buckets,
    which may be coarser than a layer, and sits behind the backward alone, where ZeRO-1 hides its all-gather behind a
    forward; so ZeRO-0 and ZeRO-1 are both kept."""
    return q == k or 1 <= q <= k


def pareto_policies(policies: list[tuple[int, str, int]]) -> list[tuple[int, str, int]]:
    """Drop a fitting policy when another with the same micro-batch is no slower in both gradient sync
    (``zero_no_slower``) and recomputation; the survivors are priced."""
    return list(_pareto(tuple(policies)))


@lru_cache(maxsize=4096)
def _pareto(policies: tuple[tuple[int, str, int], ...]) -> tuple[tuple[int, str, int], ...]:
    """``pareto_policies``, once per fitting set (degrees choices and variants fit alike: a few dozen sets a search)."""
    keys: dict = {}  # micro-batch -> (ZeRO stage, recomputation cost) of its policies (only those are compared)
    for z, ck, mbs in policies:
        keys.setdefault(mbs, []).append((z, CKPT_COST[ck]))
    return tuple((z, ck, mbs) for z, ck, mbs in policies
                 if not any((q, c) != (z, CKPT_COST[ck]) and zero_no_slower(q, z) and c <= CKPT_COST[ck]
                            for q, c in keys[mbs]))


def larger_micro_batch_wins(est: Estimator, pp: int) -> bool:
    """Whether, for any policy, the same ZeRO stage and checkpointing with a larger micro-batch is never slower:
    without a pipeline (no bubble to grow), with FLOPs and bytes linear in the micro-batch (``scaled``), GEMM and
    attention efficiency independent of it and no fixed cost per compute call, a step of k sequences costs
    m/k x g(k a, k b + beta) = m g(a, b + beta/k) (g: a step's price, homogeneous and monotone; beta: latencies).
    The gradient sync's window in a micro-batch's pass (``estimate.sync_window``: its wall time less what its
    transfers hold the sync's links for) never shrinks with k: each phase costs k a or k b + l, so a plain step's
    window is k a + (k b + l) - (k b_c + l_c), with b_c, l_c the held class's part, and an overlapped one's at least
    max(k a - (k b + l), 0) + (1 - overlap) min(k a, k b + l), none of which falls as k grows (a fixed cost per
    call, o in k a + o, would make max(k a + o - k b - l, 0) fall); and a step runs a ZeRO-2 or 3 sync m = B/k
    times (``Estimator.sync_exposed``)."""
    pr = est.params
    return pp == 1 and pr.matmul is None and not pr.round_overhead_s


def _largest_by_policy(policies: list[tuple[int, str, int]]) -> dict[tuple[int, str], int]:
    """(ZeRO stage, checkpointing) -> the largest micro-batch ``policies`` list for it."""
    top: dict = {}
    for z, ck, mbs in policies:
        top[z, ck] = max(top.get((z, ck), 0), mbs)
    return top


def largest_micro_batches(policies: list[tuple[int, str, int]]) -> list[tuple[int, str, int]]:
    """Per (ZeRO stage, checkpointing), only the largest fitting micro-batch (``larger_micro_batch_wins``)."""
    top = _largest_by_policy(policies)
    return [p for p in policies if p[2] == top[p[:2]]]


def per_sequence_costs_never_grow(est: Estimator, pp: int) -> bool:
    """Whether, without a pipeline, every phase of a ``batch_linear`` schedule costs no more per sequence with a
    larger micro-batch k under ``est.params``: its FLOPs, GEMM rows and bytes are k x those of one sequence
    (``scaled``) and its block lengths and repeats are not, so a compute phase costs k a + o (o: the per-call
    ``round_overhead_s`` or 0; a, the per-sequence seconds, never grows when the GEMM efficiency curve
    ``params.matmul`` never falls with rows: attention efficiency reads the block length, a memory pass is
    linear, ``compute_efficiency`` is a constant), a communication phase k b + l (steps x latency and alpha),
    and a step f(compute, communication)
    with f (sum, max, or max + (1 - overlap) min) homogeneous and monotone: per sequence, f(a + o/k, b + l/k)."""
    return pp == 1 and est.matmul_never_falls


def hidden_sync_micro_batches(est: Estimator, base: Candidate, batch: Orders,
                              policies: list[tuple[int, str, int]]) -> list[tuple[int, str, int]]:
    """``policies`` without those beaten on every mesh order by the same ZeRO stage and checkpointing at the
    largest micro-batch K listed, where the search may drop them (``per_sequence_costs_never_grow``; the
    algorithm ``batch_linear``). A step of micro-batches of k sequences costs P(k) + X(k): its pipeline P, which
    never grows with k, and the gradient sync it exposes X (``Estimator.sync_exposed``), which is at least its
    floor F(k), the last bucket each time the sync runs (ZeRO-2 and 3 run it every micro-batch, so F never grows
    with k either); but X may fall with a smaller k, whose passes may hide more. So K is taken only for the ZeRO
    stages whose sync is at its floor at K on every order (``Estimator.sync_at_floor``): there
    P(K) + F(K) <= P(k) + F(k) <= P(k) + X(k)."""
    if not ALGORITHMS[base.algorithm].batch_linear:
        return policies
    top = {zc: k for zc, k in _largest_by_policy(policies).items()
           if any(p[:2] == zc and p[2] < k for p in policies)}  # something to drop
    if top and est.work.training:
        hidden = {(z, k): est.sync_at_floor(est.shape(base, k), z, batch) for (z, _), k in top.items()}
        top = {zc: k for zc, k in top.items() if hidden[zc[0], k]}
    return [p for p in policies if p[2] == top.get(p[:2], p[2])]


def shared_bounds(est: Estimator, pp: int, algorithms, policies: list[tuple[int, str, int]]) -> dict | None:
    """Checkpointing -> its policy with the largest micro-batch K, whose lower bounds (``Bounds.compute_bounds``,
    ``Bounds.comm_bounds``) hold for every policy of that checkpointing where per-sequence costs never grow
    (``per_sequence_costs_never_grow``, every algorithm ``batch_linear``): they leave out the gradient sync, so
    the ZeRO stage, and bound B s(K) <= B s(k) <= the step at k (``hidden_sync_micro_batches``); else None."""
    if not (per_sequence_costs_never_grow(est, pp) and all(ALGORITHMS[a].batch_linear for a in algorithms)):
        return None
    rep: dict = {}
    for p in policies:
        if p[1] not in rep or p[2] > rep[p[1]][2]:
            rep[p[1]] = p
    return rep


def at_largest_micro_batch(rep: dict) -> list[tuple[int, str, int]]:
    """``shared_bounds``' policies, each at the largest micro-batch K of them all: B s(K) <= B s(k) holds for every
    k <= K of a checkpointing, fitting or not, so one shape's schedule parts bound every checkpointing (the
    communication bound builds its attention floors and link prices once, not once per micro-batch)."""
    top = max(p[2] for p in rep.values())
    return [(z, ck, top) for z, ck, _ in rep.values()]


def degree_groups(est: Estimator, space: Space, d: Degrees, wanted: Callable[[tuple, int, int], bool] | None = None,
                  vs: list | None = None) -> tuple[list[tuple[Candidate, list, list]], int, int]:
    """(base candidate, mesh orders, fitting policies) for every algorithm variant, token layout and pipeline
    schedule (virtual stages) of the degrees ``d`` (with ``wanted``: only the (variant key, micro-batch size,
    virtual stages) it accepts), the number of candidates they stand for, and how many variants fit no policy under
    any schedule. ``vs``: the variants of ``d``, if known."""
    out, total, rejected = [], 0, 0
    orders, schedules = space.orders(d), space.virtual_stages(d)
    all_pols = {v: space.policies(d, v) for v in schedules}
    sizes = {v: sorted({p[2] for p in pols}) for v, pols in all_pols.items()}  # micro-batch sizes, asked of wanted
    pareto: dict = {}  # fitting policies -> the Pareto survivors (variants of one degrees often fit alike)
    first = Candidate("usp", d.dp, d.pp, d.tp, d.ulysses, d.ring, orders[0])
    for var in vs if vs is not None else space.variants(d):
        vkey = (var.algorithm, var.team, var.placement)
        layouts = list(var.layouts) if var.layouts is not None else space.layouts(d)
        asked = fit_any = False
        for v in schedules:
            if wanted is None:
                pols = all_pols[v]
            else:  # asked once per micro-batch size
                ok = {mbs: wanted(vkey, mbs, v) for mbs in sizes[v]}
                pols = all_pols[v] if all(ok.values()) else [p for p in all_pols[v] if ok[p[2]]]
            if not pols:
                continue
            asked = True
            total += len(orders) * len(layouts) * len(pols)
            # a copy of one made per degrees choice (``Candidate.but``: no frozen __init__ per variant)
            probe = first.but(algorithm=var.algorithm, token_layout=layouts[0], team=var.team,
                              placement=var.placement, virtual_stages=v)
            fits = tuple(est.fitting(probe, pols))
            fitting = pareto.get(fits)
            if fitting is None:
                fitting = pareto[fits] = pareto_policies(list(fits))
            if not fitting:
                continue
            fit_any = True
            out.append((probe, orders, fitting))
            out += [(probe.but(token_layout=tl), orders, fitting) for tl in layouts[1:]]
        if asked and not fit_any:
            rejected += 1
    return out, total, rejected


def order_batch(est: Estimator, base: Candidate, orders: list, batches: dict) -> Orders:
    """The Orders batch of ``base``'s degrees and ring variant, made once per search (``batches``)."""
    key = (base.dp, base.pp, base.tp, base.ulysses, base.ring, base.team, base.placement)
    batch = batches.get(key)
    if batch is None:
        batch = batches[key] = est.orders(base.degrees, orders, base.placement)
    return batch


def price_group(est: Estimator, base: Candidate, orders: list, fitting: list,
                batches: dict) -> list[tuple[float, Candidate]]:
    """Every mesh order of ``base`` with its fastest fitting policy, priced together (estimate.Orders)."""
    return best_orders(base, orders, fitting, est.evaluate_orders(base, order_batch(est, base, orders, batches),
                                                                  fitting)[0])


def best_orders(base: Candidate, orders: list, fitting: list, times: np.ndarray,
                cut: float = INF) -> list[tuple[float, Candidate]]:
    """Each mesh order of ``base`` with its fastest policy of ``times`` (orders x ``fitting``), those no slower than
    ``cut`` (a candidate is made only for them)."""
    best = times.argmin(axis=1).tolist()
    least = times.min(axis=1).tolist()  # the same floats as times[k, best[k]]
    out = []
    for k, order in enumerate(orders):
        t = least[k]
        if t <= cut:
            z, ck, mbs = fitting[best[k]]
            out.append((t, base.but(order=order, zero_stage=z, checkpointing=ck, micro_batch_size=mbs)))
    return out


def interleaving_floor(est: Estimator, base: Candidate, mbs: int) -> float:
    """The least share of its plain-1F1B step a step of ``base`` (v = ``base.virtual_stages`` > 1) can take under
    micro-batch ``mbs``, each mesh order and policy alike: with stage seconds s_1 under 1F1B and s_v >= s_1 interleaved
    (the same layers, v sends a micro-batch instead of one) and the same exposed gradient sync X (the same backward
    hides it), T_v = (m + (pp - 1) / v) s_v + X >= (m + (pp - 1) / v) / (m + pp - 1) x T_1; a hair below for rounding."""
    m, pp, v = micro_batches(est.work.batch, base.dp, mbs), base.pp, base.virtual_stages
    return (m + (pp - 1) / v) / (m + pp - 1) * (1 - 1e-12)


def single_micro_batch(est: Estimator, base: Candidate) -> bool:
    """Whether a step of ``base``'s degrees is one micro-batch (batch = dp): its backward hides the least of the
    gradient sync, so the sync enters its bounds from the start (elsewhere only before pricing, which routes it)."""
    return est.work.batch == base.dp


def degree_size(space: Space, d: Degrees, vs: list | None = None) -> int:
    """Candidates of the degrees ``d`` in the space: variants x token layouts x mesh orders x (pipeline schedule,
    policy) pairs (``vs``: the variants of ``d``, if known)."""
    if type(space).orders is Space.orders and type(space).policies is Space.policies:  # counted, not listed
        per_mbs = len(CHECKPOINTING) * len(ZERO_STAGES) if space.work.training else 1
        n = factorial(len(d.dims())) * sum(per_mbs * len(space._mbs(d) if v == 1 else space.interleaved_mbs(d, v))
                                           for v in space.virtual_stages(d))
    else:
        n = len(space.orders(d)) * sum(len(space.policies(d, v)) for v in space.virtual_stages(d))
    return sum(n * len(v.layouts if v.layouts is not None else space.layouts(d))
               for v in (vs if vs is not None else space.variants(d)))


def degrees_floors(est: Estimator, space: Space, d: Degrees) -> dict[tuple[int, int], float]:
    """(micro-batch size, virtual stages) -> a lower bound on every candidate of the degrees ``d`` that runs them
    (``Bounds.micro_batch_bounds``: a pipeline of v chunks idles less, so each schedule has its own)."""
    out = {}
    plain = Candidate(algorithm_for(d.ulysses, d.ring), d.dp, d.pp, d.tp, d.ulysses, d.ring)
    for v in space.virtual_stages(d):
        probe = plain if v == 1 else plain.but(virtual_stages=v)
        mbs = space._mbs(d) if v == 1 else space.interleaved_mbs(d, v)
        out.update(((b, v), t) for b, t in est.bounds.micro_batch_bounds(probe, mbs).items())
    return out


class Stage(IntEnum):
    """What a queue item's bound covers, each stage tighter than the one before (``grid_search``)."""

    DEGREES = 0  # a degrees choice: compute only, the attention at its even share (Estimator.micro_batch_bounds)
    RECOMPUTE = 1  # a group: its compute with the recomputation each policy needs to fit (Estimator.policy_floor)
    # + the variant's own backward compute, per policy, the forward attention at its even share where its schedule is
    # not built yet (Bounds.compute_bounds, forward_floor): a schedule is built only for a group popped again
    BACKWARD = 2
    COMPUTE = 3  # + the variant's own compute, per policy (Bounds.compute_bounds): no link costed
    # + the attention's communication at its floor under every mesh order (Bounds.compute_bounds with the batch): no
    # link loaded, so that most groups are dropped before their orders' links are
    LINKS = 4
    COMMUNICATION = 5  # + every cost but the gradient sync, the attention at its floor (Bounds.comm_bounds)
    SYNC = 6  # + the gradient sync; priced when popped


@dataclass
class DegreesItem:
    """A degrees choice in the queue: its variants, the variant keys they rank under and the bound per (micro-batch,
    virtual stages)."""

    degrees: Degrees
    vkeys: dict[tuple, list[tuple]]
    by_mbs: dict[tuple[int, int], float]
    variants: list


@dataclass
class GroupItem:
    """A group in the queue (one algorithm variant and token layout of a degrees choice): its mesh orders, its
    fitting policies with a bound each, and ``cut``, below which its priced orders are each order's best."""

    base: Candidate
    orders: list
    fitting: list
    bounds: list[float]
    cut: float
    degrees: Degrees
    #: plain 1F1B: its interleaved siblings (base, orders, fitting, cut), queued once its own steps are known or bounded
    interleaved: list = field(default_factory=list)
    #: plain 1F1B: a lower bound on each dropped policy's step, what its interleaved siblings' bounds are read from
    lower: dict = field(default_factory=dict)
    vkey: tuple | None = None  # the variant key it ranks under (``variant_key``), once it is first pruned


class _Grid:
    """The state of one best-first grid search (``grid_search``): the queue, the ranking, the K-th time."""

    def __init__(self, est: Estimator, space: Space, keep: int | None, distinct: bool,
                 progress: Callable[[int, int], None] | None, variants: bool = True, exchange: Exchange | None = None):
        self.est, self.space, self.keep, self.progress = est, space, keep, progress
        self.exchange = exchange if keep else None  # other shares' K-th time and bests (planner.exchange)
        self.variants = variants  # False: only the top K is kept exact, so the K-th time alone prunes
        self.queue: list = []  # (bound, stage, sequence number, item)
        self.pushed = self.done = self.total = self.rejected = self.evaluated = 0
        self.ranked: list[tuple[float, Candidate]] = []
        self.kth, self.batches = float("inf"), {}
        self.best_of: dict[tuple, float] = {}  # best time per algorithm variant: each variant's best is exact too
        self.top = Fastest(keep or 0, distinct)  # the K smallest (distinct) times so far
        self.by_layout = by_policy(space.work)  # with documents each balancing policy's best is exact too

    def push(self, bound: float, stage: Stage, item) -> None:
        """Queue ``item`` under ``bound`` at ``stage`` (ties: first pushed, first popped); a group already out of its
        variant's reach is dropped here, as ``prune`` would drop it when popped (reach never grows), unless interleaved
        siblings wait on it."""
        if type(item) is GroupItem and not item.interleaved:
            if item.vkey is None:
                item.vkey = variant_key(item.base, self.by_layout)
            if bound > self.reach_one(item.vkey):
                return
        heapq.heappush(self.queue, (bound, stage, self.pushed, item))
        self.pushed += 1

    def beyond(self, bound: float, vkeys: list) -> bool:
        """Whether a bound can neither enter the top K nor change the best of any variant in ``vkeys``."""
        return bound > self.reach(vkeys)

    def reach(self, vkeys: list) -> float:
        """The bound above which an item of the variants ``vkeys`` can neither enter the top K nor change any of their
        bests (``beyond``: bound > K-th time and > each best is bound > the largest of them); inf without a top K."""
        if not self.keep or self.kth == INF:
            return INF
        if not self.variants:
            return self.kth
        return max(self.kth, max((self.best_of.get(v, INF) for v in vkeys), default=-INF))

    def reach_one(self, vkey: tuple) -> float:
        """``reach`` of the one variant ``vkey`` (the bound a popped group is pruned against)."""
        if not self.keep or self.kth == INF:
            return INF
        return max(self.kth, self.best_of.get(vkey, INF)) if self.variants else self.kth

    def seed(self) -> None:
        """Every degrees choice in the queue under its compute-only bound."""
        est, space = self.est, self.space
        for d in space.degrees():
            vs = space.variants(d)
            self.total += degree_size(space, d, vs)
            vkeys = variant_keys(space, d, vs, self.by_layout)
            by_mbs = degrees_floors(est, space, d) if self.keep else {}
            self.queue.append((min(by_mbs.values(), default=0.0), Stage.DEGREES, len(self.queue),
                               DegreesItem(d, vkeys, by_mbs, vs)))
        heapq.heapify(self.queue)
        self.pushed = len(self.queue)

    def expand(self, bound: float, item: DegreesItem) -> None:
        """A degrees choice into the groups of its variants still worth pricing, each under its policy floors."""
        est, d = self.est, item.degrees
        if self.beyond(bound, [k for keys in item.vkeys.values() for k in keys]):
            return
        reach = {key: self.reach(keys) for key, keys in item.vkeys.items()}  # nothing is ranked until expand returns
        found, _, r = degree_groups(est, self.space, d, lambda key, mbs, v: item.by_mbs.get((mbs, v), bound)
                                    <= reach[key], item.variants)
        self.rejected += r
        if larger_micro_batch_wins(est, d.pp):  # ties go to the larger micro-batch, pruned or not
            found = [(base, orders, largest_micro_batches(fitting)) for base, orders, fitting in found]
        cuts: dict = {}  # (variant key, virtual stages) -> the least bound of its dropped micro-batches
        found, waiting = self.defer_interleaved(found, item, cuts) if self.keep else (found, {})
        floors: dict = {}  # (checkpointing, micro-batch, virtual stages) -> Bounds.policy_floor (alike for every group)
        for base, orders, fitting in found:
            vkey, v = variant_key(base, self.by_layout), base.virtual_stages
            cut = self.dropped_floor(item, vkey, v, cuts)
            if not self.keep:
                self.push(bound, Stage.COMMUNICATION, GroupItem(base, orders, fitting, [bound] * len(fitting), cut, d))
                continue
            bounds = []  # each policy's compute with the recomputation it needs to fit
            for p in fitting:
                key = (p[1], p[2], v)
                if key not in floors:
                    floors[key] = max(bound, est.bounds.policy_floor(base, p))
                bounds.append(floors[key])
            g = GroupItem(base, orders, fitting, bounds, cut, d, waiting.get(variant_key(base, True), []))
            self.push(min(bounds), Stage.RECOMPUTE, g)

    def defer_interleaved(self, found: list, item: DegreesItem, cuts: dict | None = None) -> tuple[list, dict]:
        """``found`` without the interleaved groups whose plain-1F1B sibling is there, and those per sibling (variant
        and token layout): each waits on it (``release_interleaved``), with its cut (the least bound of its
        schedule's dropped micro-batches; ``cuts``: ``dropped_floor``'s memo)."""
        plain = {variant_key(b, True) for b, _, _ in found if b.virtual_stages == 1}
        out, waiting = [], {}
        for base, orders, fitting in found:
            key = variant_key(base, True)
            if base.virtual_stages == 1 or key not in plain:
                out.append((base, orders, fitting))
                continue
            waiting.setdefault(key, []).append((base, orders, fitting,
                                                self.dropped_floor(item, variant_key(base, self.by_layout),
                                                                   base.virtual_stages, cuts)))
        return out, waiting

    def dropped_floor(self, item: DegreesItem, vkey: tuple, v: int, cuts: dict | None = None) -> float:
        """The least bound (``DegreesItem.by_mbs``) of the micro-batch sizes under ``v`` virtual stages that are out
        of the variant ``vkey``'s reach (dropped from its groups), or inf: below it a group's priced orders are each
        order's best. ``cuts``: a memo per (vkey, v), kept while no time is ranked (reach does not move)."""
        cut = None if cuts is None else cuts.get((vkey, v))
        if cut is None:
            reach = self.reach_one(vkey)
            cut = min((b for (_, w), b in item.by_mbs.items() if w == v and b > reach), default=INF)
            if cuts is not None:
                cuts[vkey, v] = cut
        return cut

    def release_interleaved(self, g: GroupItem) -> None:
        """Queue ``g``'s interleaved siblings to be priced, each policy under ``interleaving_floor`` x a lower bound
        on its plain-1F1B step (``g.lower``; a policy ``g`` never held, its own ``policy_floor``): where the
        micro-batches far outnumber the stages that is near the plain step, so a sibling that cannot beat the
        K-th time or its variant's best is dropped before its own bounds are built."""
        est = self.est
        for base, orders, fitting, cut in g.interleaved:
            bounds = [interleaving_floor(est, base, p[2]) * g.lower[p] if p in g.lower
                      else est.bounds.policy_floor(base, p) for p in fitting]
            self.push(min(bounds), Stage.RECOMPUTE, GroupItem(base, orders, fitting, bounds, cut, g.degrees))
        g.interleaved = []

    def prune(self, bound: float, g: GroupItem) -> bool:
        """Drop ``g``'s policies whose bound is out of reach (their least bound lowers ``cut``); False: none left."""
        if g.vkey is None:
            g.vkey = variant_key(g.base, self.by_layout)
        reach = self.reach_one(g.vkey)
        if bound > reach:
            self.finish_plain(g, bound)
            return False
        if max(g.bounds, default=-INF) > reach:
            g.cut = min(g.cut, *(b for b in g.bounds if b > reach))
            if g.interleaved:
                g.lower.update((p, max(b, bound)) for p, b in zip(g.fitting, g.bounds) if b > reach)
            kept = [(p, b) for p, b in zip(g.fitting, g.bounds) if b <= reach]
            if not kept:
                self.finish_plain(g, bound)
                return False
            g.fitting, g.bounds = [p for p, _ in kept], [b for _, b in kept]
        return True

    def finish_plain(self, g: GroupItem, bound: float) -> None:
        """A plain-1F1B group dropped at ``bound``: its remaining policies' bounds to its interleaved siblings."""
        if g.interleaved:
            g.lower.update((p, max(b, bound)) for p, b in zip(g.fitting, g.bounds))
            self.release_interleaved(g)

    def compute_floors(self, g: GroupItem, forward_floor: bool = False, batch=None) -> tuple[list[float], bool]:
        """Per fitting policy of ``g``, ``Bounds.compute_bounds`` (with ``forward_floor``, the forward attention at its
        even share where its schedule is not built yet), and whether that floor was read (False: the exact bound);
        where bounds are shared down from the largest micro-batch (``shared_bounds``), its checkpointing's value at
        that micro-batch, a hair below (its ties with the smaller ones); with ``batch``, the attention's communication
        at its floor under every order in it."""
        est, base = self.est, g.base
        rep = shared_bounds(est, g.degrees.pp, (base.algorithm,), g.fitting)
        policies = g.fitting if rep is None else list(rep.values())
        floors, floored = est.bounds.compute_bounds_floored(base, policies, forward_floor, batch)
        if rep is not None:
            at = dict(zip(rep, floors))
            floors = [at[p[1]] * (1 - 1e-12) for p in g.fitting]
        return floors, floored

    def tighten(self, bound: float, stage: Stage, g: GroupItem) -> None:
        """Queue ``g`` again under the next stage's bound (``Stage``)."""
        est, d, base = self.est, g.degrees, g.base
        if stage in (Stage.RECOMPUTE, Stage.BACKWARD):  # per policy, the compute-only bound (no link costed)
            floors, floored = self.compute_floors(g, forward_floor=stage == Stage.RECOMPUTE and bool(self.keep))
            g.bounds = [max(b, c) for b, c in zip(g.bounds, floors)]
            return self.push(max(bound, min(g.bounds)), Stage.BACKWARD if floored else Stage.COMPUTE, g)
        batch = order_batch(est, base, g.orders, self.batches)
        if stage == Stage.COMPUTE:  # per policy: the compute and the attention's communication at its order-free floor
            g.bounds = [max(b, c) for b, c in zip(g.bounds, self.compute_floors(g, batch=batch)[0])]
            return self.push(max(bound, min(g.bounds)), Stage.LINKS, g)
        if stage == Stage.LINKS:  # per policy: all but the attention's communication, exact (comm_bounds)
            rep = shared_bounds(est, d.pp, (base.algorithm,), g.fitting)
            whole = single_micro_batch(est, base)
            if rep is None or whole:
                tight = est.bounds.comm_bounds(base, batch, g.fitting, sync=whole)
            else:  # per checkpointing, at the group's largest micro-batch (one shape's parts for all: shared_bounds)
                at = dict(zip(rep, est.bounds.comm_bounds(base, batch, at_largest_micro_batch(rep), sync=False)))
                tight = [at[p[1]] for p in g.fitting]
            g.bounds = [max(b, c) for b, c in zip(g.bounds, tight)]
            # one micro-batch a step: the sync is in already, and with one micro-batch size none is dropped for it
            return self.push(max(bound, min(g.bounds)), Stage.SYNC if whole else Stage.COMMUNICATION, g)
        # about to be priced: the gradient sync (routed now, pricing needs it) in the bound, behind the backward's
        # exact window (the backward priced now, as pricing needs it too)
        if per_sequence_costs_never_grow(est, d.pp):  # the same where the gradient sync stays at its floor
            kept = hidden_sync_micro_batches(est, base, batch, g.fitting)
            g.bounds = [b for p, b in zip(g.fitting, g.bounds) if p in kept]
            g.fitting = kept
        g.bounds = [max(b, c) for b, c in zip(g.bounds, est.bounds.comm_bounds(base, batch, g.fitting,
                                                                             exact_window=True))]
        self.push(max(bound, min(g.bounds)), Stage.SYNC, g)

    def price(self, g: GroupItem) -> None:
        """Price ``g``'s orders under its fitting policies; rank those no slower than its cut."""
        est, base = self.est, g.base
        if not self.keep and per_sequence_costs_never_grow(est, g.degrees.pp):  # an exhaustive search's last stage
            g.fitting = hidden_sync_micro_batches(est, base, order_batch(est, base, g.orders, self.batches), g.fitting)
        times = est.evaluate_orders(base, order_batch(est, base, g.orders, self.batches), g.fitting)[0]
        if g.interleaved:  # each policy's fastest order: what its interleaved siblings' bounds scale
            g.lower.update(zip(g.fitting, (float(t) for t in times.min(axis=0))))
            self.release_interleaved(g)
        priced = best_orders(base, g.orders, g.fitting, times, g.cut)
        self.evaluated += len(g.orders) * len(g.fitting)
        if not priced:
            return
        self.ranked += priced
        vkey = variant_key(base, self.by_layout)
        self.best_of[vkey] = min(self.best_of.get(vkey, float("inf")), min(t for t, _ in priced))
        if self.keep:
            for t, _ in priced:
                self.top.add(t)
            self.kth = self.top.kth()
            if self.exchange is not None:
                self.kth = self.exchange.trade(self.kth, vkey, self.best_of)

    def run(self) -> SearchResult:
        """Pop the least bound until the queue is empty; every ranked time is exact."""
        self.seed()
        queue, pop, progress, exchange = self.queue, heapq.heappop, self.progress, self.exchange
        degrees, sync, communication = Stage.DEGREES, Stage.SYNC, Stage.COMMUNICATION  # read once, not per pop
        while queue:
            bound, stage, _, item = pop(queue)
            self.done += 1
            if progress:
                progress(self.done, self.pushed)
            if exchange is not None and not self.done % TRADE_EVERY:
                self.kth = exchange.pull(self.kth, self.best_of)
            if stage == degrees:
                self.expand(bound, item)
            elif self.prune(bound, item):
                if stage == sync or (stage == communication and not self.keep):
                    self.price(item)
                else:
                    self.tighten(bound, stage, item)
        if self.progress:
            self.progress(self.pushed, self.pushed)
        self.ranked.sort(key=lambda tc: (round(tc[0], 12), _sort_key(tc[1])))
        return SearchResult(self.ranked, self.evaluated, self.total, self.rejected, self.est)


def grid_search(cluster: Cluster, model: ModelSpec, workload: Workload, space: Space | None = None,
                progress: Callable[[int, int], None] | None = None, keep: int | None = 5,
                params: Params | None = None, distinct: bool = False, variants: bool = True,
                exchange: Exchange | None = None) -> SearchResult:
    """Rank the valid layouts; for each (degrees, order, token layout) its fastest fitting policy.

    Memory fits are found once per degrees and dominated policies dropped; all mesh orders of a
    degrees choice are priced together as arrays (estimate.Orders). With ``keep`` = K the search is
    best-first over lower bounds: every degrees choice enters a queue with a bound valid for all its
    variants, layouts, orders and policies (``Estimator.micro_batch_bounds``: compute only, attention at
    its even share). Popped, it is expanded into its (variant, layout) groups, each policy under its compute with
    the recomputation it needs (``Bounds.policy_floor``); a popped group is tightened per policy by its compute-only
    bound (``Bounds.compute_bounds``: no link costed, most groups end there), then by that bound with every layer
    part's communication at its floor under every mesh order (``LinkEngine.pattern_floor``: no order's links loaded,
    most of the rest end there), then by ``Bounds.comm_bounds``
    (every cost but the gradient sync exact, the attention at ``Estimator.attention_floor``), then by its gradient
    sync (routed only for groups that got this far, but from the start where a step is one micro-batch,
    ``single_micro_batch``), and priced when popped again.
    An item or policy whose bound exceeds both the K-th best time found so far and the best time of each
    algorithm variant it covers cannot enter the top K nor change a variant's best, so it is dropped (memory,
    schedules and prices are never built for it); a group's priced orders slower than its least dropped policy
    bound are dropped too (they might not be their order's best), so every ranked time is exact. Without a
    pipeline a smaller micro-batch is dropped where a larger one of the same ZeRO stage and checkpointing is
    never slower (``larger_micro_batch_wins``; under per-call costs, ``hidden_sync_micro_batches``, once the
    group's sync is routed), and bounds are shared down from the largest micro-batch (``shared_bounds``). A
    pipeline's interleaved schedule (``Space.virtual_stages``) is a group of its own, queued once its plain-1F1B
    sibling is priced or dropped, under ``interleaving_floor`` x the sibling's bound per policy: it is priced only
    where the bubble it saves could make it a variant's best or enter the top K.
    ``keep=None`` prices all. With ``distinct``, K counts distinct step times (times equal within
    ``equivalent.REL_TOL`` count once): every layout no slower than the K-th distinct time is ranked, so the
    equivalent layouts of the first K rows are all there (``equivalent.top_rows``) from this one pass.
    ``params``: calibrated physical parameters (planner/params.py); None: the uncalibrated engine. With ``variants``
    False only the top K is exact (no variant's best is kept), so items are pruned against the K-th time alone: a
    search for the winner and nothing else (the sensitivity's).
    ``exchange`` (``planner.exchange``): the search is one share of a split space (``planner.partition``), and
    prunes against the other shares' K-th time and variant bests too, as they publish them.
    The search allocates ~10^5 acyclic objects at large worlds; a process that owns its garbage collector (the CLI,
    the service's search processes) may pause it around the call (``service.collector.collector_paused``).
    """
    est = Estimator(cluster, model, workload, params=params)
    return _Grid(est, space or Space(cluster.world_size, model, workload), keep, distinct, progress, variants,
                 exchange).run()


class Fastest:
    """The ``k`` smallest step times seen, or with ``distinct`` the ``k`` smallest distinct ones (times within
    ``REL_TOL`` of a kept one count as it); ``kth`` is the threshold above which nothing can enter them."""

    def __init__(self, k: int, distinct: bool = False):
        self.k, self.distinct, self.times = k, distinct, []  # ascending

    def add(self, t: float) -> None:
        """Count a priced time."""
        ts = self.times
        if len(ts) == self.k and t >= ts[-1]:
            return
        i = bisect_left(ts, t)
        if self.distinct and any(abs(t - ts[j]) <= REL_TOL * max(abs(t), abs(ts[j]))
                                 for j in (i - 1, i) if 0 <= j < len(ts)):
            return  # an equivalent time: the same row's cost
        ts.insert(i, t)
        if len(ts) > self.k:
            ts.pop()

    def kth(self) -> float:
        """The K-th time (distinct: widened by REL_TOL, so its equivalents are kept), or inf before K are seen."""
        if len(self.times) < self.k:
            return float("inf")
        return self.times[-1] * (1 + REL_TOL) if self.distinct else self.times[-1]


def fastest_policy(est: Estimator, base: Candidate, policies: list[tuple[int, str]] | None = None):
    """The Prediction of ``base`` under its fastest fitting memory policy (ZeRO stage x checkpointing, micro-batch
    1; default: every one), or None when none fits (the papers' tables fix the degrees and leave the policy)."""
    best = None
    for z, ck in policies or [(z, ck) for ck in CHECKPOINTING for z in (0, 1, 2, 3)]:
        c = base.with_memory(z, ck, 1)
        if est.fits(c):
            p = est.predict(c)
            if best is None or p.step_time_s < best.step_time_s:
                best = p
    return best


def variant_key(c: Candidate, by_layout: bool = False) -> tuple:
    """Which algorithm variant a layout is: algorithm, WallFacer/TokenRing team size, placement (``by_layout``: and
    its token layout, the balancing policy of a workload with documents)."""
    return (c.algorithm, c.team, c.placement, c.token_layout) if by_layout else (c.algorithm, c.team, c.placement)


def by_policy(work: Workload) -> bool:
    """Whether the best of each algorithm is per balancing policy too: with documents, the policy is the choice."""
    return work.documents is not None


def variant_keys(space: Space, d: Degrees, vs: list, by_layout: bool) -> dict[tuple, list[tuple]]:
    """Per variant of the degrees ``d`` (algorithm, team, placement), the variant keys its groups are ranked under."""
    out = {}
    for v in vs:
        key = (v.algorithm, v.team, v.placement)
        layouts = v.layouts if v.layouts is not None else space.layouts(d)
        out[key] = [key + (t,) for t in layouts] if by_layout else [key]
    return out


def best_per_variant(ranked: list[tuple[float, Candidate]], by_layout: bool = False) -> list[tuple[float, Candidate]]:
    """The fastest layout of every algorithm variant (``by_layout``: and token layout), fastest first (from a ranked
    list)."""
    seen, out = set(), []
    for t, c in ranked:
        key = variant_key(c, by_layout)
        if key not in seen:
            seen.add(key)
            out.append((t, c))
    return out


def _sort_key(c: Candidate) -> tuple:
    return (c.algorithm, c.dp, c.pp, c.tp, c.ulysses, c.ring, c.team, c.placement or "", c.order, c.token_layout,
            c.virtual_stages, c.zero_stage, c.checkpointing, c.micro_batch_size)


def finish(result: SearchResult, cluster: Cluster, model: ModelSpec, workload: Workload, top_k: int) -> list[Plan]:
    """Full Plans (predictions with breakdown, cluster fingerprint) for the ``top_k`` best; as plan files hold
    them, without groups (``Plan.with_groups`` derives them)."""
    return [_finished(result, c, cluster, model, workload) for _, c in result.ranked[:top_k]]


def finish_each(result: SearchResult, cluster: Cluster, model: ModelSpec, workload: Workload) -> list[Plan]:
    """Full Plans for the fastest layout of every algorithm variant, with documents of every balancing policy too
    (exact under grid pruning too)."""
    return [_finished(result, c, cluster, model, workload)
            for _, c in best_per_variant(result.ranked, by_policy(workload))]


def _finished(result: SearchResult, c: Candidate, cluster: Cluster, model: ModelSpec, workload: Workload) -> Plan:
    """The Plan of ``c``, with its prediction made ahead (``predict_ahead``; each used once), else made now."""
    est = result.estimator
    predicted = result.predicted.pop(c, None) or est.predict(c)
    return est.with_stages(c).to_plan(cluster=cluster.name, cluster_fingerprint=est.fingerprint, model=model,
                                      workload=workload, predicted=predicted, profile=result.profile)


def predict_ahead(result: SearchResult, workload: Workload, keep: int | None,
                  exchange: Exchange | None = None) -> dict:
    """The predictions ``finish`` and ``finish_each`` may ask of a share's ranking: its first ``keep`` distinct step
    times' layouts and the best of each variant, but for a variant another share already beat (``exchange``). A share
    searched in a worker makes them there, beside the others, rather than in the process that merges the rankings,
    whose caches hold none of that share's schedules."""
    ranked, by_layout = result.ranked, by_policy(workload)
    head = ranked[:distinct_prefix(ranked, keep)] if keep else []
    bests = [(t, c) for t, c in best_per_variant(ranked, by_layout)
             if exchange is None or not exchange.beaten(variant_key(c, by_layout), t)]
    wanted = dict.fromkeys(c for _, c in [*head, *bests])
    return {c: result.estimator.predict(c) for c in wanted}


def no_plan_error(cluster: Cluster, workload: Workload, result: SearchResult) -> PlanError:
    W = cluster.world_size
    trials = getattr(result, "trials", 0)  # a Bayesian search's: it samples the degrees, and may miss every valid one
    if trials and not result.visited:
        return PlanError("trials", f"no valid layout of {W} ranks in {trials} trial(s)",
                         "raise --trials, or use --search grid (every layout, and why none is valid)")
    if not result.space:
        return PlanError("seq_len", f"no layout of {W} ranks can split {workload.seq_len} tokens over its sequence "
                         f"and tensor ranks", f"use a sequence length divisible by {2 * W}")
    mem = cluster.device(0).memory_bytes / 2**30  # a plan may use MEMORY_HEADROOM of it: what plan prints "of"
    return PlanError("workload", f"no layout of {W} ranks fits in memory ({result.rejected} degree choices tried, "
                     f"{mem * MEMORY_HEADROOM:.1f} GiB usable of {mem:.1f} GiB per device)",
                     "use more nodes, a shorter --seq-len or a smaller --batch")


def ranked_rows(result: SearchResult, cluster: Cluster, model: ModelSpec, workload: Workload, top: int,
                profile: Profile | None = None, params: Params | None = None) -> RankedPlans:
    """The first ``top`` rows of a ranking whose first ``top`` distinct step times are exact (equivalent plans share
    a row: equivalent.top_rows), finished as plan files hold them; with a ``profile``, the layouts its tune measured
    for this model and workload rank by their measured step (planner/measured.py)."""
    rows = top_rows(result, lambda r, n: finish(r, cluster, model, workload, n), top)
    return RankedPlans(rank_rows(rows, cluster, profile, params or Params(), model, workload)[:top])


def plan(cluster: Cluster, model: ModelSpec, workload: Workload, top_k: int = 5,
         progress: Callable[[int, int], None] | None = None, space: Space | None = None,
         profile: Profile | None = None, *, params: Params | None = None) -> RankedPlans:
    """The ``top_k`` best rows for this cluster, model and workload, fastest first (deterministic), each with its
    equivalent plans; pure: it prices with ``params`` (None: the ``profile``'s, else ``Params()``, the engine's bare
    terms, not the presets' defaults that ``sp_plan.plan(..., profile=False)`` and ``--no-profile`` price with:
    pass ``params=sp_plan.profiles.kernels.default_params(cluster)`` for those) and opens no store. ``profile``, a
    loaded Profile: the layouts its tune measured rank by their measured step. ``sp_plan.plan`` (the pipeline) looks
    the cluster's profile up and calls this."""
    pure_inputs(cluster, model, workload, "sp_plan.plan")
    top_k = whole_number("top_k", top_k, 1, "ask for top_k >= 1 rows")
    params = pure_params(profile, params, "sp_plan.plan")
    res = grid_search(cluster, model, workload, space, progress, keep=top_k, params=params, distinct=True)
    res.profile = profile_tag(profile)
    if not res.ranked:
        raise no_plan_error(cluster, workload, res)
    return ranked_rows(res, cluster, model, workload, top_k, profile, params)


def profile_tag(prof) -> str | None:
    """What a Plan records of the profile that priced it: its id, "file" for one without, None for none."""
    return None if prof is None else (prof.id or "file")
