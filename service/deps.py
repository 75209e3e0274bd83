"""The routes' dependencies (FastAPI ``Depends``): the running service, and the token checks in front of it."""
from __future__ import annotations

from fastapi import Request

from sp_plan.service import auth
from sp_plan.service.state import Service


def of(request: Request) -> Service:
    """The service the app's lifespan started."""
    return request.app.state.svc


async def service(request: Request) -> Service:
    """The service, with no token check (health and metrics)."""
    return of(request)


async def reader(request: Request) -> Service:
    """The service, for a read: a token is needed only when it runs with --private."""
    svc = of(request)
    if svc.settings.private:
        auth.check(request.headers.get("authorization"), svc.tokens)
    return svc


async def writer(request: Request) -> Service:
    """The service, for a write: a token is always needed."""
    svc = of(request)
    auth.check(request.headers.get("authorization"), svc.tokens)
    return svc
