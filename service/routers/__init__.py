"""The service's routes, one router per resource, in the order the OpenAPI document lists them."""
from __future__ import annotations

from sp_plan.service.routers import ops, plans, presets, profiles

ROUTERS = (plans.router, presets.router, profiles.router, ops.router)
