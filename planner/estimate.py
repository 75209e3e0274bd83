"""Predict a layout's step time, throughput, MFU and peak memory from its schedule on the cluster.

Step (training, 1F1B over pp stages, m micro-batches): (m + pp - 1) x stage + exposed gradient
sync, where stage = layers/pp x (forward + recompute + backward of a block) + lm head + stage
sends. The pipeline bubble is (pp - 1) x stage, i.e. (p-1)/(m+p-1) of the pipeline time. Interleaved 1F1B
(``virtual_stages`` v, Narayanan et al. 2021 §2.2.2) runs each stage as v chunks: the bubble is (pp - 1) x stage / v
and the stage sends v times as many (each micro-batch crosses v boundaries a rank). Uneven stages
(``stage_layers``, planner/stages.py) run at the pace of the busiest: the most layers before the last stage, or
the last's layers and the lm head; memory is the largest stage's.

Per-layer costs are cached by the schedule's shape and the group shapes of the dimensions it
communicates on, so the grid search prices most candidates with a few dictionary lookups.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property, reduce

import numpy as np

from .bounds import Bounds

from .candidate import Candidate
from .cluster import Cluster, preset_nodes
from .engine import GroupShape, LinkEngine
from .errors import PlanError, of_type
from .layout import chunks_needed, merged_name, ring_split
from .memory import activation_bytes, attention_buffer_bytes, weight_bytes
from .masks import mask_fraction
from .merges import MERGES
from .model import ModelSpec, Workload, micro_batches
from .params import LINK_CLASSES, Params
from .profile import Profile, pure_inputs, pure_params
from .algorithms import ALGORITHMS
from .plan import TEAM_ALGORITHMS, PhaseCost, Plan, Prediction, check_kv_chunks_algorithm
from .parts import RING_FREE_PARTS, SCHEDULE_PARTS, schedule_key
from .schedules import (DDP_BUCKET_BYTES, Comm, Compute, Shape, Step, attention_steps, bucket_share,
                        bucketed_exposure, grad_sync, scaled, shard_params)
from .stages import (balanced_stage_layers, bubble_time, busiest_stage, check_interleaved_micro_batches,
                     check_virtual_stages, pipeline_time, resolve_stage_layers)


#: fraction of device memory a plan may use (the rest: CUDA context, allocator fragmentation)
MEMORY_HEADROOM = 0.9


@dataclass(frozen=True)
class Priced:
    """Cost of a list of steps run once, per mesh order: total seconds, compute seconds, breakdown rows."""

    seconds: np.ndarray
    compute: float
    rows: tuple  # (name, kind, group, bytes, seconds[orders], exposed[orders])
    # seconds its communication holds each link class (params.LINK_CLASSES x orders), where asked (``price``); None:
    # not counted, read as none (a lower bound's parts)
    links: np.ndarray | None = None


@dataclass
class SearchStats:
    """Work of one Estimator: schedules built and looked up, layer prices computed (per schedule shape and
    mesh-order batch); the link engine counts its own evaluations (``LinkEngine.evaluations``)."""

    schedules_built: int = 0
    schedule_lookups: int = 0
    prices_computed: int = 0


@dataclass
class Evaluation:
    step_time_s: float
    memory: dict[str, float]
    rows: list | None = None

    @property
    def peak_memory_bytes(self) -> float:
        return sum(self.memory.values())


class Orders:
    """One set of degrees under several mesh orders: communication costs as arrays over the orders.

    A phase over dimensions D depends on an order only through the strides of D, so each distinct
    stride combination is costed once and mapped back to the orders that share it. ``params`` (the
    Estimator's) applies its CommFit per pattern and the bottleneck's link class (intra / inter)."""

    def __init__(self, engine: LinkEngine, degrees: dict[str, int], orders: list[tuple[str, ...]],
                 placement: str | None = None, params: Params | None = None, per_shape: dict | None = None):
        """``per_shape``: (pattern, group parts, world) -> a step's coefficients, kept across the batches priced with
        one engine and params (many meshes put some of their groups alike); None: this batch's own."""
        self.engine, self.degrees, self.orders, self.placement = engine, degrees, orders, placement
        self.params = params
        self._per_shape = {} if per_shape is None else per_shape
        self.world = 1
        for n, v in degrees.items():
            if n != "team":
                self.world *= v
        self.strides: list[dict[str, int]] = []
        for order in orders:
            stride, st = 1, {}
            for n in order:
                st[n] = stride
                stride *= degrees.get(n, 1)
            self.strides.append(st)
        self._coeff: dict = {}
        self._classes: dict = {}  # (pattern, dims) -> each order's link class of the phase (LINK_CLASSES index)
        self._shapes: dict = {}  # dims -> their groups' distinct shapes and each order's (_group_shapes)
        # what phases off the ring's teams see: every variant (team, placement) of these degrees shares it
        self.mesh_key = (tuple(sorted((n, v) for n, v in degrees.items() if n != "team")), tuple(orders))

    def shape(self, k: int, dims: tuple[str, ...]) -> GroupShape:
        """Shape of the groups of ``dims`` (merged, first fastest) under order number ``k``."""
        return GroupShape(self._parts(k, dims), self.world)

    def _parts(self, k: int, dims: tuple[str, ...]) -> tuple[tuple[int, int], ...]:
        """``shape``'s (size, stride) parts."""
        st = self.strides[k]
        parts = []
        for n in dims:
            if n in ("team", "sub_ring", "team_ring"):
                parts += self._ring_split(n, st)
            elif self.degrees.get(n, 1) > 1 and n in st:
                parts.append((self.degrees[n], st[n]))
        return tuple(parts)

    def _ring_split(self, name: str, st: dict[str, int]) -> list[tuple[int, int]]:
        """Groups inside the ring dimension, from the layout module's positions (WallFacer eq. 8 placements):
        ``team`` (C ranks), WallFacer's ``sub_ring`` (P/C^2 ranks, Algorithm 3), and ``team_ring`` (the P/C
        first members of the teams: TokenRing x Ring's ring across teams)."""
        C, P = self.degrees.get("team", 1), self.degrees.get("ring", 1)
        if "ring" not in st or P == 1:
            return []
        size, step = ring_split(P, C, self.placement, name)
        return [(size, step * st["ring"])] if size > 1 else []

    def time(self, p: Comm) -> np.ndarray:
        """Seconds of phase ``p`` under each order (engine costs are linear in bytes)."""
        steps, spb, lat = self.coefficients(p)
        return steps * (p.nbytes * spb + lat)

    def _group_shapes(self, dims: tuple[str, ...]) -> tuple[list, np.ndarray]:
        """The distinct (size, stride) parts of the groups of ``dims`` over the orders, and each order's index into
        them: once per dims (the patterns on the same dimensions share them)."""
        out = self._shapes.get(dims)
        if out is None:
            by_shape: dict = {}
            idx = []
            for k in range(len(self.orders)):
                sh = self._parts(k, dims)
                if sh not in by_shape:
                    by_shape[sh] = len(by_shape)
                idx.append(by_shape[sh])
            out = self._shapes[dims] = (list(by_shape), np.array(idx))
        return out

    def coefficients(self, p: Comm) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per order: the steps of ``p``'s pattern on its groups, seconds per byte and latency of each step."""
        key = (p.pattern, p.dim)
        co = self._coeff.get(key)
        if co is None:
            shapes, pick = self._group_shapes(p.dim)
            steps, spb, lat = zip(*(self._shape_coefficients(p.pattern, sh) for sh in shapes))
            co = self._coeff[key] = (np.array(steps, float)[pick], np.array(spb)[pick], np.array(lat)[pick])
        return co

    def classes(self, p: Comm) -> np.ndarray:
        """Per order, the link class (its index in ``LINK_CLASSES``) of ``p``'s most loaded link."""
        key = (p.pattern, p.dim)
        cls = self._classes.get(key)
        if cls is None:
            shapes, pick = self._group_shapes(p.dim)
            index = [LINK_CLASSES.index(self.engine.cost(p.pattern, GroupShape(sh, self.world)).link_class)
                     for sh in shapes]
            cls = self._classes[key] = np.array(index)[pick]
        return cls

    def _shape_coefficients(self, pattern: str, parts: tuple) -> tuple[int, float, float]:
        """(steps, seconds per byte, latency of a step) of ``pattern`` on the groups of ``parts``: the link engine's
        cost, through the pattern's CommFit where ``params`` has one (bandwidth / efficiency, alpha added per step,
        StepCost.time); none: the link model as is."""
        key = (pattern, parts, self.world)
        v = self._per_shape.get(key)
        if v is None:
            c = self.engine.cost(pattern, GroupShape(parts, self.world))
            f = self.params.comm_fit(pattern, c.link_class) if self.params is not None else None
            v = self._per_shape[key] = ((c.steps, c.sec_per_byte, c.latency) if f is None else
                                        (c.steps, c.sec_per_byte / f.efficiency, c.latency + f.alpha_s))
        return v


#: the part a checkpointing recomputes inside the backward (``SCHEDULE_PARTS``)
RECOMPUTED = {"full": "fwd", "attention_boundary": "fwd-linear"}


def shared_cores(balance: tuple, s: float) -> float:
    """The busiest rank's share of an uneven attention phase's time (its kernels, and their per-call overhead where
    that follows the work, ``Compute.trimmed``: both work on the host where ranks share cores): per round it stands for, max(mean / max work, 1 / s) (as long as the
    host's total work on the cores, or the busiest rank's alone at s x its speed among busy peers:
    ``Params.solo_speedup``), averaged over the rounds; the rings pool the balance over their rounds
    (``layout.ring_balance``)."""
    return sum(b if b > 1 / s else 1 / s for b in balance) / len(balance)


def add_held(held: np.ndarray, st: Step, comms: list, classes: list, cols: np.ndarray) -> None:
    """Add to ``held`` (link classes x orders) the seconds one step's communication phases (``comms``, each per order,
    on the link class ``classes`` per order; ``cols``: the orders' indices) hold each link class, times its repeats:
    a plain step's phases one after another (their sum), an overlapped step's side by side (the longest on each
    class)."""
    if not st.overlap or len(comms) == 1:
        for ct, cls in zip(comms, classes):
            held[cls, cols] += ct * st.repeat
        return
    one = np.zeros_like(held)
    for ct, cls in zip(comms, classes):
        one[cls, cols] = np.maximum(one[cls, cols], ct)
    held += one * st.repeat


def sync_window(layer: Priced, classes: list[np.ndarray]) -> np.ndarray:
    """Per order, the seconds of one layer's pass (``layer``: its forward or backward) in which the gradient sync's
    links are free: its wall time less what its own communication holds the link class of each sync phase
    (``classes``: per order) for, the most of them. Compute alone does not bound the window: a sync on links the pass
    leaves idle runs beside its communication too, and one on links the pass's transfers keep busy waits for them (so
    a faster device never exposes more of it than the pass gains). A priced part without link loads (a lower bound's)
    holds none."""
    if layer.links is None:
        return layer.seconds
    cols = np.arange(len(layer.seconds))
    held = reduce(np.maximum, (layer.links[cls, cols] for cls in classes))
    return np.maximum(layer.seconds - held, 0.0)


def _scaled(priced: Priced, k: float, i: int = 0) -> list:
    return [(n, kind, g, b * k, float(s[i]) * k, float(x[i]) * k) for n, kind, g, b, s, x in priced.rows]


def _sizes_key(dp: int, sp: int, tp: int, pp: int, mbs: int, stage_layers, checkpointing: str,
               virtual_stages: int) -> tuple:
    """``Estimator._activation_total``'s cache key for an algorithm without its own activations: the sizes
    ``memory.activation_bytes`` reads (a rank's tokens read ulysses x ring, not how it splits), so every variant
    and split of those sizes shares one value."""
    return (dp, sp, tp, pp, mbs, stage_layers), checkpointing, virtual_stages


class Estimator:
    """Prices layouts for one (cluster, model, workload); reuse it across candidates (costs are cached)."""

    def __init__(self, cluster: Cluster, model: ModelSpec, workload: Workload, engine: LinkEngine | None = None,
                 params: Params | None = None, schedules: dict | None = None):
        """``schedules``: a schedule cache to share with other Estimators of this model and workload whose params
        have the same ring merge (the only parameter a schedule depends on), as a calibration's trial params do."""
        self.cluster, self.model, self.work = cluster, model, workload
        self.engine = engine or LinkEngine(cluster)  # link costs do not depend on params: shareable
        self.params = params if params is not None else Params()
        self.device = cluster.device(0)
        dt = model.dtype
        if dt not in self.device.peak_flops:
            raise PlanError("model.dtype",
                            f"{self.device.model or self.device.name} has no peak FLOP/s for {dt} in the cluster",
                            f"use a dtype it lists {sorted(self.device.peak_flops)} "
                            f"or add peak_flops.{dt} to the device in the cluster file")
        self.peak = self.device.peak_flops[dt]
        self._merge = MERGES[self.params.ring_merge]  # the ring merge the schedules price (Shape.merge)
        self._compute_peak = self.peak * self.params.compute_efficiency  # what compute phases achieve in a step
        self.capacity = self.device.memory_bytes * MEMORY_HEADROOM
        self._memory: dict = {}
        self.stats = SearchStats()
        self._schedules: dict = {} if schedules is None else schedules  # schedule_key -> steps (Shape.merge)
        self._prices: dict = {}  # (Orders, schedule_key, rows) -> Priced
        self._busy: dict = {}  # schedule_key -> compute seconds of its steps
        self._shapes: dict = {}  # candidate sizes -> Shape
        self._sizes: dict = {}  # (dp, ulysses, ring, tp, pp, mbs, stage layers) -> a Shape of them (``_shape``)
        self._curve_at: dict = {}  # (backward, block length) -> attention efficiency read from params' curves
        self._acts: dict = {}  # (sizes, checkpointing) -> activation bytes (fitting)
        self._per_shape: dict = {}  # (pattern, group parts, world) -> Orders' coefficients of one step
        self.bounds = Bounds(self)  # the search's lower bounds over these prices (planner/bounds.py)

    @cached_property
    def matmul_never_falls(self) -> bool:
        """Whether the params' GEMM efficiency curve never falls with the size (none: a constant efficiency)."""
        m = self.params.matmul
        return m is None or all(y0 <= y1 for (_, y0), (_, y1) in zip(m.points, m.points[1:]))

    @cached_property
    def fingerprint(self) -> str:
        """The cluster's fingerprint (a hash of its whole model: made once, where a plan is checked or written)."""
        return self.cluster.fingerprint()

    # ---- schedules and their prices, once per shape
    def schedule(self, part: str, c: Shape) -> list[Step]:
        """Steps of one schedule part (``SCHEDULE_PARTS``) of shape ``c``, built once per ``schedule_key``."""
        key = schedule_key(part, c)
        self.stats.schedule_lookups += 1
        steps = self._schedules.get(key)
        if steps is None:
            one = self.unit(part, c)
            if one is not c:  # built once for one sequence per micro-batch, then scaled (schedules.scaled)
                steps = scaled(self.schedule(part, one), c.mbs)
            elif part in ("fwd", "bwd"):  # layer_schedule: the linear part, then the attention
                steps = self.schedule(part + "-linear", c) + attention_steps(c, backward=part == "bwd")
            else:
                steps = SCHEDULE_PARTS[part](c, self.work.training)
            self._schedules[key] = steps
            self.stats.schedules_built += 1
        return steps

    def unit(self, part: str, c: Shape) -> Shape:
        """The shape whose schedule ``part`` of ``c`` is scaled from: one sequence per micro-batch where every
        volume is linear in it (the linear parts; ``Algorithm.batch_linear`` attention), else ``c`` itself."""
        if c.mbs == 1 or not (part in RING_FREE_PARTS or ALGORITHMS[c.algorithm].batch_linear):
            return c
        key = c.key[:6] + (1,) + c.key[7:]
        return self._shapes.get(key) or self._shape(key)

    def price_part(self, part: str, c: Shape, orders: Orders, rows: bool = False) -> Priced:
        """``price`` of a schedule part under a batch of mesh orders, once per (orders, schedule shape)."""
        skey = schedule_key(part, c)
        key = (orders.mesh_key if part in RING_FREE_PARTS else orders, skey, rows)
        priced = self._prices.get(key)
        if priced is None:
            priced = self._prices[key] = self.price(self.schedule(part, c), orders, rows=rows,
                                                          links=self.work.training and part in ("fwd", "bwd"))
            self.stats.prices_computed += 1
        return priced

    def busy(self, part: str, c: Shape) -> float:
        """Compute seconds of a schedule part (no communication): the lower bound's building block."""
        key = schedule_key(part, c)
        t = self._busy.get(key)
        if t is None:
            one = self.unit(part, c)
            if one is c:
                t = sum(self.compute_time(p) * st.repeat for st in self.schedule(part, c)
                        for p in st.phases if isinstance(p, Compute))
            else:  # the phases of the scaled schedule, without building it (the same numbers as schedules.scaled)
                k, ct = c.mbs, self.compute_time
                t = sum(ct(p, k) * st.repeat for st in self.schedule(part, one) for p in st.phases
                        if isinstance(p, Compute))
            self._busy[key] = t
        return t

    def calls(self, p: Compute, share: float | None = None) -> float:
        """Attention calls of ``p`` that pay the per-call overhead on the busiest rank's time: its calls, times its
        ``share`` (``self.share(p)`` unless given) where the round's fixed cost follows the work (``Compute.trimmed``:
        a rank with no block gets no message), else all of them (a ring round passes K, V to every rank, which syncs
        and forwards it whether or not it has a block to compute: runtime/variants/ring.py)."""
        if not p.trimmed:
            return p.calls
        return p.calls * (self.share(p) if share is None else share)

    def share(self, p: Compute) -> float:
        """``shared_cores`` of an attention phase's balance where ranks share cores, else 1."""
        s = self.params.solo_speedup
        return shared_cores(p.balance, s) if p.balance and s > 1 else 1.0

    # ---- phase costs
    def orders(self, degrees: dict[str, int], orders: list[tuple[str, ...]], placement: str | None = None) -> Orders:
        """An Orders batch priced with this Estimator's engine and params."""
        return Orders(self.engine, degrees, orders, placement, self.params, self._per_shape)

    def compute_time(self, p: Compute, k: int = 1) -> float:
        """FLOPs over peak x efficiency (design.md "How a plan is predicted"); ``k``: of ``p`` with its FLOPs,
        rows and bytes times k (schedules.scaled), without building that phase (the same float).

        Attention: the measured curve params.attention_fwd / attention_bwd at the block length (a part-filled
        block: the square block of as many query x key pairs) when set,
        else the device's saturating curve; plus params.round_overhead_s per call (kernel launch + LSE merge
        + stream sync per ring round). GEMMs: params.matmul at the GEMM's rows when set. Both over
        params.compute_efficiency (in a step / timed alone). Memory-bound passes: their bytes over
        params.hbm_bandwidth (free when unset)."""
        pr = self.params
        flops = p.flops * k  # x 1 is exact: k = 1 gives p's own time
        if p.kind == "memory":  # memory-bound pass (merge, packing): bytes over achieved HBM bandwidth
            return p.nbytes * k / pr.hbm_bandwidth if pr.hbm_bandwidth else 0.0
        if p.kind == "attention":
            t = flops / (self._compute_peak * self.attention_efficiency(p.name.endswith("bwd"), p.block, p.fill,
                                                                        p.masked))
            share = self.share(p)
            if not pr.round_overhead_s:
                return t * share
            return t * share + pr.round_overhead_s * self.calls(p, share)
        if pr.matmul is not None:
            rows = p.rows * k
            eff = pr.matmul.at(rows) if rows > 0 else pr.matmul.points[-1][1]
        else:
            eff = self.device.matmul_efficiency
        return flops / (self._compute_peak * eff)

    def attention_efficiency(self, backward: bool, block: float, fill: float = 1.0, masked: bool = False) -> float:
        """Achieved / peak FLOP/s of an attention call (``compute_time``): the measured curve params.attention_fwd /
        attention_bwd at the block length (a part-filled block: the square block of as many query x key pairs)
        when set, else the device's saturating curve; a block under a causal mask (``Compute.masked``) reads
        params.attention_fwd_masked / attention_bwd_masked at its length where measured (a masked kernel's
        efficiency per computed pair is not a dense one's)."""
        pr = self.params
        if masked:
            curve = pr.attention_bwd_masked if backward else pr.attention_fwd_masked
            if curve is not None:
                key = (backward, "masked", block)
                eff = self._curve_at.get(key)
                if eff is None:
                    eff = self._curve_at[key] = curve.at(block)
                return eff
        curve = pr.attention_bwd if backward else pr.attention_fwd
        if curve is None:
            return self.device.attn_efficiency * block / (block + self.device.attn_half_block)
        x = block * math.sqrt(fill) if 0 < fill < 1 else block
        key = (curve is pr.attention_bwd, x)
        eff = self._curve_at.get(key)
        if eff is None:
            eff = self._curve_at[key] = curve.at(x)
        return eff

    def price(self, steps: list[Step], orders: Orders, rows: bool = False, links: bool = False) -> Priced:
        """Cost of ``steps`` once under every order: an overlapped step costs its max phase (double
        buffering), a plain one the sum; exposed communication is what outlasts the compute. With ``links``, the
        seconds the communication holds each link class (``add_held``)."""
        n = len(orders.orders)
        total = np.zeros(n)
        compute = 0.0
        acc: dict = {}
        free_memory = not self.params.hbm_bandwidth
        held = np.zeros((len(LINK_CLASSES), n)) if links else None
        cols = np.arange(n)
        for st in steps:
            busy = 0.0
            comms = []
            secs = []  # with ``rows``: each phase's seconds (a float, or an array per order), in phase order
            for p in st.phases:
                if isinstance(p, Compute):
                    ct = self.compute_time(p)
                    busy += ct
                else:
                    ct = orders.time(p)
                    comms.append(ct)
                if rows:
                    secs.append(ct)
            if not comms:  # compute alone: the same seconds on every order (no array per step)
                total += busy * st.repeat
                compute += busy * st.repeat
            else:
                # the sum only where it is read (a plain step, or the rows): one array op less per overlapped step
                comm_sum = sum(comms) if rows or not st.overlap else None
                if st.overlap and self.params.overlap != 1.0:
                    # partial overlap: max(c, m) + (1 - overlap) min(c, m) (params.overlap, fitted by calibration)
                    m_ = reduce(np.maximum, comms)
                    t = np.maximum(busy, m_) + (1.0 - self.params.overlap) * np.minimum(busy, m_)
                elif st.overlap:
                    t = np.maximum(busy, reduce(np.maximum, comms))
                else:
                    t = busy + comm_sum
                total += t * st.repeat
                compute += busy * st.repeat
                if links:
                    add_held(held, st, comms, [orders.classes(p) for p in st.phases if not isinstance(p, Compute)], cols)
            if rows:
                self._rows(acc, st, secs, n, busy, t if comms and st.overlap else None,
                           comm_sum if comms else None, free_memory)
        return Priced(total, compute, tuple((k, *r) for k, r in acc.items()), held)

    @staticmethod
    def _rows(acc: dict, st: Step, secs: list, n: int, busy: float, t, comm_sum, free_memory: bool) -> None:
        """Add one step's phases to the breakdown rows ``acc`` (``price``): each phase's seconds x repeats, and what
        of it is exposed (an overlapped step's communication: its share of what outlasts the compute)."""
        hidden = None if t is None else np.maximum(t - busy, 0.0) / np.where(comm_sum > 0, comm_sum, 1.0)
        for p, sec in zip(st.phases, secs):
            if isinstance(p, Compute):
                if p.kind == "memory" and free_memory:
                    continue  # memory passes are free uncalibrated: no row (the breakdown as before them)
                sec = np.full(n, sec)
                kind, group, nbytes, x = "compute", None, 0.0, sec
            else:
                kind, group, nbytes = "communication", merged_name(p.dim), p.nbytes
                x = hidden * sec if st.overlap else sec
            r = acc.setdefault(p.name, [kind, group, 0.0, np.zeros(n), np.zeros(n)])
            r[2] += nbytes * st.repeat
            r[3] = r[3] + sec * st.repeat
            r[4] = r[4] + x * st.repeat

    # ---- validity
    def check(self, cand: Candidate, plan: Plan | None = None) -> None:
        """Constraints of a layout for this model, workload and cluster (PlanError naming the field)."""
        m, w = self.model, self.work
        if plan is not None and plan.cluster_fingerprint and plan.cluster_fingerprint != self.fingerprint:
            raise PlanError("cluster_fingerprint", f"the plan was made for cluster {plan.cluster or '?'} "
                            f"({plan.cluster_fingerprint}), not {self.cluster.name} ({self.fingerprint})",
                            _other_cluster_fix(plan.cluster, self.cluster.name))
        if cand.algorithm not in ALGORITHMS:
            raise PlanError("algorithm", f"{cand.algorithm!r} is not priced yet", f"use one of {list(ALGORITHMS)}")
        alg = ALGORITHMS[cand.algorithm]
        if alg.check:
            alg.check(cand, m, w)
        if cand.world != self.cluster.world_size:
            raise PlanError("degrees", f"the plan uses {cand.world} ranks but the cluster has {self.cluster.world_size}",
                            "make degrees multiply to the cluster's device count")
        if why := m.tp_problem(cand.tp):
            raise PlanError("degrees.tp", why, "pick a tp degree that divides them")
        if m.heads % (cand.tp * cand.ulysses):
            raise PlanError("degrees.ulysses", f"tp {cand.tp} x ulysses {cand.ulysses} does not divide the "
                            f"{m.heads} query heads", "choose tp and ulysses whose product divides the heads")
        if w.batch % (cand.dp * cand.micro_batch_size):
            raise PlanError("degrees.dp", f"dp {cand.dp} x micro_batch_size {cand.micro_batch_size} does not divide "
                            f"the global batch {w.batch}", "choose dp and micro-batch size dividing --batch")
        if plan is not None and plan.stage_layers is None and m.layers % cand.pp:
            raise PlanError("degrees.pp", f"pp {cand.pp} does not divide the {m.layers} layers",
                            f"give stage_layers (balanced: {list(balanced_stage_layers(m, cand.pp, w))}) or choose a "
                            "pipeline degree that divides the layers")
        stages = self.stages_of(cand)  # stage_layers given: pp entries of at least one layer, summing to the layers
        if cand.virtual_stages != 1:
            check_virtual_stages(cand.virtual_stages, cand.pp, m.layers, stages)
            check_interleaved_micro_batches(cand.virtual_stages, cand.pp,
                                            micro_batches(w.batch, cand.dp, cand.micro_batch_size))
        check_kv_chunks_algorithm(cand.kv_chunks, cand.algorithm)
        if cand.team != 1 and cand.algorithm not in TEAM_ALGORITHMS:
            raise PlanError("degrees.team", f"team > 1 belongs to WallFacer (and tokenring_ring), not {cand.algorithm}",
                            "set team to 1")
        need = chunks_needed(cand.token_layout, cand.ring, cand.ulysses) * cand.tp
        if w.seq_len % need:
            raise PlanError("seq_len", f"{w.seq_len} is not divisible by {need} ({cand.token_layout}, ring {cand.ring} x "
                            f"ulysses {cand.ulysses} x tp {cand.tp})", f"use a multiple of {need}")

    # ---- memory
    def memory(self, cand: Candidate) -> dict[str, float]:
        """Per-rank bytes at the peak; depends on degrees and memory policy, not on the mesh order."""
        key = (cand.dp, cand.pp, cand.tp, cand.ulysses, cand.ring, cand.zero_stage, cand.checkpointing,
               cand.micro_batch_size, cand.algorithm, cand.team, self.stages_of(cand), cand.virtual_stages,
               cand.kv_chunks)
        mem = self._memory.get(key)
        if mem is None:
            c = self.shape(cand)
            mem = weight_bytes(shard_params(self.model, cand.tp, cand.pp, c.stage_layers), cand.zero_stage,
                               cand.dp * cand.sp, self.work.training)
            mem.update(self._activations(c, cand.checkpointing, cand.virtual_stages))
            mem["attention buffers"] = attention_buffer_bytes(c, self.work.training)
            if self.params.memory_overhead_bytes:
                mem["framework overhead"] = self.params.memory_overhead_bytes
            mem["total"] = sum(mem.values())
            self._memory[key] = mem
        return {k: v for k, v in mem.items() if k != "total"}

    def _activations(self, c: Shape, checkpointing: str, virtual_stages: int = 1) -> dict[str, float]:
        """Activation bytes by kind (memory.activation_bytes) x params.activation_factor (measured / modelled)."""
        act = activation_bytes(c, checkpointing, self.work.training, virtual_stages)
        k = self.params.activation_factor
        return act if k == 1.0 else {n: v * k for n, v in act.items()}

    def _activation_total(self, c: Shape, checkpointing: str, virtual_stages: int = 1) -> float:
        """The sum of ``_activations``, once per value: activation_bytes reads the sizes alone (not the algorithm,
        team, placement or token layout) but for algorithms with their own ``Algorithm.activations``."""
        if ALGORITHMS[c.algorithm].activations is not None:
            key = (c.key, checkpointing, virtual_stages)
        else:
            key = _sizes_key(c.dp, c.sp, c.tp, c.pp, c.mbs, c.stage_layers, checkpointing, virtual_stages)
        t = self._acts.get(key)
        if t is None:
            t = self._acts[key] = sum(self._activations(c, checkpointing, virtual_stages).values())
        return t

    def fits(self, cand: Candidate) -> bool:
        key = (cand.dp, cand.pp, cand.tp, cand.ulysses, cand.ring, cand.zero_stage, cand.checkpointing,
               cand.micro_batch_size, cand.algorithm, cand.team, self.stages_of(cand), cand.virtual_stages,
               cand.kv_chunks)
        if key not in self._memory:
            self.memory(cand)
        return self._memory[key]["total"] <= self.capacity

    def fitting(self, probe: Candidate, policies: list[tuple[int, str, int]]) -> list[tuple[int, str, int]]:
        """The policies (ZeRO stage, checkpointing, micro-batch) under which ``probe``'s degrees fit.

        Peak memory separates into weights (by ZeRO stage), activations (by checkpointing and
        micro-batch) and buffers (by micro-batch), so each part is computed once per value."""
        stages = self.stages_of(probe)
        # memory reads neither the token layout nor the placement (``fits``): variants that differ only there fit alike
        key = ("fitting", probe.dp, probe.pp, probe.tp, probe.ulysses, probe.ring, probe.algorithm, probe.team, stages,
               probe.virtual_stages, probe.kv_chunks, tuple(policies))
        out = self._acts.get(key)
        if out is None:
            out = self._acts[key] = self._fitting(probe, policies, stages)
        return list(out)

    def _fitting(self, probe: Candidate, policies: list[tuple[int, str, int]], stages) -> tuple:
        """``fitting``, computed: each policy's weights and activations (``_fixed_bytes``) plus the buffers of its
        micro-batch, summed in ``memory``'s order (the same fit decisions)."""
        bufs = {mbs: self._fit_buffers(probe, mbs) for mbs in {p[2] for p in policies}}
        fixed = self._fixed_bytes(probe, policies, stages)
        cap, over = self.capacity, self.params.memory_overhead_bytes
        if over:
            return tuple(p for p, f in zip(policies, fixed) if f + bufs[p[2]] + over <= cap)
        return tuple(p for p, f in zip(policies, fixed) if f + bufs[p[2]] <= cap)

    def _fixed_bytes(self, probe: Candidate, policies: list[tuple[int, str, int]], stages) -> list[float]:
        """Per policy, weights (by ZeRO stage) + activations (by checkpointing and micro-batch) of ``probe``'s degrees:
        the same for every algorithm variant without its own activations (``Algorithm.activations``), so made once
        for them."""
        shared = ALGORITHMS[probe.algorithm].activations is None
        key = ("fixed", probe.dp, probe.pp, probe.tp, probe.sp, stages, probe.virtual_stages,
               tuple(policies)) if shared else None  # weights read dp x sp and activations sp (``_sizes_key``)
        out = self._acts.get(key) if shared else None
        if out is None:
            wkey = ("weights", probe.tp, probe.pp, probe.dp * probe.sp, stages)  # every variant of the degrees
            weights = self._acts.get(wkey)
            if weights is None:
                params = shard_params(self.model, probe.tp, probe.pp, stages)
                weights = self._acts[wkey] = {z: sum(weight_bytes(params, z, probe.dp * probe.sp,
                                                                  self.work.training).values()) for z in (0, 1, 2, 3)}
            acts = self._fit_activations_of(probe, {p[1:] for p in policies}, stages)
            out = [weights[p[0]] + acts[p[1], p[2]] for p in policies]
            if shared:
                self._acts[key] = out
        return out

    def _fit_activations_of(self, probe: Candidate, policies: set, stages) -> dict[tuple[str, int], float]:
        """(checkpointing, micro-batch) -> ``_activation_total`` of ``probe`` for each of ``policies``, read from its
        key where known (no Shape made), else from one Shape per micro-batch."""
        shared, v, out, shapes = ALGORITHMS[probe.algorithm].activations is None, probe.virtual_stages, {}, {}
        for ckpt, mbs in policies:
            t = self._acts.get(_sizes_key(probe.dp, probe.sp, probe.tp, probe.pp, mbs, stages, ckpt, v)) if shared else None
            if t is None:
                c = shapes.get(mbs)
                if c is None:
                    c = shapes[mbs] = self.shape(probe, mbs)
                t = self._activation_total(c, ckpt, v)
            out[ckpt, mbs] = t
        return out

    def _fit_buffers(self, probe: Candidate, mbs: int) -> float:
        """``attention_buffer_bytes`` of ``probe`` at micro-batch ``mbs``, once for every dp and pp: the algorithms'
        buffers read a rank's sequence, head and team sizes, never dp or pp."""
        key = ("buffers", probe.ulysses, probe.ring, probe.token_layout, probe.tp, mbs, probe.algorithm, probe.team,
               probe.placement, probe.kv_chunks)
        b = self._acts.get(key)
        if b is None:
            b = self._acts[key] = attention_buffer_bytes(self.bounds._bare_shape(probe, probe.tp, mbs),
                                                         self.work.training)
        return b

    # ---- the whole step
    def shape(self, cand: Candidate, mbs: int | None = None) -> Shape:
        """The schedules' sizes of ``cand`` (with micro-batch ``mbs``), made once per distinct value."""
        key = (cand.dp, cand.ulysses, cand.ring, cand.token_layout, cand.tp, cand.pp, mbs or cand.micro_batch_size,
               cand.algorithm, cand.team, cand.placement, self.stages_of(cand), cand.kv_chunks)
        return self._shapes.get(key) or self._shape(key)

    def with_stages(self, cand: Candidate) -> Candidate:
        """``cand`` with the stage split it is priced with written out (a plan file records it; None: even)."""
        stages = self.stages_of(cand)
        return cand if stages == cand.stage_layers else replace(cand, stage_layers=stages)

    def stages_of(self, cand: Candidate) -> tuple[int, ...] | None:
        """Layers per stage of ``cand``: its own, else even where pp divides the layers (None), else balanced
        (``stages.resolve_stage_layers``), once per value."""
        if cand.stage_layers is None and self.model.layers % cand.pp == 0:
            return None
        key = ("stages", cand.pp, cand.stage_layers)
        s = self._acts.get(key, False)
        if s is False:
            s = self._acts[key] = resolve_stage_layers(self.model, cand.pp, cand.stage_layers, self.work)
        return s

    def _shape(self, key: tuple) -> Shape:
        """The Shape of ``key`` (Shape's own field order after model and workload), made and cached: a sibling of a
        shape of the same sizes where there is one (``Shape.sibling``: variants and token layouts share them)."""
        sizes = (key[0], key[1], key[2], key[4], key[5], key[6], key[10])  # dp, ulysses, ring, tp, pp, mbs, stages
        near = self._sizes.get(sizes)
        if near is None:
            c = self._shapes[key] = self._sizes[sizes] = Shape(self.model, self.work, *key, merge=self._merge)
        else:
            c = self._shapes[key] = near.sibling(key[3], key[7], key[8], key[9], key[11])
        return c

    def evaluate_orders(self, base: Candidate, orders: Orders, policies: list[tuple[int, str, int]],
                        detail: bool = False, bound: bool = False, sync: bool = True, exact_window: bool = False
                        ) -> tuple[np.ndarray, list | None]:
        """Step times, shape (orders, policies), of ``base``'s degrees and token layout under each mesh
        order and memory policy (ZeRO stage, checkpointing, micro-batch size); with ``detail`` the
        breakdown rows of the first order and policy; with ``bound`` a lower bound instead, the attention
        counted as ``Bounds.attention_floor``, and with ``sync`` False the gradient sync as nothing (a lower bound
        that routes no dp x sp group). A bound's sync hides behind its passes' wall times (at most the exact passes',
        whose longer walls lengthen the step by at least what they add to the windows: still a bound), or with
        ``exact_window`` behind the exact backward's window (``sync_window``: the backward and its recomputation
        priced whole)."""
        train = self.work.training
        out = np.empty((len(orders.orders), len(policies)))
        rows = None
        pipelines: dict = {}  # (checkpointing, micro-batch) -> parts, stage, pipeline seconds, backward compute, rows
        syncs_of: dict = {}  # ZeRO stage -> grad_syncs
        for j, (zero, ckpt, mbs) in enumerate(policies):
            c = self.shape(base, mbs)
            if (ckpt, mbs) not in pipelines:
                pipelines[ckpt, mbs] = self._pipeline(base, c, ckpt, orders, detail, bound)
            parts, stage, t, passes, n_rows = pipelines[ckpt, mbs]
            sync_rows = []
            if train and (sync or not bound):  # bucketed sync overlaps the passes; its last bucket cannot
                if zero not in syncs_of:
                    syncs_of[zero] = self.grad_syncs(c, zero, orders)
                syncs = syncs_of[zero]
                if bound and exact_window:
                    passes = (passes[0], self.price_part("bwd", c, orders),
                              self.price_part(RECOMPUTED[ckpt], c, orders) if ckpt != "none" else None)
                exposed, per_step = self.sync_exposed(c, zero, syncs, passes, orders)
                t = t + exposed
                if detail and j == 0:
                    total = sum(s * k for (_, s), k in zip(syncs, per_step))
                    share = exposed / np.where(total > 0, total, 1.0)
                    sync_rows = [(p.name, "communication", merged_name(p.dim), p.nbytes * k, float(s[0]) * k,
                                  float(s[0] * share[0]) * k) for (p, s), k in zip(syncs, per_step)]
            out[:, j] = t
            if detail and j == 0:
                rows = self._breakdown(base, c, ckpt, parts, stage, n_rows) + sync_rows
        return out, rows

    def _part(self, part: str, c: Shape, orders: Orders, detail: bool, bound: bool) -> Priced:
        """A schedule part priced under ``orders``; with ``bound`` the layer parts' attention at its floor (its
        linear part priced exactly)."""
        if not (bound and part in ("fwd", "bwd")):
            return self.price_part(part, c, orders, rows=detail)
        key = (orders, schedule_key(part, c), "bound")
        priced = self._prices.get(key)
        if priced is None:  # at least its compute, at least its communication
            busy, att = self.bounds.attention_busy(part, c), self.bounds.attention_floor(part, c, orders)
            lin = self.price_part(part + "-linear", c, orders)
            priced = self._prices[key] = Priced(lin.seconds + att, lin.compute + busy, ())
        return priced

    def _pipeline(self, base: Candidate, c: Shape, ckpt: str, orders: Orders, detail: bool,
                  bound: bool) -> tuple:
        """One checkpointing's (parts, stage seconds, pipeline seconds, a layer's forward, backward and recomputed
        forward priced (the backward None: inference; the recomputation None without checkpointing), layers in the
        breakdown): the busiest stage's layer parts, head and sends, through m micro-batches and the bubble."""
        Lp, m, pp = c.layers_per_stage, c.micro_batches, base.pp
        parts = [(self._part("fwd", c, orders, detail, bound), Lp, "")]
        bwd = recompute = None
        if self.work.training:
            if ckpt != "none":
                recompute = self._part(RECOMPUTED[ckpt], c, orders, detail, bound)
                parts.append((recompute, Lp, "recompute "))
            bwd = self._part("bwd", c, orders, detail, bound)
            parts.append((bwd, Lp, ""))
        head = self._part("head", c, orders, detail, bound)
        parts.append((head, 1, ""))
        if pp > 1:  # a boundary a chunk: v sends a micro-batch each way
            parts.append((self._part("pp", c, orders, detail, bound), base.virtual_stages, ""))
        if c.stage_layers is None:
            stage = sum(p.seconds * k for p, k, _ in parts)
            overhead = (self.layer_overhead(ckpt) + self.tp_overhead(c, ckpt)) * Lp
            if overhead:
                stage = stage + overhead
            n_rows = Lp
        else:  # uneven stages: the pipeline runs at its busiest stage's pace
            stage, parts, n_rows = self.uneven_stage(c, ckpt, parts, head)
        return parts, stage, pipeline_time(m, pp, base.virtual_stages, stage), (parts[0][0], bwd, recompute), n_rows

    def _breakdown(self, base: Candidate, c: Shape, ckpt: str, parts: list, stage, n_rows: int) -> list:
        """The breakdown rows of a step's pipeline under the first mesh order: its parts over m micro-batches, the
        fixed overheads and the bubble (the gradient sync's rows come from ``evaluate_orders``)."""
        m = c.micro_batches
        rows = []
        for p, k, pre in parts:
            rows += [(pre + n, *rest) for n, *rest in _scaled(p, k * m)]
        if self.layer_overhead(ckpt):
            o = self.layer_overhead(ckpt) * n_rows * m
            rows.append(("layer overhead", "compute", None, 0.0, o, o))
        if self.tp_overhead(c, ckpt):
            o = self.tp_overhead(c, ckpt) * n_rows * m
            rows.append(("tp collective overhead", "communication", "tp", 0.0, o, o))
        if base.pp > 1:
            bubble = bubble_time(base.pp, base.virtual_stages, float(stage[0]))
            rows.append(("pipeline bubble", "bubble", "pp", 0.0, bubble, bubble))
        return rows

    def uneven_stage(self, c: Shape, ckpt: str, parts: list, head: Priced) -> tuple:
        """Per mesh order, the busiest of ``c``'s uneven stages (``busiest_stage``) plus its sends; and the parts
        and layers of the busiest stage under the first order, for the breakdown (the LM head only if the last)."""
        layer_parts = parts[:-2]  # the layer parts come first, then the head and the stage sends (pp > 1)
        per_layer = sum(p.seconds for p, _, _ in layer_parts) + (self.layer_overhead(ckpt) + self.tp_overhead(c, ckpt))
        stage = busiest_stage(c.stage_layers, per_layer, head.seconds) + parts[-1][0].seconds * parts[-1][1]
        mid, last = max(c.stage_layers[:-1]), c.stage_layers[-1]
        if mid * float(per_layer[0]) > last * float(per_layer[0]) + float(head.seconds[0]):
            rows = [(p, mid, pre) for p, _, pre in layer_parts] + [parts[-1]]
            return stage, rows, mid
        return stage, [(p, last, pre) for p, _, pre in layer_parts] + parts[-2:], last

    def layer_overhead(self, ckpt: str) -> float:
        """Fixed seconds per layer and micro-batch beyond its kernels (``Params.layer_overhead_s``, a training step's
        forward and backward; a forward alone, inference or a recomputation, is a third of it: backward dispatches
        about twice the forward's ops). Either checkpointing recomputes a forward (``attention_boundary`` all of it
        but the attention), as ``tp_overhead`` counts."""
        o = self.params.layer_overhead_s
        if not o:
            return 0.0
        if not self.work.training:
            return o / 3
        return o * (4 / 3 if ckpt != "none" else 1.0)

    def tp_overhead(self, c: Shape, ckpt: str) -> float:
        """Fixed seconds per layer and micro-batch of its TP-sp collectives (``Params.tp_overhead_s`` each): 2
        all-gathers and 2 reduce-scatters a forward (schedules.linear_steps), as many a backward and a recomputed
        forward; none without Megatron TP (tp 1, or METP's own)."""
        o = self.params.tp_overhead_s
        if not o or c.tp == 1 or not ALGORITHMS[c.algorithm].tp_sp:
            return 0.0
        passes = 1 + (1 + (ckpt != "none") if self.work.training else 0)
        return 4 * passes * o

    def sync_exposed(self, c: Shape, zero: int, syncs: list, passes: tuple, orders: Orders
                     ) -> tuple[np.ndarray, list[int]]:
        """Seconds per order of ``syncs`` (``grad_syncs``, in ``schedules.grad_sync``'s order) left after the layer
        passes that hide them (``sync_window`` of a micro-batch's forward, and of its backward with the forward it
        recomputes, if any: ``passes`` (forward, backward, recomputation or None), through the stage's layers,
        ``schedules.bucketed_exposure``), and how many times a step runs each; under gradient accumulation as the
        frameworks run it:

        - ZeRO-0: the all-reduce once, in the last micro-batch's backward (DDP under ``no_sync``, Megatron);
        - ZeRO-1: its reduce-scatter there, and the weights' all-gather after the optimizer behind a micro-batch's
          forward (Megatron's ``overlap_param_gather``);
        - ZeRO-2: the reduce-scatter in every micro-batch's backward (DeepSpeed, FSDP), the all-gather as ZeRO-1's;
        - ZeRO-3: every micro-batch gathers the weights for its forward and again for its backward, and
          reduce-scatters its gradients (FSDP, DeepSpeed)."""
        f = self.sync_bucket(c, zero)
        classes = [orders.classes(p) for p, _ in syncs]
        forward, backward, recompute = passes
        fwd, bwd = (sync_window(x, classes) * c.layers_per_stage for x in (forward, backward))
        if recompute is not None:  # a layer's recomputation runs inside the backward, its buckets' syncs beside it
            bwd = bwd + sync_window(recompute, classes) * c.layers_per_stage
        secs, m = [s for _, s in syncs], c.micro_batches
        if zero == 0:
            return bucketed_exposure(secs[0], bwd, f), [1]
        if zero in (1, 2):
            k = m if zero == 2 else 1
            return k * bucketed_exposure(secs[0], bwd, f) + bucketed_exposure(secs[1], fwd, f), [k, 1]
        return m * (bucketed_exposure(secs[0], fwd, f) + bucketed_exposure(secs[1] + secs[2], bwd, f)), [m, m, m]

    def sync_bucket(self, c: Shape, zero: int) -> float:
        """A sync bucket's share of the gradients (``schedules.bucket_share``): DDP's buckets for ZeRO-0, a sharded
        wrapper per block (FSDP) for ZeRO 1-3."""
        key = ("sync bucket", c.tp, c.pp, zero == 0, c.stage_layers)
        f = self._busy.get(key)
        if f is None:
            grads = shard_params(self.model, c.tp, c.pp, c.stage_layers) * c.e
            f = self._busy[key] = bucket_share(grads, c.layers_per_stage, DDP_BUCKET_BYTES if zero == 0 else None)
        return f

    def sync_at_floor(self, c: Shape, zero: int, orders: Orders) -> bool:
        """Whether, on every order, a step of ``c`` exposes no more of its gradient sync than the last bucket of each
        time it runs (``sync_exposed``, the layer passes priced whole): the least any step of it can expose. Read
        without a recomputation, whose longer backward window only hides more, so it holds under every
        checkpointing."""
        syncs = self.grad_syncs(c, zero, orders)
        exposed, per_step = self.sync_exposed(c, zero, syncs, (self.price_part("fwd", c, orders),
                                                               self.price_part("bwd", c, orders), None), orders)
        floor = self.sync_bucket(c, zero) * sum(s * k for (_, s), k in zip(syncs, per_step))
        return bool(np.all(exposed <= floor * (1 + 1e-9)))

    def grad_syncs(self, c: Shape, zero: int, orders: Orders) -> list[tuple[Comm, np.ndarray]]:
        """The gradient sync phases with their seconds per order, each once (``sync_exposed`` counts how many times a
        step runs it): the volumes depend on the ZeRO stage and the tp x pp sharding alone, the groups on the mesh
        (once per mesh and stage)."""
        key = ("grad sync", orders.mesh_key, zero, c.stage_layers)
        out = self._prices.get(key)
        if out is None:
            syncs = [(p, orders.time(p)) for p in grad_sync(c, zero, shard_params(self.model, c.tp, c.pp,
                                                                                  c.stage_layers))]
            out = self._prices[key] = syncs
        return out

    def evaluate(self, cand: Candidate, detail: bool = False) -> Evaluation:
        """Step time (and with ``detail`` the breakdown rows) of one valid candidate."""
        orders = self.orders(cand.degrees, [cand.order], cand.placement)
        t, rows = self.evaluate_orders(cand, orders, [(cand.zero_stage, cand.checkpointing, cand.micro_batch_size)],
                                       detail)
        return Evaluation(float(t[0, 0]), self.memory(cand), rows)

    def attention_time(self, plan: Plan, backward: bool = False) -> tuple[float, list[PhaseCost]]:
        """One layer's attention alone (USP Tables 3-4 measure this), forward or forward + backward."""
        cand = Candidate.from_plan(plan)
        self.check(cand, plan)
        c = self.shape(cand)
        steps = attention_steps(c, backward=False) + (attention_steps(c, backward=True) if backward else [])
        priced = self.price(steps, self.orders(cand.degrees, [cand.order], cand.placement), rows=True)
        return float(priced.seconds[0]), _phases(_scaled(priced, 1.0))

    def model_flops(self, mask: bool = False) -> float:
        """Model FLOPs of one step (for MFU): 2 per weight per token, attention 4 N^2 a d (x0.5 causal: the count
        papers use, Llama 3's included); with ``mask``, the attention pairs the documents and window leave
        (``masks.mask_fraction``) instead; x3 to train."""
        m, w = self.model, self.work
        dense = 2.0 * w.tokens * (m.layers * m.layer_params() + m.vocab * m.hidden)
        full = 0.5 if w.causal else 1.0
        # a mask keeps no more than full attention: its exact causal count, S(S+1)/2 with the diagonal, is held to
        # the papers' S^2/2, so a window over the whole sequence counts as no window
        frac = min(mask_fraction(w, m.layers), full) if mask else full
        attn = 4.0 * w.batch * w.seq_len ** 2 * m.heads * m.head_dim * m.layers * frac
        return (dense + attn) * (3 if w.training else 1)

    def predict(self, cand: Candidate) -> Prediction:
        """Full prediction (with breakdown) of a valid candidate: MFU on the FLOPs the mask leaves where the workload
        has documents or a window (and ``mfu_causal`` on full causal attention, as papers count), else on full
        attention."""
        ev = self.evaluate(cand, detail=True)
        t = ev.step_time_s
        masked = self.work.documents is not None or self.work.mask_window is not None
        per_second = t * cand.world * self.peak
        return Prediction(step_time_s=t, tokens_per_s=self.work.tokens / t,
                          mfu=self.model_flops(mask=masked) / per_second,
                          mfu_causal=self.model_flops() / per_second if masked else None,
                          peak_memory_bytes=ev.peak_memory_bytes, memory_capacity_bytes=self.capacity,
                          memory=dict(ev.memory), breakdown=_phases(ev.rows))

    def __call__(self, plan: Plan) -> Prediction:
        """Predict one plan (checks it first)."""
        cand = Candidate.from_plan(plan)
        self.check(cand, plan)
        return self.predict(cand)


def _other_cluster_fix(made_for: str | None, here: str) -> str:
    """The fix for a plan priced on another cluster: the node count where both are one preset's (``preset_nodes``)."""
    (node, nodes), (here_node, here_nodes) = preset_nodes(made_for or ""), preset_nodes(here)
    if made_for and node == here_node and nodes != here_nodes:
        return f"pass --nodes {nodes}: the plan is for {nodes} node(s) of {node}"
    return "plan again for this cluster, or drop cluster_fingerprint from the plan to price it here"


def _phases(rows: list) -> list[PhaseCost]:
    """The step's phases, each summed over its rows; a phase priced past float range is refused (the inputs' bounds
    keep each figure finite, and a product of extreme ones can still overflow)."""
    merged: dict = {}
    for n, kind, g, b, s, x in rows:
        r = merged.setdefault(n, [kind, g, 0.0, 0.0, 0.0])
        r[2] += b
        r[3] += s
        r[4] += x
    for n, (_, _, b, s, x) in merged.items():
        if not (math.isfinite(b) and math.isfinite(s) and math.isfinite(x)):
            raise PlanError("cluster", f"the {n} phase prices at {s:g} s and {b:g} bytes a rank, past float range",
                            "check the cluster's and the profile's figures (latencies, efficiencies, overheads)")
    return [PhaseCost(name=n, kind=k, group=g, bytes_per_rank=b, seconds=s, exposed_seconds=x)
            for n, (k, g, b, s, x) in merged.items()]


def estimate(plan: Plan, cluster: Cluster, model: ModelSpec, workload: Workload, profile: Profile | None = None,
             *, params: Params | None = None) -> Prediction:
    """Predict step_time_s, tokens_per_s, mfu, peak_memory_bytes and the per-phase breakdown of ``plan``; pure: it
    prices with ``params`` (None: the loaded ``profile``'s, else ``Params()``, the engine's bare terms, not the
    presets' defaults of ``sp_plan.estimate(..., profile=False)`` and ``--no-profile``: pass
    ``params=sp_plan.profiles.kernels.default_params(cluster)`` for those) and opens no store. ``sp_plan.estimate``
    (the pipeline) looks the cluster's profile up and calls this."""
    pure_inputs(cluster, model, workload, "sp_plan.estimate")
    of_type("plan", plan, Plan, "a Plan (Plan.load(file)), or call sp_plan.estimate, which takes files and mappings")
    params = pure_params(profile, params, "sp_plan.estimate")
    return Estimator(cluster, model, workload, params=params)(plan)
