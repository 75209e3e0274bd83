"""Lower bounds on step times: what the search prunes with before it prices a layout exactly.

Each bound is below the exact price (``Estimator.evaluate_orders``) of every layout it stands for: compute alone
pipelined (``compute_bounds``; with an Orders batch, plus each layer part's communication at its floor under every
mesh order, ``link_floor_extra``, ``linear_floor_extra``), every cost but the attention exact with the attention at a floor from its compute and
communication (``comm_bounds``), and, per degrees choice, the linear and head compute with the attention at its even
share (``micro_batch_bounds``, ``policy_floor``). They read the Estimator's schedules and prices and keep their own
cache of what only a bound needs.
"""
from __future__ import annotations

from functools import reduce
from typing import TYPE_CHECKING

import numpy as np

from .algorithms import ALGORITHMS
from .candidate import Candidate
from .layout import ring_split
from .model import micro_batches
from .params import LINK_CLASSES
from .parts import RING_FREE_PARTS, schedule_key
from .schedules import Compute, Shape, Step, attention_blocks, balanced_attention
from .stages import busiest_stage, pipeline_time

if TYPE_CHECKING:
    from .estimate import Estimator, Orders

#: the dimensions whose phases get an order-free floor: the sizes the link floors' caches key on (tp, ulysses, ring, and
#: the ring's splits by team and placement)
ORDER_FREE_DIMS = frozenset(("tp", "ulysses", "ring", "team", "sub_ring", "team_ring"))


def recomputed(layer: float, fwd: float, fwd_linear: float, ckpt: str) -> float:
    """A training layer's seconds plus the forward its checkpointing runs again in the backward: the whole forward
    under ``full``, its linear part under ``attention_boundary`` (as ``Estimator._pipeline`` schedules them)."""
    return layer + (fwd if ckpt == "full" else fwd_linear if ckpt == "attention_boundary" else 0.0)


class Bounds:
    """Lower bounds for one Estimator's (cluster, model, workload, params), cached by value."""

    def __init__(self, est: Estimator):
        self.est = est
        self._cache: dict = {}  # bound-only values: floors, even shares, best blocks, attention floors' parts

    def compute_bounds(self, base: Candidate, policies: list[tuple[int, str, int]],
                       forward_floor: bool = False, batch: Orders | None = None) -> list[float]:
        """Per policy, a lower bound on the step time of ``base``'s degrees and token layout under any mesh order and
        that policy: the pipeline of compute phases alone, communication only adding time (the ZeRO stage moves no
        compute: one value per checkpointing and micro-batch). With ``forward_floor``, a forward attention whose schedule is not built yet
        counts at its even share (``balanced_time``, which no schedule undercuts) and none is built for it: a bound
        as low or lower, for the search to drop a group before it builds that schedule (``forward_is_floored``). With
        ``batch`` (the group's Orders), each layer part also counts its attention's communication at the floor that
        holds under every mesh order (``link_floor_extra``): no link loads built."""
        return self.compute_bounds_floored(base, policies, forward_floor, batch)[0]

    def compute_bounds_floored(self, base: Candidate, policies: list[tuple[int, str, int]],
                               forward_floor: bool = False, batch: Orders | None = None) -> tuple[list[float], bool]:
        """``compute_bounds``, and whether any policy's forward attention counted at its even share."""
        est = self.est
        stages = est.stages_of(base)
        sizes = (base.algorithm, base.ulysses, base.ring, base.team, base.placement, base.token_layout, base.tp,
                 base.kv_chunks)  # what a layer's compute reads: no dp, no pp
        floor = forward_floor and est.work.training
        pp, v, sequences, dp = base.pp, base.virtual_stages, est.work.batch, base.dp
        at: dict = {}
        out = []
        floored = False
        for _zero, ckpt, mbs in policies:
            t = at.get((ckpt, mbs))
            if t is None:
                sums = self._layer_sums(base, sizes, mbs)
                if floor and sums.fwd_key not in self._cache:  # forward_is_floored
                    layer, head = sums.floored(self, base, ckpt)
                    floored = True
                else:
                    layer, head = sums.exact(self, base, ckpt)
                if batch is not None:
                    layer += sums.link_extra(self, base, batch, ckpt)
                if stages is None:
                    stage = est.model.layers // pp * layer + head  # Shape.layers_per_stage
                else:
                    stage = float(busiest_stage(stages, layer, head))
                m = micro_batches(sequences, dp, mbs)
                # a hair below: sums' rounding
                t = at[ckpt, mbs] = pipeline_time(m, pp, v, stage) * (1 - 1e-9)
            out.append(t)
        return out, floored

    def _layer_sums(self, base: Candidate, sizes: tuple, mbs: int) -> LayerSums:
        """The ``LayerSums`` of ``base``'s variant and token layout (``sizes``) at micro-batch ``mbs``, made once."""
        key = ("layer sums", sizes, mbs)
        sums = self._cache.get(key)
        if sums is None:
            sums = self._cache[key] = LayerSums(mbs, self._unit_key("fwd", base, mbs), self._linear_parts(base, mbs))
        return sums

    def forward_is_floored(self, base: Candidate, mbs: int) -> bool:
        """Whether ``compute_bounds(..., forward_floor=True)`` counts ``base``'s forward attention at micro-batch
        ``mbs`` at its even share: training, and its bound unit's forward schedule not summed yet."""
        if not self.est.work.training:
            return False
        return self._unit_key("fwd", base, mbs) not in self._cache

    def _unit_key(self, part: str, base: Candidate, mbs: int) -> tuple:
        """``_floor_linear``'s cache key of the bound unit of ``part`` of ``base`` at micro-batch ``mbs``."""
        tp, one_mbs, _ = self.unit_sizes(part, base.algorithm, base.ulysses, base.tp, mbs)
        return ("floor linear", part, base.algorithm, base.ulysses, base.ring, base.team, base.placement,
                base.token_layout, tp, one_mbs, base.kv_chunks)

    def _balanced_forward(self, base: Candidate, mbs: int) -> float:
        """``balanced_time`` of the forward attention of ``base``'s sizes at micro-batch ``mbs`` (it reads ulysses,
        ring, tp and the micro-batch alone: a Shape is made only where it is not known)."""
        t = self._cache.get(("balanced", False, base.ulysses, base.ring, base.tp, mbs))
        return t if t is not None else self.balanced_time(self._bare_shape(base, base.tp, mbs), False)

    def _bare_shape(self, base: Candidate, tp: int, mbs: int) -> Shape:
        """The Shape of ``base``'s variant and token layout at ``tp`` and micro-batch ``mbs``, at dp 1 and pp 1: every
        schedule part but the stage sends reads no dp and no pp (``parts.schedule_key``), so one Shape serves every
        degrees choice that shares the rest."""
        key = (1, base.ulysses, base.ring, base.token_layout, tp, 1, mbs, base.algorithm, base.team, base.placement,
               None, base.kv_chunks)  # Estimator.shape's key
        return self.est._shapes.get(key) or self.est._shape(key)

    def _linear_parts(self, base: Candidate, mbs: int) -> tuple[float, float, float]:
        """``Estimator.busy`` of the forward linear part, the backward one (0 without training) and the head of
        ``base``'s degrees at micro-batch ``mbs`` (what they read: TP-sp or not, ulysses x ring, tp, mbs)."""
        key = ("linear parts", ALGORITHMS[base.algorithm].tp_sp, base.sp, base.tp, mbs)
        parts = self._cache.get(key)
        if parts is None:
            c, busy = self._bare_shape(base, base.tp, mbs), self.est.busy
            parts = self._cache[key] = (busy("fwd-linear", c),
                                        busy("bwd-linear", c) if self.est.work.training else 0.0, busy("head", c))
        return parts

    def _attention_compute(self, part: str, base: Candidate, mbs: int) -> float:
        """``attention_busy`` of ``part`` of ``base``'s variant and token layout at micro-batch ``mbs``, read from its
        bound unit's sums where they are known (no Shape made)."""
        tp, one_mbs, k = self.unit_sizes(part, base.algorithm, base.ulysses, base.tp, mbs)
        key = ("floor linear", part, base.algorithm, base.ulysses, base.ring, base.team, base.placement,
               base.token_layout, tp, one_mbs, base.kv_chunks)  # _floor_linear's key of the unit
        v = self._cache.get(key)
        if v is None:
            v = self._floor_linear(part, self._bare_shape(base, tp, one_mbs))
        (a_plain, n_plain, a_over, n_over), _ = v
        a, calls = a_plain + a_over, n_plain + n_over  # as attention_busy
        o = self.est.params.round_overhead_s
        return k * a + calls * o if o else k * a

    def comm_bounds(self, base: Candidate, orders: Orders, policies: list[tuple[int, str, int]],
                    sync: bool = True, exact_window: bool = False) -> list[float]:
        """Per policy, a lower bound on the step time of ``base`` under any of ``orders``: the step priced
        exactly but for the attention, which counts a floor from its compute and communication
        (``attention_floor``), and with ``sync`` False for the gradient sync, left out (with ``exact_window``, the
        sync's window read from the backward priced whole: ``Estimator.evaluate_orders``); a hair below, so that
        rounding never lifts it above the exact price."""
        times, _ = self.est.evaluate_orders(base, orders, policies, bound=True, sync=sync, exact_window=exact_window)
        return [float(t) * (1 - 1e-9) for t in times.min(axis=0)]

    def degrees_bound(self, probe: Candidate, micro_batch_sizes: list[int]) -> float:
        """A lower bound on the step time of every algorithm variant, token layout, mesh order and memory
        policy of ``probe``'s degrees (the least of ``micro_batch_bounds``)."""
        return min(self.micro_batch_bounds(probe, micro_batch_sizes).values())

    def micro_batch_bounds(self, probe: Candidate, micro_batch_sizes: list[int]) -> dict[int, float]:
        """Per micro-batch size, a lower bound on the step time of every algorithm variant, token layout,
        mesh order, ZeRO stage and checkpointing of ``probe``'s degrees: linear and head compute, and
        attention at its even share (``balanced_attention``), pipelined without recomputation and without
        communication (``policy_floor`` without recomputation)."""
        return {mbs: self.policy_floor(probe, (0, "none", mbs)) for mbs in micro_batch_sizes}

    def policy_floor(self, probe: Candidate, policy: tuple[int, str, int]) -> float:
        """A lower bound on the step time of every algorithm variant, token layout and mesh order of ``probe``'s
        degrees under one memory policy: ``micro_batch_bounds`` plus the recomputation its checkpointing adds
        (full: the forward again, attention at its even share; attention_boundary: the forward's linear part)."""
        _, ckpt, mbs = policy
        stages = self.est.stages_of(probe)
        key = ("policy floor", probe.dp, probe.pp, probe.tp, probe.ulysses, probe.ring, ckpt, mbs, stages,
               probe.virtual_stages)
        t = self._cache.get(key)
        if t is None:
            layer, head = self._policy_layer(probe, ckpt, mbs)
            m = micro_batches(self.est.work.batch, probe.dp, mbs)  # as Shape and its layers_per_stage
            if stages is None:
                stage = self.est.model.layers // probe.pp * layer + head
            else:
                stage = float(busiest_stage(stages, layer, head))
            t = self._cache[key] = pipeline_time(m, probe.pp, probe.virtual_stages, stage)
        return t

    def _policy_layer(self, probe: Candidate, ckpt: str, mbs: int) -> tuple[float, float]:
        """``policy_floor``'s (layer, head) seconds of ``probe``'s sizes under ``ckpt`` at micro-batch ``mbs``: the
        linear parts and the attention at its even share, summed from the parts every checkpointing shares (they read
        no dp, no pp)."""
        lkey = ("policy layer", probe.tp, probe.ulysses, probe.ring, ckpt, mbs)
        out = self._cache.get(lkey)
        if out is None:
            pkey = ("policy parts", probe.tp, probe.ulysses, probe.ring, mbs)
            parts = self._cache.get(pkey)
            if parts is None:
                c = self._bare_shape(probe, probe.tp, mbs)  # what it reads is no dp's and no pp's
                fwd_linear, busy = self.est.busy("fwd-linear", c), self.est.busy
                train = self.est.work.training
                parts = self._cache[pkey] = (fwd_linear, fwd_linear + self.balanced_time(c, False),
                                             busy("bwd-linear", c) + self.balanced_time(c, True) if train else 0.0,
                                             busy("head", c))
            fwd_linear, fwd, bwd, head = parts
            layer = recomputed(fwd + bwd, fwd, fwd_linear, ckpt) if self.est.work.training else fwd
            out = self._cache[lkey] = (layer, head)
        return out

    def balanced_time(self, c: Shape, backward: bool) -> float:
        """Seconds of ``balanced_attention`` at its most efficient block (no assumption on the efficiency curve)."""
        key = ("balanced", backward, c.ulysses, c.ring, c.tp, c.mbs)
        t = self._cache.get(key)
        if t is None:
            bkey = ("best block", backward, c.ring, c.tp)  # the blocks' efficiencies: not the volumes
            best = self._cache.get(bkey)
            if best is None:
                blocks = attention_blocks(c)
                pr = self.est.params
                for curve in ((pr.attention_bwd, pr.attention_bwd_masked) if backward
                              else (pr.attention_fwd, pr.attention_fwd_masked)):
                    if curve is not None:  # part-filled blocks read the curve below their length: its points too
                        blocks = (*blocks, *(x for x, _ in curve.points if x < blocks[-1]))
                # the same FLOPs at every block: the most efficient is the fastest (float division is monotone);
                # a block may run dense or masked: the better of the two
                best = self._cache[bkey] = max(blocks, key=lambda b: max(self.est.attention_efficiency(backward, b),
                                                                       self.est.attention_efficiency(backward, b,
                                                                                                 masked=True)))
            p = balanced_attention(c, backward, best)
            pr = self.est.params
            if (pr.attention_bwd_masked if backward else pr.attention_fwd_masked) is None:  # masked reads the dense
                t = self._cache[key] = self.est.compute_time(p)
            else:
                t = self._cache[key] = min(self.est.compute_time(p), self.est.compute_time(p._replace(masked=True)))
        return t

    def attention_busy(self, part: str, c: Shape) -> float:
        """Compute seconds of the attention steps of ``part`` ("fwd" or "bwd"): the schedule past its linear part,
        as k x (its unit's per-call seconds) + calls x round overhead (``attention_steps_of``; a bound's value,
        equal to the schedule's sum up to rounding)."""
        one, k = self.bound_unit(part, c)
        a, calls = self._attention_linear(part, one)
        o = self.est.params.round_overhead_s
        return k * a + calls * o if o else k * a

    def _attention_linear(self, part: str, one: Shape) -> tuple[float, int]:
        """(seconds without the per-call overhead, attention calls) of the attention steps of a bound unit: plain
        and overlapped steps together (``_floor_linear``)."""
        (a_plain, n_plain, a_over, n_over), _ = self._floor_linear(part, one)
        return a_plain + a_over, n_plain + n_over

    def _seconds_at_one(self, p: Compute) -> float:
        """``compute_time`` of a phase without the per-call overhead: linear in its volume (attention, memory;
        a GEMM at its own rows)."""
        o = self.est.params.round_overhead_s
        return self.est.compute_time(p) - o * self.est.calls(p) if o and p.kind == "attention" else self.est.compute_time(p)

    def _floor_linear(self, part: str, one: Shape) -> tuple[tuple, dict]:
        """``attention_floor``'s parts of a bound unit, linear in k: (plain seconds without per-call overhead,
        plain attention calls, the same for overlapped steps) and (slot, pattern, dims) -> (a phase, bytes x
        repeats, repeats). k = 1 but for ``batch_linear`` algorithms, whose steps hold no GEMM (METP's read the
        matmul curve at their rows, not linear in k)."""
        key = ("floor linear",) + schedule_key(part, one)
        v = self._cache.get(key)
        if v is None:
            a, n, sums = [0.0, 0.0], [0, 0], {}
            steps, _ = self.attention_steps_of(part, one)
            batch_linear, calls, seconds = ALGORITHMS[one.algorithm].batch_linear, self.est.calls, self._seconds_at_one
            for st in steps:
                j = 0
                for p in st.phases:
                    if isinstance(p, Compute):
                        if p.kind == "matmul" and batch_linear:  # rows x k: not linear
                            raise NotImplementedError(f"{one.algorithm}: a GEMM in a batch_linear attention schedule")
                        a[st.overlap] += seconds(p) * st.repeat
                        n[st.overlap] += st.repeat * calls(p) if p.kind == "attention" else 0
                    else:  # (coefficients read the pattern and dims alone)
                        slot = (j if st.overlap else "plain", p.pattern, p.dim)
                        q, b, r = sums.get(slot, (p, 0.0, 0))
                        sums[slot] = (q, b + p.nbytes * st.repeat, r + st.repeat)
                        j += 1
            v = self._cache[key] = ((a[0], n[0], a[1], n[1]), sums)
        return v

    def bound_unit(self, part: str, c: Shape) -> tuple[Shape, float]:
        """The shape whose attention steps a bound reads for ``part`` of ``c``, and the factor k on their volumes
        (``unit_sizes``)."""
        tp, mbs, k = self.unit_sizes(part, c.algorithm, c.ulysses, c.tp, c.mbs)
        if tp == c.tp and mbs == c.mbs:
            return c, k
        # at dp 1 and pp 1: the attention steps read neither (``_bare_shape``), so every degrees choice shares it
        key = (1,) + c.key[1:4] + (tp, 1, mbs) + c.key[7:10] + (None,) + c.key[11:]
        return self.est._shapes.get(key) or self.est._shape(key), k

    def unit_sizes(self, part: str, algorithm: str, ulysses: int, tp: int, mbs: int) -> tuple[int, int, float]:
        """(tp, micro-batch, k) of the shape whose attention steps a bound reads for ``part`` of a shape at ``tp`` and
        micro-batch ``mbs``, and the factor k on their volumes: one sequence at tp 1 where the algorithm is
        ``batch_linear`` and every head count per rank is heads / (tp x ulysses) (the KV heads divisible by
        tp x ulysses, none replicated), so FLOPs, merge and message bytes are mbs / tp x the unit's and block
        lengths the same (shared by every tp and micro-batch); else ``Estimator.unit``'s and mbs (1 for the shape
        itself)."""
        alg = ALGORITHMS[algorithm]
        m, tu = self.est.model, tp * ulysses
        if alg.batch_linear and (tp > 1 or mbs > 1) and m.kv_heads % tu == 0 and m.heads % tu == 0:
            return 1, 1, mbs / tp
        if mbs == 1 or not (part in RING_FREE_PARTS or alg.batch_linear):
            return tp, mbs, 1
        return tp, 1, mbs

    def attention_steps_of(self, part: str, c: Shape) -> tuple[list[Step], float]:
        """The attention steps of ``part`` of ``c`` (past its linear part) and the factor k their volumes are
        scaled by (``bound_unit``): a bound reads them without building ``c``'s own schedule."""
        one, k = self.bound_unit(part, c)
        return self.est.schedule(part, one)[len(self.est.schedule(part + "-linear", one)):], k

    def attention_floor(self, part: str, c: Shape, orders: Orders) -> np.ndarray:
        """Per order, a floor under the seconds of ``part``'s attention steps: plain steps exactly (compute plus
        communication); overlapped ones at least their compute and at least each phase slot's communication
        (slot j: the j-th communication phase of every overlapped step, which runs beside the others)."""
        key = ("attention floor",) + schedule_key(part, c)
        parts = self._cache.get(key)
        if parts is None:  # busy (plain, overlapped); (slot, pattern, dims) -> (a phase, bytes x repeats, repeats)
            one, k = self.bound_unit(part, c)
            (a_plain, n_plain, a_over, n_over), unit_sums = self._floor_linear(part, one)
            o = self.est.params.round_overhead_s or 0.0
            busy = [k * a_plain + n_plain * o, k * a_over + n_over * o]
            sums = {slot: (q, b * k, r) for slot, (q, b, r) in unit_sums.items()}
            # the communication alone, as a key: token layouts of one variant move the same bytes
            comm = tuple((slot, b, r) for slot, (_, b, r) in sums.items())
            parts = self._cache[key] = (busy, sums, comm)
        (plain, overlapped), sums, comm = parts
        ckey = ("floor comm", orders, comm)
        slots = self._cache.get(ckey)
        if slots is None:
            slots = {}  # engine costs are linear in bytes: a slot's phases of one pattern summed at once
            for (j, _, _), (q, b, r) in sums.items():
                steps, spb, lat = orders.coefficients(q)
                slots[j] = slots.get(j, 0.0) + steps * (b * spb + r * lat)
            exposed = slots.pop("plain", 0.0)
            slots = self._cache[ckey] = (exposed, list(slots.values()))
        exposed, overlapped_comm = slots
        return plain + exposed + reduce(np.maximum, overlapped_comm, np.full(len(orders.orders), overlapped))

    def layer_link_parts(self, base: Candidate, mbs: int, batch: Orders) -> tuple:
        """(Shape, the forward linear part's floor, the forward attention's, the backward's) under every mesh order of
        ``batch`` (``linear_floor_extra``, ``link_floor_extra``) of ``base``'s variant and token layout at micro-batch
        ``mbs``: what ``LayerSums.link_extra`` sums per checkpointing."""
        est = self.est
        c = est.shape(base, mbs)
        train = est.work.training
        return (c, self.linear_floor_extra("fwd-linear", c, batch), self.link_floor_extra("fwd", c, batch),
                self.linear_floor_extra("bwd-linear", c, batch) + self.link_floor_extra("bwd", c, batch) if train
                else 0.0)

    def linear_floor_extra(self, part: str, c: Shape, batch: Orders) -> float:
        """A floor under ``Estimator.price`` of the linear part ``part`` of ``c`` less its compute, the same under every
        mesh order of ``batch``: a plain step's communication, what an overlapped step's longest phase outlasts its
        compute by (``params.overlap``'s partial overlap counted), each phase at ``order_free_coefficients``."""
        key = ("linear floor", schedule_key(part, c), batch.world)
        v = self._cache.get(key)
        if v is None:
            est, v = self.est, 0.0
            hide = est.params.overlap
            for st in est.schedule(part, c):
                busy, comm, longest = 0.0, 0.0, 0.0
                for p in st.phases:
                    if isinstance(p, Compute):
                        busy += est.compute_time(p)
                    else:
                        steps, spb, lat = self.order_free_coefficients(p.pattern, batch, p.dim)
                        t = steps * (p.nbytes * spb + lat)
                        comm, longest = comm + t, max(longest, t)
                if not st.overlap:
                    v += comm * st.repeat
                elif longest > busy:  # max(c, m) + (1 - overlap) min(c, m), less c: grows with m
                    v += (longest - busy + (1.0 - hide) * busy) * st.repeat
                elif comm:
                    v += (1.0 - hide) * longest * st.repeat
            self._cache[key] = v
        return v

    def link_floor_extra(self, part: str, c: Shape, batch: Orders) -> float:
        """A floor under ``attention_floor(part, c, batch)`` less the attention's compute, the same under every mesh
        order: the plain steps' communication and what the longest overlapped slot outlasts their compute by, each
        phase at ``order_free_coefficients``."""
        key = ("link floor", schedule_key(part, c), batch.world)
        v = self._cache.get(key)
        if v is None:
            one, k = self.bound_unit(part, c)
            (_, _, a_over, n_over), slots = self._link_slots(part, one, c, batch)
            o = self.est.params.round_overhead_s or 0.0
            at = {j: k * a + b for j, (a, b) in slots.items()}  # a slot's seconds: linear in k
            exposed = at.pop("plain", 0.0)
            v = self._cache[key] = exposed + max(0.0, max(at.values(), default=0.0) - (k * a_over + n_over * o))
        return v

    def _link_slots(self, part: str, one: Shape, c: Shape, batch: Orders) -> tuple[tuple, dict]:
        """A bound unit's ``_floor_linear`` busy parts and, per phase slot, (seconds per unit of k, seconds at any k) of
        its communication at ``order_free_coefficients``: the groups' sizes read the unit's and ``c``'s sizes."""
        key = ("link slots", schedule_key(part, one), batch.world, c.tp, c.ulysses, c.ring)
        v = self._cache.get(key)
        if v is None:
            busy, sums = self._floor_linear(part, one)
            slots: dict = {}
            for (j, _, dims), (q, b, r) in sums.items():
                steps, spb, lat = self.order_free_coefficients(q.pattern, batch, dims)
                a0, b0 = slots.get(j, (0.0, 0.0))
                slots[j] = (a0 + steps * b * spb, b0 + steps * r * lat)
            v = self._cache[key] = (busy, slots)
        return v

    def order_free_coefficients(self, pattern: str, batch: Orders, dims: tuple) -> tuple[float, float, float]:
        """(steps, seconds per byte, latency) no lower than ``Orders.coefficients`` gives a phase of ``pattern`` on
        ``dims`` under any mesh order of ``batch``'s degrees: the link engine's floor (``LinkEngine.pattern_floor``)
        through the CommFit of the link class that charges least."""
        if not ORDER_FREE_DIMS.issuperset(dims):  # the floors' caches key on these sizes alone: no floor elsewhere
            return 0, 0.0, 0.0
        deg = batch.degrees
        key = ("order free", pattern, dims, batch.world, tuple([deg.get(d, 1) for d in dims]), deg.get("ring", 1),
               deg.get("team", 1), batch.placement)  # what the groups' sizes read (ring splits: ring, team, placement)
        v = self._cache.get(key)
        if v is None:
            n = 1
            for size, _ in batch._parts(0, dims):  # group sizes read no order: only their strides do
                n *= size
            spread = 1  # a ring's stride is 1 at least: the groups inside it lie at least their step apart
            if len(dims) == 1 and dims[0] in ("team", "sub_ring", "team_ring"):
                spread = max(abs(ring_split(deg.get("ring", 1), deg.get("team", 1), batch.placement, dims[0])[1]), 1)
            steps, spb, lat = self.est.engine.pattern_floor(pattern, n, batch.world, spread)
            fits = [batch.params.comm_fit(pattern, cls) if batch.params is not None else None for cls in LINK_CLASSES]
            v = self._cache[key] = (steps, min(spb if f is None else spb / f.efficiency for f in fits),
                                    min(lat if f is None else lat + f.alpha_s for f in fits))
        return v



class LayerSums:
    """A layer's compute seconds of one variant and token layout at one micro-batch (what ``Bounds.compute_bounds``
    sums per checkpointing; they read no dp and no pp): the linear parts and head, the attention's as they are first
    asked, and the communication floors per world (``Bounds.layer_link_parts``)."""

    __slots__ = ("mbs", "fwd_key", "linear", "bwd_att", "fwd_att", "balanced", "links")

    def __init__(self, mbs: int, fwd_key: tuple, linear: tuple[float, float, float]):
        self.mbs = mbs
        self.fwd_key = fwd_key  # the forward bound unit's key: summed or not (``Bounds.forward_is_floored``)
        self.linear = linear  # (forward linear, backward linear, head): ``Bounds._linear_parts``
        self.bwd_att = self.fwd_att = self.balanced = None
        self.links: dict = {}  # world -> ``Bounds.layer_link_parts``

    def exact(self, b: Bounds, base: Candidate, ckpt: str) -> tuple[float, float]:
        """(a layer's compute seconds under ``ckpt``, the head's): its linear and attention compute (read from the
        bound unit)."""
        fwd_linear, bwd_linear, head = self.linear
        if self.fwd_att is None:
            self.fwd_att = b._attention_compute("fwd", base, self.mbs)
        fwd = fwd_linear + self.fwd_att
        if not b.est.work.training:
            return fwd, head
        return recomputed(fwd + (bwd_linear + self.backward(b, base)), fwd, fwd_linear, ckpt), head

    def floored(self, b: Bounds, base: Candidate, ckpt: str) -> tuple[float, float]:
        """``exact`` with the forward attention at its even share (``Bounds._balanced_forward``; a training layer)."""
        fwd_linear, bwd_linear, head = self.linear
        if self.balanced is None:
            self.balanced = b._balanced_forward(base, self.mbs)
        fwd = fwd_linear + self.balanced
        return recomputed(fwd + bwd_linear + self.backward(b, base), fwd, fwd_linear, ckpt), head

    def backward(self, b: Bounds, base: Candidate) -> float:
        """The backward attention's compute seconds (``Bounds._attention_compute``)."""
        if self.bwd_att is None:
            self.bwd_att = b._attention_compute("bwd", base, self.mbs)
        return self.bwd_att

    def link_extra(self, b: Bounds, base: Candidate, batch: Orders, ckpt: str) -> float:
        """What a layer's communication and fixed overheads add to its compute under ``ckpt`` and every mesh order of
        ``batch``: the linear parts' (``linear_floor_extra``) and the attention's (``link_floor_extra``), the
        forward's again as it is recomputed, and the per-layer overheads the exact price adds
        (``Estimator._pipeline``)."""
        parts = self.links.get(batch.world)
        if parts is None:
            parts = self.links[batch.world] = b.layer_link_parts(base, self.mbs, batch)
        c, fwd_linear, fwd_att, bwd = parts
        est = b.est
        out = fwd_linear + fwd_att
        if est.work.training:
            out += bwd + (out if ckpt == "full" else fwd_linear if ckpt == "attention_boundary" else 0.0)
        return out + est.layer_overhead(ckpt) + est.tp_overhead(c, ckpt)
