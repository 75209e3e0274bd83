"""sp-plan's planner: cluster graphs, layouts, schedules, the link-load cost engine and search.

    from sp_plan.planner import Cluster, ModelSpec, Workload, Plan, plan, estimate
"""
from . import usp, metp, tokenring, wallfacer  # noqa: F401 (each registers its algorithm, in this order)
from .cluster import Cluster, Device, Link, NodeType, Switch
from .errors import PlanError
from .estimate import Estimator, estimate
from .layout import Layout
from .model import ModelSpec, Workload, parse_seq_len
from .plan import Plan, Prediction
from .candidate import Candidate
from .search import Space, grid_search, plan

__all__ = ["Cluster", "Device", "Link", "NodeType", "Switch", "PlanError", "Estimator", "estimate", "Layout",
           "ModelSpec", "Workload", "parse_seq_len", "Plan", "Prediction", "Candidate", "Space", "grid_search", "plan"]
