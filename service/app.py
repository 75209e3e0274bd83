"""The planner service: FastAPI over the application pipeline (sp_plan.pipeline) and the profile store (design.md, "The store and the service").

``create_app(Settings)`` builds one app from the routers in service/routers/ (one per resource), whose routes take
the running ``Service`` (service/state.py) as a dependency; ``app_from_env`` is uvicorn's factory for
``--workers N`` (the settings travel in ``$SP_PLAN_SERVE_SETTINGS``, tokens never: each worker reads the token file
or ``$SP_PLAN_TOKENS`` itself). Searches run in a process pool off the event loop (service/pool.py); identical
concurrent requests are computed once and answers are kept by request key (service/answers.py), in memory and in
the ``service_plans`` table, written before the answer is sent. An error's class gives its HTTP status
(service/errors.py).
"""
from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from sp_plan.service import errors
from sp_plan.service.errors import error_response
from sp_plan.service.limits import BodyLimit
from sp_plan.service.metrics import Counted
from sp_plan.service.pool import die_with_parent, freeze_heap  # noqa: F401 - where the service's callers find them
from sp_plan.service.routers import ROUTERS
from sp_plan.service.settings import SETTINGS_ENV, Settings, settings_env  # noqa: F401 - likewise
from sp_plan.service.state import Service


@asynccontextmanager
async def lifespan(app: FastAPI):
    """Start the service (store, pool warmed up, heap frozen if asked) for the app's life, then close it."""
    settings: Settings = app.state.settings
    svc = Service(settings)
    app.state.svc = svc
    await svc.pool.warm()
    if settings.freeze_gc:
        freeze_heap()
    try:
        yield
    finally:
        svc.close()


def create_app(settings: Settings | None = None) -> FastAPI:
    """The FastAPI app of `sp-plan serve`."""
    app = FastAPI(title="sp-plan", summary="sequence-parallel layouts for long-context Transformers, as a service",
                  lifespan=lifespan)
    app.state.settings = settings or Settings()
    app.add_middleware(BodyLimit, max_bytes=app.state.settings.max_body, on_error=error_response)
    app.add_middleware(Counted)
    errors.install(app)
    for router in ROUTERS:
        app.include_router(router)
    return app


def app_from_env() -> FastAPI:
    """uvicorn's factory (``--workers N``): the settings from ``$SP_PLAN_SERVE_SETTINGS`` (service/settings.py)."""
    return create_app(Settings())
