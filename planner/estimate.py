"""Predict a plan's step time, throughput, MFU and peak memory from its schedule on the cluster."""
from __future__ import annotations

from dataclasses import dataclass, field

from .cluster import Cluster
from .engine import GroupShape, LinkEngine
from .errors import PlanError
from .layout import chunks_needed, strides
from .memory import activation_bytes, attention_buffer_bytes, weight_bytes
from .model import ModelSpec, Workload
from .plan import IMPLEMENTED, PhaseCost, Plan, Prediction
from .schedules import Comm, Compute, Shape, Step, attention_steps, grad_sync, head_steps, layer_schedule

#: fraction of device memory a plan may use (the rest: CUDA context, allocator fragmentation)
MEMORY_HEADROOM = 0.9


@dataclass
class _Tally:
    """Breakdown accumulator: per phase name, its kind, group, bytes, seconds and exposed seconds."""

    rows: dict = field(default_factory=dict)
    total: float = 0.0

    def add(self, name, kind, group, nbytes, seconds, exposed):
        r = self.rows.setdefault(name, [kind, group, 0.0, 0.0, 0.0])
        r[2] += nbytes
        r[3] += seconds
        r[4] += exposed

    def phases(self) -> list[PhaseCost]:
        return [PhaseCost(name=n, kind=k, group=g, bytes_per_rank=b, seconds=s, exposed_seconds=x)
                for n, (k, g, b, s, x) in self.rows.items()]


class Estimator:
    """Prices plans for one (cluster, model, workload); reuse it across candidates (costs are cached)."""

    def __init__(self, cluster: Cluster, model: ModelSpec, workload: Workload, engine: LinkEngine | None = None):
        self.cluster, self.model, self.work = cluster, model, workload
        self.engine = engine or LinkEngine(cluster)
        self.device = cluster.device(0)
        dt = model.dtype
        if dt not in self.device.peak_flops:
            raise PlanError("model.dtype", f"{self.device.model or self.device.name} has no peak FLOP/s for {dt}",
                            f"use one of {sorted(self.device.peak_flops)}")
        self.peak = self.device.peak_flops[dt]
        self.fingerprint = cluster.fingerprint()

    # ---- phase costs
    def group_shape(self, plan: Plan, dims: tuple[str, ...]) -> GroupShape:
        st = strides(plan.degrees, plan.order)
        parts = tuple((plan.degrees[n], st[n]) for n in dims if plan.degrees.get(n, 1) > 1 and n in st)
        return GroupShape(parts, plan.world_size)

    def compute_time(self, p: Compute) -> float:
        if p.kind == "attention":
            eff = self.device.attn_efficiency * p.block / (p.block + self.device.attn_half_block)
        else:
            eff = self.device.matmul_efficiency
        return p.flops / (self.peak * eff)

    def comm_time(self, plan: Plan, p: Comm) -> float:
        return self.engine.time(p.pattern, self.group_shape(plan, p.dim), p.nbytes)

    def run_steps(self, plan: Plan, steps: list[Step], times: int, tally: _Tally, prefix: str = "") -> float:
        """Cost of ``steps`` repeated ``times`` (e.g. layers), adding each phase to the breakdown."""
        total = 0.0
        for st in steps:
            costs = []
            for p in st.phases:
                if isinstance(p, Compute):
                    costs.append((p, self.compute_time(p), "compute", None, 0.0))
                else:
                    costs.append((p, self.comm_time(plan, p), "communication", "x".join(p.dim), p.nbytes))
            if st.overlap:
                t = max(c[1] for c in costs)
                busy = sum(c[1] for c in costs if c[2] == "compute")
                hidden = t - busy
                comm_sum = sum(c[1] for c in costs if c[2] != "compute") or 1.0
            else:
                t = sum(c[1] for c in costs)
            for p, s, kind, group, nbytes in costs:
                if not st.overlap or kind == "compute":
                    exp = s
                else:
                    exp = max(hidden, 0.0) * s / comm_sum
                k = st.repeat * times
                tally.add(prefix + p.name, kind, group, nbytes * k, s * k, exp * k)
            total += t * st.repeat * times
        return total

    # ---- the whole step
    def shape(self, plan: Plan) -> Shape:
        d = plan.degrees
        return Shape(self.model, self.work, d["dp"], d["ulysses"], d["ring"], plan.token_layout)

    def check(self, plan: Plan) -> None:
        """Constraints of a layout for this model, workload and cluster (PlanError if violated)."""
        if plan.algorithm not in IMPLEMENTED:
            raise PlanError("algorithm", f"{plan.algorithm!r} is not priced yet", f"use one of {list(IMPLEMENTED)}")
        d = plan.degrees
        if plan.cluster_fingerprint and plan.cluster_fingerprint != self.fingerprint:
            raise PlanError("cluster_fingerprint", f"the plan was made for cluster {plan.cluster or '?'} "
                            f"({plan.cluster_fingerprint}), not {self.cluster.name} ({self.fingerprint})",
                            "plan again for this cluster, or drop cluster_fingerprint from the plan to price it here")
        if plan.world_size != self.cluster.world_size:
            raise PlanError("degrees", f"the plan uses {plan.world_size} ranks but the cluster has {self.cluster.world_size}",
                            "make degrees multiply to the cluster's device count")
        if self.model.heads % d["ulysses"]:
            raise PlanError("degrees.ulysses", f"ulysses {d['ulysses']} does not divide the {self.model.heads} query heads",
                            "choose a ulysses degree that divides the heads")
        if self.work.batch % d["dp"]:
            raise PlanError("degrees.dp", f"dp {d['dp']} does not divide the global batch {self.work.batch}",
                            "choose dp dividing --batch")
        for n in ("tp", "pp", "team"):
            if d.get(n, 1) != 1:
                raise PlanError(f"degrees.{n}", f"{n} > 1 is not priced yet", f"set {n} to 1")
        need = chunks_needed(plan.token_layout, d["ring"], d["ulysses"])
        if self.work.seq_len % need:
            raise PlanError("seq_len", f"{self.work.seq_len} is not divisible by {need} "
                            f"({plan.token_layout}, ring {d['ring']} x ulysses {d['ulysses']})",
                            f"use a multiple of {need}")

    def attention_time(self, plan: Plan, backward: bool = False) -> tuple[float, list[PhaseCost]]:
        """One layer's attention alone (USP Tables 3-4 measure this), forward or forward + backward."""
        self.check(plan)
        c = self.shape(plan)
        tally = _Tally()
        t = self.run_steps(plan, attention_steps(c, backward=False), 1, tally)
        if backward:
            t += self.run_steps(plan, attention_steps(c, backward=True), 1, tally)
        return t, tally.phases()

    def memory(self, plan: Plan, c: Shape) -> dict[str, float]:
        mem = weight_bytes(self.model.params(), plan.zero_stage, c.sp * c.dp, self.work.training)
        mem.update(activation_bytes(c, plan.checkpointing, self.work.training))
        mem["attention buffers"] = attention_buffer_bytes(c, self.work.training)
        return mem

    def __call__(self, plan: Plan) -> Prediction:
        """Predict one plan (WallFacer/USP schedules on the link-load engine)."""
        self.check(plan)
        c = self.shape(plan)
        L = self.model.layers
        tally = _Tally()
        t = self.run_steps(plan, layer_schedule(c, backward=False), L, tally)
        bwd_compute = 0.0
        if self.work.training:
            if plan.checkpointing == "full":
                t += self.run_steps(plan, layer_schedule(c, backward=False), L, tally, prefix="recompute ")
            before = sum(r[3] for r in tally.rows.values() if r[0] == "compute")
            t += self.run_steps(plan, layer_schedule(c, backward=True), L, tally)
            bwd_compute = sum(r[3] for r in tally.rows.values() if r[0] == "compute") - before
        t += self.run_steps(plan, head_steps(c, self.work.training), 1, tally)
        if self.work.training:
            for p in grad_sync(c, plan.zero_stage, self.model.params()):
                s = self.comm_time(plan, p)
                exposed = max(s / L, s - bwd_compute)  # bucketed sync overlaps backward; the last bucket cannot
                tally.add(p.name, "communication", "x".join(p.dim), p.nbytes, s, exposed)
                t += exposed
        mem = self.memory(plan, c)
        peak_mem = sum(mem.values())
        tokens = self.work.tokens
        flops = self.model_flops()
        return Prediction(step_time_s=t, tokens_per_s=tokens / t, mfu=flops / (t * plan.world_size * self.peak),
                          peak_memory_bytes=peak_mem, memory_capacity_bytes=self.device.memory_bytes * MEMORY_HEADROOM,
                          memory=mem, breakdown=tally.phases())

    def model_flops(self) -> float:
        """Model FLOPs of one step (for MFU): 2 per weight per token, attention 4 N^2 a d (x0.5 causal); x3 to train."""
        m, w = self.model, self.work
        dense = 2.0 * w.tokens * (m.layers * m.layer_params() + m.vocab * m.hidden)
        attn = 4.0 * w.batch * w.seq_len ** 2 * m.heads * m.head_dim * m.layers * (0.5 if w.causal else 1.0)
        return (dense + attn) * (3 if w.training else 1)


def estimate(plan: Plan, cluster: Cluster, model: ModelSpec, workload: Workload) -> Prediction:
    """Predict step_time_s, tokens_per_s, mfu, peak_memory_bytes and the per-phase breakdown of ``plan``."""
    return Estimator(cluster, model, workload)(plan)
