"""sp-plan's planner: cluster graphs, layouts, schedules, the link-load cost engine and search.

    from sp_plan.planner import Cluster, ModelSpec, Workload, Plan, plan, estimate

The names below are loaded on first use (PEP 562) and the algorithms register on the registry's first read, so a
command that reads a preset or a plan file imports neither the cost engine, the search, the schedules nor numpy.
"""
from __future__ import annotations

import importlib
import sys
import types

#: the modules that register the built-in algorithms, in this order (planner/algorithms.py imports them on the
#: registry's first read)
ALGORITHM_MODULES = ("usp", "metp", "tokenring", "wallfacer", "allgather")

#: public name -> the planner module that defines it
_EXPORTS = {
    "Cluster": "cluster", "Device": "cluster", "Link": "cluster", "NodeType": "cluster", "Switch": "cluster",
    "PlanError": "errors", "Estimator": "estimate", "estimate": "estimate", "Layout": "layout",
    "ModelSpec": "model", "Workload": "model", "parse_seq_len": "model", "Plan": "plan", "Prediction": "plan",
    "Candidate": "candidate", "Space": "search", "grid_search": "search", "plan": "search",
}

__all__ = ["Cluster", "Device", "Link", "NodeType", "Switch", "PlanError", "Estimator", "estimate", "Layout",
           "ModelSpec", "Workload", "parse_seq_len", "Plan", "Prediction", "Candidate", "Space", "grid_search", "plan"]


def __getattr__(name: str):
    """Load an exported name from its module on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


class _Package(types.ModuleType):
    """The package, whose ``plan`` and ``estimate`` are the functions, not the submodules of those names: importing
    a submodule sets it on its package (setattr), which would otherwise hide the function loaded on first use."""

    def __setattr__(self, name: str, value) -> None:
        if name in ("plan", "estimate") and isinstance(value, types.ModuleType):
            return  # the submodule stays in sys.modules
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
