"""Predict a layout's step time, throughput, MFU and peak memory from its schedule on the cluster.

Step (training, 1F1B over pp stages, m micro-batches): (m + pp - 1) x stage + exposed gradient
sync, where stage = layers/pp x (forward + recompute + backward of a block) + lm head + stage
sends. The pipeline bubble is (pp - 1) x stage, i.e. (p-1)/(m+p-1) of the pipeline time.

Per-layer costs are cached by the schedule's shape and the group shapes of the dimensions it
communicates on, so the grid search prices most candidates with a few dictionary lookups.
"""
from __future__ import annotations

from dataclasses import dataclass

from .candidate import Candidate
from .cluster import Cluster
from .engine import GroupShape, LinkEngine
from .errors import PlanError
from .layout import chunks_needed
from .memory import activation_bytes, attention_buffer_bytes, weight_bytes
from .model import ModelSpec, Workload
from .plan import IMPLEMENTED, PhaseCost, Plan, Prediction
from .schedules import (Comm, Compute, Shape, Step, attention_steps, grad_sync, head_steps, layer_schedule,
                        pipeline_p2p, shard_params)

#: fraction of device memory a plan may use (the rest: CUDA context, allocator fragmentation)
MEMORY_HEADROOM = 0.9


@dataclass(frozen=True)
class Priced:
    """Cost of a list of steps run once: total seconds, compute seconds, and breakdown rows."""

    seconds: float
    compute: float
    rows: tuple  # (name, kind, group, bytes, seconds, exposed)


@dataclass
class Evaluation:
    step_time_s: float
    memory: dict[str, float]
    rows: list | None = None

    @property
    def peak_memory_bytes(self) -> float:
        return sum(self.memory.values())


def _scaled(priced: Priced, k: float) -> list:
    return [(n, kind, g, b * k, s * k, x * k) for n, kind, g, b, s, x in priced.rows]


class Estimator:
    """Prices layouts for one (cluster, model, workload); reuse it across candidates (costs are cached)."""

    def __init__(self, cluster: Cluster, model: ModelSpec, workload: Workload, engine: LinkEngine | None = None):
        self.cluster, self.model, self.work = cluster, model, workload
        self.engine = engine or LinkEngine(cluster)
        self.device = cluster.device(0)
        dt = model.dtype
        if dt not in self.device.peak_flops:
            raise PlanError("model.dtype", f"{self.device.model or self.device.name} has no peak FLOP/s for {dt}",
                            f"use one of {sorted(self.device.peak_flops)}")
        self.peak = self.device.peak_flops[dt]
        self.capacity = self.device.memory_bytes * MEMORY_HEADROOM
        self.fingerprint = cluster.fingerprint()
        self._steps: dict = {}
        self._shapes: dict = {}
        self._memory: dict = {}

    # ---- phase costs
    def group_shape(self, cand: Candidate, dims: tuple[str, ...]) -> GroupShape:
        """Shape of the groups of ``dims`` (merged) under the candidate's mesh order."""
        key = (cand.dp, cand.pp, cand.tp, cand.ulysses, cand.ring, cand.order, dims)
        gs = self._shapes.get(key)
        if gs is None:
            deg = cand.degrees
            stride, st = 1, {}
            for n in cand.order:
                st[n] = stride
                stride *= deg.get(n, 1)
            parts = tuple((deg[n], st[n]) for n in dims if deg.get(n, 1) > 1 and n in st)
            gs = self._shapes[key] = GroupShape(parts, cand.world)
        return gs

    def compute_time(self, p: Compute) -> float:
        """FLOPs over peak x efficiency; attention's efficiency falls for short blocks (a saturating curve)."""
        if p.kind == "attention":
            eff = self.device.attn_efficiency * p.block / (p.block + self.device.attn_half_block)
        else:
            eff = self.device.matmul_efficiency
        return p.flops / (self.peak * eff)

    def price(self, cand: Candidate, steps: list[Step]) -> Priced:
        """Cost of ``steps`` once: overlapped steps cost their max phase; exposed time is split over comms."""
        total = compute = 0.0
        rows = {}
        for st in steps:
            costs = []
            for p in st.phases:
                if isinstance(p, Compute):
                    costs.append((p, self.compute_time(p), "compute", None, 0.0))
                else:
                    s = self.engine.time(p.pattern, self.group_shape(cand, p.dim), p.nbytes)
                    costs.append((p, s, "communication", "x".join(p.dim), p.nbytes))
            busy = sum(c[1] for c in costs if c[2] == "compute")
            t = max(c[1] for c in costs) if st.overlap else sum(c[1] for c in costs)
            comm_sum = sum(c[1] for c in costs if c[2] != "compute") or 1.0
            for p, s, kind, group, nbytes in costs:
                exp = s if (not st.overlap or kind == "compute") else max(t - busy, 0.0) * s / comm_sum
                r = rows.setdefault(p.name, [kind, group, 0.0, 0.0, 0.0])
                r[2] += nbytes * st.repeat
                r[3] += s * st.repeat
                r[4] += exp * st.repeat
            total += t * st.repeat
            compute += busy * st.repeat
        return Priced(total, compute, tuple((n, *r) for n, r in rows.items()))

    def _cached(self, tag: str, cand: Candidate, c: Shape, build) -> Priced:
        key = (tag, c, self.group_shape(cand, ("tp",)), self.group_shape(cand, ("ulysses",)),
               self.group_shape(cand, ("ring",)), self.group_shape(cand, ("pp",)))
        got = self._steps.get(key)
        if got is None:
            got = self._steps[key] = self.price(cand, build())
        return got

    # ---- validity
    def shape(self, cand: Candidate) -> Shape:
        return Shape(self.model, self.work, cand.dp, cand.ulysses, cand.ring, cand.token_layout, cand.tp, cand.pp,
                     cand.micro_batch_size)

    def check(self, cand: Candidate, plan: Plan | None = None) -> None:
        """Constraints of a layout for this model, workload and cluster (PlanError naming the field)."""
        m, w = self.model, self.work
        if plan is not None and plan.cluster_fingerprint and plan.cluster_fingerprint != self.fingerprint:
            raise PlanError("cluster_fingerprint", f"the plan was made for cluster {plan.cluster or '?'} "
                            f"({plan.cluster_fingerprint}), not {self.cluster.name} ({self.fingerprint})",
                            "plan again for this cluster, or drop cluster_fingerprint from the plan to price it here")
        if cand.algorithm not in IMPLEMENTED:
            raise PlanError("algorithm", f"{cand.algorithm!r} is not priced yet", f"use one of {list(IMPLEMENTED)}")
        if cand.world != self.cluster.world_size:
            raise PlanError("degrees", f"the plan uses {cand.world} ranks but the cluster has {self.cluster.world_size}",
                            "make degrees multiply to the cluster's device count")
        if m.heads % (cand.tp * cand.ulysses):
            raise PlanError("degrees.ulysses", f"tp {cand.tp} x ulysses {cand.ulysses} does not divide the "
                            f"{m.heads} query heads", "choose tp and ulysses whose product divides the heads")
        if w.batch % (cand.dp * cand.micro_batch_size):
            raise PlanError("degrees.dp", f"dp {cand.dp} x micro_batch_size {cand.micro_batch_size} does not divide "
                            f"the global batch {w.batch}", "choose dp and micro-batch size dividing --batch")
        if m.layers % cand.pp:
            raise PlanError("degrees.pp", f"pp {cand.pp} does not divide the {m.layers} layers",
                            "choose a pipeline degree that divides the layers")
        if cand.team != 1:
            raise PlanError("degrees.team", "team > 1 (WallFacer) is not priced yet", "set team to 1")
        need = chunks_needed(cand.token_layout, cand.ring, cand.ulysses) * cand.tp
        if w.seq_len % need:
            raise PlanError("seq_len", f"{w.seq_len} is not divisible by {need} ({cand.token_layout}, ring {cand.ring} x "
                            f"ulysses {cand.ulysses} x tp {cand.tp})", f"use a multiple of {need}")

    # ---- memory
    def memory(self, cand: Candidate) -> dict[str, float]:
        """Per-rank bytes at the peak; depends on degrees and memory policy, not on the mesh order."""
        key = (cand.dp, cand.pp, cand.tp, cand.ulysses, cand.ring, cand.zero_stage, cand.checkpointing,
               cand.micro_batch_size)
        mem = self._memory.get(key)
        if mem is None:
            c = self.shape(cand)
            mem = weight_bytes(shard_params(self.model, cand.tp, cand.pp), cand.zero_stage, cand.dp * cand.sp,
                               self.work.training)
            mem.update(activation_bytes(c, cand.checkpointing, self.work.training))
            mem["attention buffers"] = attention_buffer_bytes(c, self.work.training)
            self._memory[key] = mem
        return mem

    def fits(self, cand: Candidate) -> bool:
        return sum(self.memory(cand).values()) <= self.capacity

    # ---- the whole step
    def evaluate(self, cand: Candidate, detail: bool = False) -> Evaluation:
        """Step time (and with ``detail`` the breakdown rows) of a valid candidate."""
        c = self.shape(cand)
        train = self.work.training
        Lp, m, pp = c.layers_per_stage, c.micro_batches, cand.pp
        fwd = self._cached("fwd", cand, c, lambda: layer_schedule(c, backward=False))
        parts = [(fwd, Lp)]
        bwd_compute = 0.0
        if train:
            if cand.checkpointing == "full":
                parts.append((self._cached("recompute", cand, c, lambda: layer_schedule(c, backward=False)), Lp))
            elif cand.checkpointing == "attention_boundary":
                parts.append((self._cached("recompute-linear", cand, c,
                                           lambda: layer_schedule(c, backward=False, attention=False)), Lp))
            bwd = self._cached("bwd", cand, c, lambda: layer_schedule(c, backward=True))
            parts.append((bwd, Lp))
            bwd_compute = bwd.compute * Lp * m
        parts.append((self._cached("head", cand, c, lambda: head_steps(c, train)), 1))
        if pp > 1:
            parts.append((self._cached("pp", cand, c, lambda: pipeline_p2p(c, train)), 1))
        stage = sum(p.seconds * k for p, k in parts)
        t = (m + pp - 1) * stage
        rows = None
        if detail:
            rows = []
            prefix = {id(parts[1][0]): "recompute "} if train and cand.checkpointing != "none" else {}
            for p, k in parts:
                pre = prefix.get(id(p), "")
                rows += [(pre + n, *rest) for n, *rest in _scaled(p, k * m)]
            if pp > 1:
                rows.append(("pipeline bubble", "bubble", "pp", 0.0, (pp - 1) * stage, (pp - 1) * stage))
        if train:
            params = shard_params(self.model, cand.tp, cand.pp)
            for p in grad_sync(c, cand.zero_stage, params):
                s = self.engine.time(p.pattern, self.group_shape(cand, p.dim), p.nbytes)
                exposed = max(s / Lp, s - bwd_compute)  # bucketed sync overlaps backward; the last bucket cannot
                t += exposed
                if detail:
                    rows.append((p.name, "communication", "x".join(p.dim), p.nbytes, s, exposed))
        return Evaluation(t, self.memory(cand), rows)

    def attention_time(self, plan: Plan, backward: bool = False) -> tuple[float, list[PhaseCost]]:
        """One layer's attention alone (USP Tables 3-4 measure this), forward or forward + backward."""
        cand = Candidate.from_plan(plan)
        self.check(cand, plan)
        c = self.shape(cand)
        steps = attention_steps(c, backward=False) + (attention_steps(c, backward=True) if backward else [])
        priced = self.price(cand, steps)
        return priced.seconds, _phases(list(priced.rows))

    def model_flops(self) -> float:
        """Model FLOPs of one step (for MFU): 2 per weight per token, attention 4 N^2 a d (x0.5 causal); x3 to train."""
        m, w = self.model, self.work
        dense = 2.0 * w.tokens * (m.layers * m.layer_params() + m.vocab * m.hidden)
        attn = 4.0 * w.batch * w.seq_len ** 2 * m.heads * m.head_dim * m.layers * (0.5 if w.causal else 1.0)
        return (dense + attn) * (3 if w.training else 1)

    def predict(self, cand: Candidate) -> Prediction:
        """Full prediction (with breakdown) of a valid candidate."""
        ev = self.evaluate(cand, detail=True)
        t = ev.step_time_s
        return Prediction(step_time_s=t, tokens_per_s=self.work.tokens / t,
                          mfu=self.model_flops() / (t * cand.world * self.peak),
                          peak_memory_bytes=ev.peak_memory_bytes, memory_capacity_bytes=self.capacity,
                          memory=dict(ev.memory), breakdown=_phases(ev.rows))

    def __call__(self, plan: Plan) -> Prediction:
        """Predict one plan (checks it first)."""
        cand = Candidate.from_plan(plan)
        self.check(cand, plan)
        return self.predict(cand)


def _phases(rows: list) -> list[PhaseCost]:
    merged: dict = {}
    for n, kind, g, b, s, x in rows:
        r = merged.setdefault(n, [kind, g, 0.0, 0.0, 0.0])
        r[2] += b
        r[3] += s
        r[4] += x
    return [PhaseCost(name=n, kind=k, group=g, bytes_per_rank=b, seconds=s, exposed_seconds=x)
            for n, (k, g, b, s, x) in merged.items()]


def estimate(plan: Plan, cluster: Cluster, model: ModelSpec, workload: Workload) -> Prediction:
    """Predict step_time_s, tokens_per_s, mfu, peak_memory_bytes and the per-phase breakdown of ``plan``."""
    return Estimator(cluster, model, workload)(plan)
