"""sp-plan: plan, tune and run sequence-parallel layouts of long-sequence Transformers on a measured cluster.

    import sp_plan
    cluster, model = sp_plan.load_cluster("dgx-h100", nodes=2), sp_plan.load_model("llama3-8b")
    ranked = sp_plan.plan(cluster, model, sp_plan.Workload(seq_len="128k"))   # RankedPlans: .to_pandas()
    best = ranked[0]
    pred = sp_plan.estimate(best, cluster, model, sp_plan.Workload(seq_len="128k"), profile=False)
    ctx = sp_plan.init("plan.yaml")        # on every rank of an initialized torch.distributed world

The names below are loaded on first use, so ``import sp_plan`` stays light (no torch until the runtime is asked
for); each lives in its layer (sp_plan.planner, sp_plan.profiles, sp_plan.runtime, sp_plan.pipeline), which the README uses.
"""
from __future__ import annotations

import importlib

#: public name -> the module that defines it
_EXPORTS = {
    # the application pipeline's plan and estimate: the profile looked up, then the planner's pure functions
    "plan": "sp_plan.pipeline", "estimate": "sp_plan.pipeline", "RankedPlans": "sp_plan.planner.ranking",
    "Plan": "sp_plan.planner.plan",
    "Cluster": "sp_plan.planner.cluster", "ModelSpec": "sp_plan.planner.model", "Workload": "sp_plan.planner.model",
    "PlanError": "sp_plan.planner.errors", "load_cluster": "sp_plan.profiles", "load_model": "sp_plan.profiles",
    "Store": "sp_plan.profiles.store", "Profile": "sp_plan.planner.profile", "init": "sp_plan.runtime",
    "resolve_profile": "sp_plan.profiles.resolve",
}

__all__ = sorted(_EXPORTS)
#: the subpackages an attribute of the package loads
_SUBPACKAGES = ("planner", "runtime", "profiles", "integrations", "client", "service", "cli")


def __getattr__(name: str):
    """Load an exported name from its module on first use (PEP 562); ``__version__`` from the installed package."""
    if name == "__version__":
        from importlib.metadata import version  # noqa: PLC0415

        return version("sp-plan")
    if name in _SUBPACKAGES:  # `import sp_plan; sp_plan.runtime.init(...)` as after `import sp_plan.runtime`
        return importlib.import_module(f"sp_plan.{name}")
    if name not in _EXPORTS:
        raise AttributeError(f"module 'sp_plan' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
