"""The nearest plan a target can express: the best-ranked layout of the same search space restricted to it."""
from __future__ import annotations

from dataclasses import dataclass

from sp_plan.planner.cluster import Cluster
from sp_plan.planner.errors import PlanError, of_type
from sp_plan.planner.profile import pure_inputs
from sp_plan.planner.estimate import Estimator
from sp_plan.planner.model import ModelSpec, Workload
from sp_plan.planner.params import Params
from sp_plan.planner.plan import Plan
from sp_plan.planner.search import Degrees, Space, best_per_variant, grid_search, profile_tag

from .target import Target


@dataclass
class TargetSpace(Space):
    """The search space (search.Space) less what ``target`` cannot express: degrees, layouts, orders, policies."""

    target: Target | None = None

    def degrees(self):
        """The degrees the target runs: its packed documents, its own degree rules and its Ulysses head split."""
        packed = self.work.documents is not None and not self.target.documents
        # documents only under Ulysses (Megatron): a ring's degrees run none of the algorithms that take them
        ulysses_only = self.work.documents is not None and set(self.target.documents) == {"ulysses"}
        for d in super().degrees():
            if packed and d.ulysses * d.ring > 1:  # the target packs documents only without context parallelism
                continue
            if ulysses_only and d.ring > 1:
                continue
            if self.target.degree_problems(_named(d), self.model):  # e.g. a Ulysses degree its heads do not take
                continue
            if self.orders(d) and self.layouts(d) and self.policies(d):
                yield d

    def layouts(self, d: Degrees) -> list[str]:
        out = super().layouts(d)
        return [t for t in out if t in self.target.token_layouts] if self.work.causal and d.ring > 1 else out

    def orders(self, d: Degrees) -> list[tuple[str, ...]]:
        return list(self._memo("target orders", tuple(d.dims()), lambda: tuple(self._orders(d))))

    def _orders(self, d: Degrees) -> list[tuple[str, ...]]:
        """The orders of ``d``'s dimensions the target places; they depend only on which degrees exceed 1."""
        degrees = _named(d)
        if any(v > 1 and k not in self.target.dims() for k, v in degrees.items()):
            return []
        placed = self.target.placed(degrees)
        return [o for o in super().orders(d) if tuple(x for x in o if degrees[x] > 1) in placed]

    def policies(self, d: Degrees, v: int = 1) -> list[tuple[int, str, int]]:
        """The policies whose ZeRO stage and checkpointing the target has with these degrees."""
        rule = self.target.zero_rule if self.work.training else None
        return [(z, ck, mbs) for z, ck, mbs in super().policies(d, v)
                if z in self.target.zero_stages and ck in self.target.checkpointing
                and not (rule and rule(_named(d), z))]

    def virtual_stages(self, d: Degrees) -> list[int]:
        return super().virtual_stages(d) if self.target.virtual_stages else [1]


def _named(d: Degrees) -> dict[str, int]:
    """The degrees as a plan names them."""
    return {"dp": d.dp, "pp": d.pp, "tp": d.tp, "ulysses": d.ulysses, "ring": d.ring}


@dataclass
class Nearest:
    """The nearest expressible plan (priced, with groups) and the original's predicted step time on the same inputs."""

    plan: Plan
    original_step_s: float

    @property
    def change(self) -> float:
        """Step time of the nearest plan relative to the original (0.061: 6.1 % slower)."""
        return self.plan.predicted.step_time_s / self.original_step_s - 1


def nearest(target: Target, original: Plan, cluster: Cluster, model: ModelSpec, workload: Workload,
            params: Params | None = None, profile=None) -> Nearest:
    """The best-ranked plan for ``cluster``, ``model`` and ``workload`` that ``target`` can express, and the
    original's step time priced by the same Estimator (grid search; each algorithm variant's best is exact)."""
    of_type("target", target, Target, "sp_plan.integrations.export.target(name), e.g. target(\"megatron\")")
    of_type("original", original, Plan, "a Plan (Plan.load(file), or one sp_plan.plan returned)")
    pure_inputs(cluster, model, workload, None)
    of_type("params", params, (Params, type(None)), "a Params, or None for the uncalibrated engine")
    _workload_bars(target, original, workload, done=False)
    est = Estimator(cluster, model, workload, params=params)
    before = est(original).step_time_s
    space = TargetSpace(cluster.world_size, model, workload, target=target)
    res = grid_search(cluster, model, workload, space=space, keep=1, params=params)
    for _, c in best_per_variant(res.ranked):
        c = res.estimator.with_stages(c)  # uneven stages, written where pp divides no layers
        p = c.to_plan(cluster=cluster.name, cluster_fingerprint=res.estimator.fingerprint, model=model,
                      workload=workload, profile=profile_tag(profile))
        if not target.problems(p):
            return Nearest(p.model_copy(update={"predicted": res.estimator.predict(c)}).with_groups(), before)
    _workload_bars(target, original, workload, done=True)
    raise PlanError("to", f"no layout of {cluster.world_size} ranks that {target.name} can express fits this "
                    f"model and workload", "export to another target or make a plan for other inputs")


def same_plan_in_another_order(target: Target, original: Plan, cluster: Cluster, params: Params | None = None
                               ) -> Plan | None:
    """``original`` in a mesh order ``target`` places and the planner prices alike (step time and peak memory within
    rounding: what `plan` shows as "same: order ..."), the first such order of its dimensions of degree > 1; None
    where no order the target places prices alike. A representative of equally priced orders is chosen by the
    search's order, not by what a framework can place."""
    from itertools import permutations  # noqa: PLC0415

    from sp_plan.planner.equivalent import same_cost  # noqa: PLC0415

    est = Estimator(cluster, original.model, original.workload, params=params)
    base = original.model_copy(update={"predicted": est(original)})
    split = [d for d in original.order if original.degrees.get(d, 1) > 1]
    rest = [d for d in original.order if d not in split]
    for perm in permutations(split):
        alt = original.model_copy(update={"order": list(perm) + rest})
        if list(perm) == split or target.problems(alt):
            continue
        alt = alt.model_copy(update={"predicted": est(alt)})
        if same_cost(base, alt):
            return alt.with_groups()
    return None


#: the workload's parts an export may be unable to carry, and the flag a plan without them is made without
_WORKLOAD_FLAGS = {"window": "--window", "documents": "--documents"}


def _workload_bars(target: Target, original: Plan, workload: Workload, done: bool) -> None:
    """A PlanError naming what of the workload keeps ``target`` from every layout: a sliding window at once where the
    export carries none (no layout is searched); a window or packed documents once the search found no layout that
    carries them."""
    bars = [(k, why) for k, why in target.mask_problems(original.model_copy(update={"workload": workload}))
            if k in _WORKLOAD_FLAGS and (done or (k == "window" and not target.windows))]
    if bars:
        key, why = bars[0]
        raise PlanError(key, why, f"export a plan made without {_WORKLOAD_FLAGS[key]}, or run it with sp-plan's "
                        "runtime (`sp_plan.init`)")
