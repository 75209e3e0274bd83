"""sp-plan's runtime: process groups from a plan and exact distributed attention.

    from sp_plan.runtime import init
    ctx = init("plan.yaml")     # inside an initialized torch.distributed world
"""
from .context import Context, init

__all__ = ["Context", "init"]
