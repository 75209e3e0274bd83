"""Calibration: fit the engine's physical parameters (planner/params.py) to measurements of one cluster.

design.md, "Profile once per cluster": kernel samples give the attention and GEMM efficiency curves,
link fits (profiles/discover/calibrate.py) give each collective's efficiency and fixed cost per link
class, and the candidates tune ran give what the schedules cannot see: how much of a double-buffered
round really overlaps, a fixed cost per attention block call, the framework's memory overhead and how
far the activation formulas are off. Pure numpy/scipy; the engine itself prices every trial. Which profile prices a
plan is the store layer's question (``sp_plan.profiles.resolve``).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import numpy as np

from .candidate import Candidate
from .cluster import NET, Cluster
from .engine import GroupShape, LinkEngine, StepCost, pattern_steps
from .errors import PlanError
from .estimate import Estimator
from .params import PATTERN_CLASS, CommFit, Curve, Params
from .plan import Plan
from .plausible import check_params, check_samples, has_datasheet
from .profile import KernelSample, MeasuredCandidate

#: link-measurement op (profiles/discover/probe.py) -> engine pattern (engine.pattern_steps)
OP_PATTERN = {"p2p": "shift", "p2p_bidir": "shift_bi", "all_gather": "all_gather",
              "reduce_scatter": "reduce_scatter", "all_to_all": "all_to_all"}
GIB = 2.0 ** 30


def __getattr__(name: str):
    """``resolve_params`` where callers of this module's old name import it: it looks profiles up in the store, so it
    lives in the store layer (``sp_plan.profiles.resolve``); the planner itself never calls it."""
    if name == "resolve_params":
        return getattr(importlib.import_module("sp_plan.profiles.resolve"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw for ``op`` on ``n`` ranks (PERFORMANCE.md): 1 for send/recv, (n-1)/n for all-gather,
    reduce-scatter and all-to-all, 2(n-1)/n for all-reduce."""
    if op in ("p2p", "p2p_bidir", "sendrecv"):
        return 1.0
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op == "all_reduce":
        return 2 * (n - 1) / n
    raise ValueError(f"unknown op {op!r}")


# ---- kernel curves
def masked_split(samples: list[KernelSample]) -> bool:
    """Whether attention was timed both dense and under a causal mask (then the masked ones give the *_masked
    curves; older profiles timed causal blocks only, and those give the plain curves as before)."""
    att = [s.causal for s in samples if s.kind != "matmul"]
    return any(att) and not all(att)


def curve_of(s: KernelSample, split: bool) -> str:
    """The Params curve a kernel sample feeds (``masked_split``)."""
    return s.kind + "_masked" if split and s.causal and s.kind != "matmul" else s.kind


def kernel_curves(samples: list[KernelSample], peak_flops: float) -> dict[str, Curve]:
    """Efficiency curves per kernel kind: flops / (seconds x peak), median over repeats at one size
    (heads pooled: efficiency is per FLOP), sorted by size. Keys are Params fields (attention_fwd, ...); where
    attention was timed both dense and causal, the causal samples give attention_fwd_masked / _bwd_masked."""
    if not peak_flops > 0:
        raise PlanError("peak_flops", f"must be positive, got {peak_flops}", "pass the device's peak FLOP/s for the dtype")
    by: dict[str, dict[int, list[float]]] = {}
    split = masked_split(samples)
    for s in samples:
        if s.seconds > 0 and s.flops > 0 and not s.alone:  # curves: every rank computing, as in a step
            by.setdefault(curve_of(s, split), {}).setdefault(int(s.size), []).append(s.flops / (s.seconds * peak_flops))
    return {kind: Curve(points=tuple((float(n), float(np.median(v))) for n, v in sorted(sizes.items())))
            for kind, sizes in by.items()}


# ---- link fits
def _lone_pair(engine: LinkEngine, pattern: str, a: int, b: int) -> StepCost:
    """One pair alone (what probe p2p times): its routes loaded once per direction used."""
    flows = [(a, b)] + ([(b, a)] if pattern == "shift_bi" else [])
    load: dict = {}
    lat = 0.0
    for s, d in flows:
        edges, l = engine.route(s, d)
        lat = max(lat, l)
        for e in edges:
            load[e] = load.get(e, 0.0) + 1.0
    if not load:
        return StepCost(0, 0.0, 0.0, "")
    worst = max(load, key=lambda e: load[e] / engine.local.edges[e]["capacity"])
    return StepCost(1, load[worst] / engine.local.edges[worst]["capacity"], lat, f"{worst[0]}->{worst[1]}",
                    "inter" if NET in worst else "intra")


def modelled_cost(cluster: Cluster, engine: LinkEngine, link_class: str, op: str, group_size: int,
                  pair: tuple[int, int] | None = None) -> StepCost:
    """The engine's cost of a link measurement placed as profiles/discover/probe.plan_probes places it: p2p on the
    class's pair alone; collectives on every node's ranks at once (intra) or on every rail at once (inter)."""
    pattern = OP_PATTERN[op]
    gpn, inter = cluster.devices_per_node, link_class.startswith("inter")
    if op in ("p2p", "p2p_bidir"):
        a, b = pair if pair else ((0, gpn) if inter else (0, 1))
        return _lone_pair(engine, pattern, a, b)
    stride = gpn if inter else 1
    return engine.cost(pattern, GroupShape(((group_size, stride),), cluster.world_size))


def comm_fits(cluster: Cluster, links: dict) -> dict[str, CommFit]:
    """CommFit per "PATTERN_CLASS/LINK_CLASS" from ``calibration['links']`` (discover/calibrate.py).

    efficiency = measured busbw / the engine's busbw for the same op and placement, with busbw =
    bytes x bus_factor / time (nccl-tests); alpha per step = measured alpha / steps - the engine's path
    latency (the engine already charges that), at least 0."""
    classes = links.get("classes", links)
    engine = LinkEngine(cluster)
    out: dict[str, CommFit] = {}
    for cls in sorted(classes, key=lambda c: (not c.startswith("intra"), c)):
        entry = classes[cls]
        lc = "inter" if cls.startswith("inter") else "intra"
        if lc == "inter" and cluster.num_nodes < 2:
            continue
        pair = tuple(entry["pair"]) if len(entry.get("pair") or ()) == 2 else None
        for op, f in entry.get("ops", {}).items():
            if op not in OP_PATTERN or not f.get("busbw"):
                continue
            n = int(f.get("group_size", 2))
            if n < 2 or (lc == "inter" and op not in ("p2p", "p2p_bidir") and n > cluster.num_nodes) or \
                    (lc == "intra" and n > cluster.devices_per_node):
                continue
            cost = modelled_cost(cluster, engine, cls, op, n, pair)
            if not cost.steps or cost.sec_per_byte <= 0:
                continue
            model_busbw = bus_factor(op, n) / (cost.steps * cost.sec_per_byte)
            key = f"{PATTERN_CLASS[OP_PATTERN[op]]}/{lc}"
            if key in out:  # one fit per pattern class and link class: the first (sorted) class wins
                continue
            alpha = max(0.0, float(f.get("alpha_s", 0.0)) / pattern_steps(OP_PATTERN[op], n) - cost.latency)
            out[key] = CommFit(alpha_s=alpha, efficiency=float(f["busbw"]) / model_busbw)
    return out


# ---- fitting to measured candidates
@dataclass
class _Case:
    """One ok candidate, rebuilt: plan, model, workload, candidate; measured time and memory."""

    index: int
    plan: Plan
    cand: Candidate
    key: str
    time: float | None
    memory: float | None


class _Pricer:
    """Re-estimates the candidates under trial Params (one LinkEngine; Estimators per params and workload)."""

    def __init__(self, cluster: Cluster, cases: list[_Case]):
        self.cluster, self.cases = cluster, cases
        self.engine = LinkEngine(cluster)
        self.work = {c.key: (c.plan.model, c.plan.workload) for c in cases}
        self._time: dict = {}
        self._schedules: dict = {}  # (case key, ring merge) -> the schedule cache its Estimators share

    def estimator(self, key: str, params: Params) -> Estimator:
        m, w = self.work[key]
        shared = self._schedules.setdefault((key, params.ring_merge), {})
        return Estimator(self.cluster, m, w, engine=self.engine, params=params, schedules=shared)

    def times(self, params: Params, cases: list[_Case]) -> np.ndarray:
        """Predicted step time of each case (cached by params and case)."""
        out = []
        ests: dict = {}
        tag = params.model_dump_json()
        for c in cases:
            k = (tag, c.index)
            if k not in self._time:
                est = ests.get(c.key) or ests.setdefault(c.key, self.estimator(c.key, params))
                self._time[k] = est.evaluate(c.cand).step_time_s
            out.append(self._time[k])
        return np.array(out)

    def memory_parts(self, params: Params, cases: list[_Case]) -> tuple[np.ndarray, np.ndarray]:
        """(rest, activations) per case with the activation factor 1 and no overhead: memory is
        rest + factor x activations + overhead (Estimator.memory)."""
        neutral = params.model_copy(update={"activation_factor": 1.0, "memory_overhead_bytes": 0.0})
        twice = neutral.model_copy(update={"activation_factor": 2.0})
        a = np.array([sum(self.estimator(c.key, neutral).memory(c.cand).values()) for c in cases])
        b = np.array([sum(self.estimator(c.key, twice).memory(c.cand).values()) for c in cases])
        return 2 * a - b, b - a

    def memories(self, params: Params, cases: list[_Case]) -> np.ndarray:
        return np.array([sum(self.estimator(c.key, params).memory(c.cand).values()) for c in cases])


@dataclass
class FitResult:
    """What fit() found: the params, what was fitted (in words), errors before and after, per-candidate predictions."""

    params: Params
    fitted: list[str]
    loo_error_before: float | None  # median |pred - meas| / meas of step time, base params
    loo_error_after: float | None  # the same, each candidate predicted by a fit without it
    memory_error_before: float | None = None
    memory_error_after: float | None = None  # leave-one-out, peak memory
    predicted_before: list[tuple[float | None, float | None]] = field(default_factory=list)  # (s, bytes) per candidate
    predicted_after: list[tuple[float | None, float | None]] = field(default_factory=list)  # with the full fit
    notes: list[str] = field(default_factory=list)  # what was not fitted, and why
    candidates: list[MeasuredCandidate] = field(default_factory=list)  # copies with predicted_* filled in
    #: per candidate: its step as a fit without it predicts it; None where that fit lacks a parameter only it moves
    #: (``sole_witnesses``: such a prediction is short of the parameter, not of the reading)
    loo_times: list[float | None] = field(default_factory=list)


def _cases(candidates: list[MeasuredCandidate]) -> list[_Case]:
    out = []
    for i, mc in enumerate(candidates):
        if mc.status != "ok":
            continue
        try:
            plan = Plan.model_validate(mc.plan)
        except (PlanError, ValueError) as e:
            raise PlanError(f"candidates[{i}].plan", f"not a valid plan document: {e}",
                            "store the whole Plan that ran") from None
        if plan.model is None or plan.workload is None:
            raise PlanError(f"candidates[{i}].plan", "the plan document has no model or workload",
                            "store the Plan with its model and workload (search.finish fills them)")
        key = plan.model.model_dump_json() + plan.workload.model_dump_json()
        ok_t = mc.measured_s is not None and mc.measured_s > 0
        ok_m = mc.measured_memory is not None and mc.measured_memory > 0
        out.append(_Case(i, plan, Candidate.from_plan(plan), key, mc.measured_s if ok_t else None,
                         mc.measured_memory if ok_m else None))
    return out


def _check_cases(pricer: _Pricer, cases: list[_Case]) -> None:
    for c in cases:
        pricer.estimator(c.key, Params()).check(c.cand)


TIME_REG = 0.05  # weight of the pull toward neutral (overlap 1, no overhead) when data are fewer than parameters


#: a compute efficiency is told apart from overlap and round overhead only by this many timed candidates
MIN_FOR_COMPUTE = 3


@dataclass(frozen=True)
class TimeParam:
    """A step-time parameter the fit moves: its Params field, its fit coordinate (seconds as milliseconds, ``ms``, so
    the solver's steps are of one scale), the coordinate's bounds, neutral value and starting grid, the solver's
    scale for it, and how the fitted value is said."""

    field: str
    ms: bool
    lo: float
    hi: float
    neutral: float
    grid: tuple[float, ...]
    scale: float
    words: str

    def value(self, coordinate: float) -> float:
        """The Params value of a fit coordinate (clamped to the bounds)."""
        v = float(min(max(coordinate, self.lo), self.hi))
        return v * 1e-3 if self.ms else v

    def coordinate(self, params: Params) -> float:
        """The fit coordinate of the parameter's value in ``params``."""
        v = getattr(params, self.field)
        return v * 1e3 if self.ms else v


#: the time parameters, in the order of the fit's coordinates
TIME_PARAMS = (
    TimeParam("overlap", False, 0.0, 1.0, 1.0, (0.0, 0.25, 0.5, 0.75, 1.0), 0.1, "overlap {:.2f}"),
    TimeParam("round_overhead_s", True, 0.0, np.inf, 0.0, (0.0, 0.1, 0.5, 2.0, 10.0), 1.0,
              "round overhead {:.2f} ms per attention call"),
    TimeParam("compute_efficiency", False, 0.05, 1.5, 1.0, (0.25, 0.5, 1.0), 0.1,
              "compute efficiency in a step {:.2f} of the timed kernels"),
    TimeParam("layer_overhead_s", True, 0.0, np.inf, 0.0, (0.0, 1.0, 10.0, 50.0), 1.0,
              "layer overhead {:.2f} ms per layer and micro-batch"),
    TimeParam("tp_overhead_s", True, 0.0, np.inf, 0.0, (0.0, 1.0, 5.0), 1.0,
              "TP overhead {:.2f} ms per tensor-parallel collective"),
)
_AT = {p.field: i for i, p in enumerate(TIME_PARAMS)}


class _TimeFit:
    """Measured step times against the engine's under trial coordinates of TIME_PARAMS (the rest of ``base`` kept)."""

    def __init__(self, pricer: _Pricer, base: Params, cases: list[_Case]):
        self.pricer, self.base, self.cases = pricer, base, cases
        self.meas = np.array([c.time for c in cases])
        self.x0 = np.array([p.coordinate(base) for p in TIME_PARAMS])

    def params(self, x) -> Params:
        """``base`` with the time parameters at coordinates ``x``."""
        return self.base.model_copy(update={p.field: p.value(x[i]) for i, p in enumerate(TIME_PARAMS)})

    def pred(self, x) -> np.ndarray:
        """The cases' predicted step times at coordinates ``x``."""
        return self.pricer.times(self.params(x), self.cases)

    def moves(self, name: str, a: float, b: float) -> bool:
        """Whether the parameter moves some case's predicted step between coordinates ``a`` and ``b``."""
        lo, hi = self.x0.copy(), self.x0.copy()
        lo[_AT[name]], hi[_AT[name]] = a, b
        return bool(np.max(np.abs(self.pred(lo) - self.pred(hi)) / self.meas) > 1e-9)

    def rings(self) -> bool:
        """Whether some timed case runs a ring of more than one rank (several block calls a layer, each paying the
        round overhead); without one, the round overhead is a fixed cost per layer like any other."""
        return any(c.plan.degrees.get("ring", 1) > 1 for c in self.cases)

    def free(self, hold: frozenset) -> tuple[list[str], list[str]]:
        """The parameters to fit, and notes on those left out: overlap and round overhead where a case moves them;
        from MIN_FOR_COMPUTE timed cases the compute efficiency and the TP overhead (where a case has TP-sp
        collectives); the layer overhead only with a case to spare (it moves every layout's step alike, as the
        compute efficiency does: with none to spare the two interpolate the measurements' noise)."""
        n = len(self.cases)
        free = [name for name in ("overlap", "round_overhead_s") if self.moves(name, 0.0, 1.0)
                and not (name == "round_overhead_s" and name in hold)]
        tp = self.moves("tp_overhead_s", 0.0, 1.0)
        notes = [] if "overlap" in free else [
            "overlap not fitted: no measured candidate has a double-buffered round with communication"]
        if n < MIN_FOR_COMPUTE and "round_overhead_s" in free and not self.rings():
            return [f for f in free if f != "round_overhead_s"] + ["compute_efficiency"], notes + [
                "round overhead not fitted: no measured candidate runs a ring, so its one block call a layer is "
                "not told apart from the compute; the compute efficiency takes the step's residual"]
        if n < MIN_FOR_COMPUTE:
            return free, notes + [f"compute efficiency and layer overhead not fitted: needs {MIN_FOR_COMPUTE} "
                                  "candidates with a measured step time"]
        free += ["compute_efficiency"] + (["tp_overhead_s"] if tp else [])
        if n > len(free) + 1:
            return free + ["layer_overhead_s"], notes
        return free, notes + [f"layer overhead not fitted: {n} timed candidates for {len(free) + 1} time "
                              "parameters with it (it is fitted with a candidate to spare)"]

    def solve(self, free: list[str]) -> np.ndarray:
        """The coordinates of least relative error (scipy least_squares from the best few of a small grid), pulled
        toward neutral (TIME_REG) when the cases are fewer than the parameters."""
        idx = [_AT[name] for name in free]
        ps = [TIME_PARAMS[i] for i in idx]
        neutral = np.array([p.neutral for p in ps])
        reg = len(self.cases) < len(free)

        def resid(z):
            x = self.x0.copy()
            x[idx] = z
            r = self.pred(x) / self.meas - 1.0
            return np.concatenate([r, TIME_REG * (z - neutral)]) if reg else r

        starts = np.array(np.meshgrid(*[np.array(p.grid) for p in ps])).reshape(len(free), -1).T
        lo, hi = np.array([p.lo for p in ps]), np.array([p.hi for p in ps])
        # the step is piecewise linear in these (max of compute and communication): descend from the best few starts
        best_starts = sorted(starts, key=lambda z: float(np.sum(resid(z) ** 2)))[:4]
        from scipy.optimize import least_squares  # noqa: PLC0415 - SciPy (~0.5 s): only a fit needs it, a plan not

        def descend(z0, most: int):
            return least_squares(resid, z0, bounds=(lo, hi), x_scale=np.array([p.scale for p in ps]),
                                 diff_step=1e-6, xtol=1e-12, ftol=1e-12, gtol=1e-12, max_nfev=most)

        # a start stuck at a kink spends every evaluation it is given: each start gets a few, the best goes on
        sol = min((descend(z0, SHORT_NFEV) for z0 in best_starts), key=lambda r: float(r.cost))
        if sol.status == 0:  # the best start's evaluations ran out before it converged
            sol = min(sol, descend(sol.x, MAX_NFEV), key=lambda r: float(r.cost))
        x = self.x0.copy()
        x[idx] = sol.x
        return x


#: least_squares evaluations for each start of a fit, then for the best start where it has not converged
SHORT_NFEV, MAX_NFEV = 40, 400


def _fit_time(pricer: _Pricer, base: Params, cases: list[_Case], hold: frozenset = frozenset()
              ) -> tuple[Params, list[str], list[str]]:
    """Fit TIME_PARAMS to measured step times (relative errors): overlap in [0, 1], round_overhead_s >= 0 and (from
    MIN_FOR_COMPUTE timed candidates) the in-step compute_efficiency, tp_overhead_s >= 0 (where a candidate has TP-sp
    collectives) and layer_overhead_s >= 0; only parameters the cases move are fitted (``_TimeFit.free``: with no
    candidate to spare, 5 candidates for 5 parameters on 8 CPU ranks put the compute efficiency at its bound 1.5, a
    44 ms layer overhead, Spearman 0.19 against the ground truth). A parameter named in ``hold`` (measured directly:
    tune's round probe) keeps ``base``'s value."""
    cases = [c for c in cases if c.time is not None]
    if not cases:
        return base, [], ["overlap and round overhead not fitted: no candidate with a measured step time"]
    tf = _TimeFit(pricer, base, cases)
    free, notes = tf.free(hold)
    if not free:
        return base, [], notes + ([] if "round_overhead_s" in hold else
                                  ["round overhead not fitted: no measured candidate runs attention"])
    out = tf.params(tf.solve(free))
    n = f"from {len(cases)} candidate{'s' if len(cases) != 1 else ''}" + (
        ", regularized toward neutral" if len(cases) < len(free) else "")
    words = [f"{p.words.format(p.coordinate(out))} ({n})" for p in TIME_PARAMS if p.field in free]
    return out, words, notes


def _fit_memory(pricer: _Pricer, base: Params, cases: list[_Case]) -> tuple[Params, list[str], list[str]]:
    """Fit memory = rest + activation_factor x activations + overhead to measured peaks (relative errors,
    linear least squares, overhead >= 0); the factor only with two or more candidates whose activations differ by
    > 5%."""
    cases = [c for c in cases if c.memory is not None]
    if not cases:
        return base, [], ["memory not fitted: no candidate with a measured peak memory"]
    meas = np.array([c.memory for c in cases])
    rest, act = pricer.memory_parts(base, cases)
    both = len(cases) >= 2 and act.max() > 1.05 * act.min() > 0
    n = f"from {len(cases)} candidate{'s' if len(cases) != 1 else ''}"
    if both:  # rows: (act/meas) k + (GiB/meas) o = 1 - rest/meas
        a = np.stack([act / meas, GIB / meas], axis=1)
        from scipy.optimize import lsq_linear  # noqa: PLC0415 - only a fit needs SciPy (a plan does not)

        # overhead >= 0: a framework adds memory; a negative constant would price small plans below zero bytes
        sol = lsq_linear(a, 1.0 - rest / meas, bounds=([0.05, 0.0], [20.0, np.inf]))
        k, over = float(sol.x[0]), float(sol.x[1]) * GIB
        return (base.model_copy(update={"activation_factor": k, "memory_overhead_bytes": over}),
                [f"activation factor {k:.3f} ({n})", f"memory overhead {over / GIB:.2f} GiB ({n})"], [])
    k = base.activation_factor
    over = max(0.0, float(np.sum((meas - rest - k * act) / meas ** 2) / np.sum(1.0 / meas ** 2)))  # relative LSQ, >= 0
    return (base.model_copy(update={"memory_overhead_bytes": over}), [f"memory overhead {over / GIB:.2f} GiB ({n})"],
            ["activation factor not fitted: needs 2 measured candidates whose activations differ"])


def _fit_all(pricer: _Pricer, base: Params, cases: list[_Case], hold: frozenset = frozenset()
             ) -> tuple[Params, list[str], list[str]]:
    p, w1, n1 = _fit_time(pricer, base, cases, hold)
    p, w2, n2 = _fit_memory(pricer, p, cases)
    return p, w1 + w2, n1 + n2


#: the time parameters fitted where some candidates move them and not others: (field, two trial values)
WITNESSED = (("tp_overhead_s", 0.0, 1e-3), ("overlap", 0.0, 1.0), ("round_overhead_s", 0.0, 1e-3))


def sole_witnesses(pricer: _Pricer, base: Params, cases: list[_Case], hold: frozenset = frozenset()) -> set[int]:
    """Indices of the timed candidates that alone move a fitted time parameter (the only one with Megatron TP
    collectives moves the TP overhead): a fit without such a candidate cannot identify that parameter, so its
    leave-one-out prediction falls short by whatever the parameter stands for."""
    timed = [c for c in cases if c.time is not None]
    out = set()
    for name, a, b in WITNESSED:
        if name in hold or not timed:
            continue
        lo = pricer.times(base.model_copy(update={name: a}), timed)
        hi = pricer.times(base.model_copy(update={name: b}), timed)
        moved = [c.index for c, x, y in zip(timed, lo, hi) if abs(x - y) > 1e-9 * max(abs(x), 1e-12)]
        if len(moved) == 1:
            out.add(moved[0])
    return out


def _median_err(pred: list[float], meas: list[float]) -> float | None:
    errs = [abs(p - m) / m for p, m in zip(pred, meas)]
    return float(np.median(errs)) if errs else None


def fit(cluster: Cluster, base: Params, candidates: list[MeasuredCandidate], hold: frozenset = frozenset()
        ) -> FitResult:
    """Fit overlap, round overhead, compute efficiency, memory overhead and activation factor to the ok
    candidates (kernel curves and comm fits already in ``base``), with leave-one-out errors before and after;
    the parameters named in ``hold`` (measured directly) keep ``base``'s values."""
    cases = _cases(candidates)
    pricer = _Pricer(cluster, cases)
    _check_cases(pricer, cases)
    params, fitted, notes = _fit_all(pricer, base, cases, hold)
    before_t = pricer.times(base, cases) if cases else np.array([])
    before_m = pricer.memories(base, cases) if cases else np.array([])
    after_t = pricer.times(params, cases) if cases else np.array([])
    after_m = pricer.memories(params, cases) if cases else np.array([])
    loo_t, loo_m = {}, {}
    alone = sole_witnesses(pricer, base, cases, hold)
    for c in cases:  # leave one out: fit without c, predict c
        p, _, _ = _fit_all(pricer, base, [o for o in cases if o is not c], hold)
        if c.time is not None:
            loo_t[c.index] = float(pricer.times(p, [c])[0])
        if c.memory is not None:
            loo_m[c.index] = float(pricer.memories(p, [c])[0])
    timed = [c for c in cases if c.time is not None]
    sized = [c for c in cases if c.memory is not None]
    pos = {c.index: j for j, c in enumerate(cases)}
    res = FitResult(
        params=params, fitted=fitted, notes=notes,
        loo_error_before=_median_err([before_t[pos[c.index]] for c in timed], [c.time for c in timed]),
        loo_error_after=_median_err([loo_t[c.index] for c in timed], [c.time for c in timed]),
        memory_error_before=_median_err([before_m[pos[c.index]] for c in sized], [c.memory for c in sized]),
        memory_error_after=_median_err([loo_m[c.index] for c in sized], [c.memory for c in sized]))
    for i, mc in enumerate(candidates):
        j = pos.get(i)
        res.loo_times.append(None if i in alone else loo_t.get(i))
        if j is None:
            res.predicted_before.append((None, None))
            res.predicted_after.append((None, None))
            res.candidates.append(mc)
            continue
        b = (float(before_t[j]), float(before_m[j]))
        a = (float(after_t[j]), float(after_m[j]))
        res.predicted_before.append(b)
        res.predicted_after.append(a)
        res.candidates.append(mc.model_copy(update={"predicted_before_s": b[0], "predicted_memory_before": b[1],
                                                    "predicted_after_s": a[0], "predicted_memory_after": a[1]}))
    return res


def solo_speedup(samples: list[KernelSample]) -> float | None:
    """``Params.solo_speedup`` from the kernel timings: the median time of the kernels timed with every rank
    computing (those timed by all at once through one shared window where there are such, ``alone`` False) over the
    median time of the same kernels timed by one rank while the others waited (at least 1); None without pairs."""
    key = lambda s: (s.kind, s.size, s.heads, s.gemm, s.causal)  # noqa: E731
    alone: dict = {}
    for s in samples:
        if s.alone and s.seconds > 0:
            alone.setdefault(key(s), []).append(s.seconds)
    synced = any(s.alone is False for s in samples)  # every rank at once (measure_alone): the reference
    ratios = []
    for k, ts in alone.items():
        together = [s.seconds for s in samples if s.seconds > 0 and key(s) == k
                    and (s.alone is False if synced else not s.alone)]
        if together:
            ratios.append(float(np.median(together)) / float(np.median(ts)))
    return max(1.0, min(float(np.median(ratios)), 64.0)) if ratios else None


def measured_params(cluster: Cluster, dtype: str, kernels: list[KernelSample] | None = None,
                    links: dict | None = None, base: Params | None = None) -> Params:
    """``base`` (default neutral) with the kernel curves and the comm fits of these measurements: fit()'s input."""
    base = base or Params()
    upd: dict = {}
    if kernels:
        peak = cluster.device(0).peak_flops.get(dtype)
        if peak is None:
            raise PlanError("dtype", f"the cluster's device has no peak FLOP/s for {dtype}",
                            f"use a dtype it lists {sorted(cluster.device(0).peak_flops)} "
                            f"or add peak_flops.{dtype} to the device in the cluster file")
        check_samples(kernels, peak, has_datasheet(cluster))
        upd.update(kernel_curves(kernels, peak))
        solo = solo_speedup(kernels)
        if solo is not None:
            upd["solo_speedup"] = solo
    if links:
        upd["comm"] = {**base.comm, **comm_fits(cluster, links)}
    out = base.model_copy(update=upd) if upd else base
    check_params(out, cluster, "calibration")
    return out

