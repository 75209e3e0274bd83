"""Operations: the health check and the Prometheus metrics (no token needed, even with --private)."""
from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel

from sp_plan.service.deps import service
from sp_plan.service.state import Service

router = APIRouter(tags=["ops"])


class Health(BaseModel):
    """The health check's answer: "ok" or "store unavailable", and the store it asked (its password hidden)."""

    status: str
    store: str


@router.get("/healthz", response_model=Health,
            responses={503: {"model": Health, "description": "the store does not answer, or not at this schema"}})
async def healthz(svc: Service = Depends(service)):
    """200 when the store answers with the schema this sp-plan writes, else 503."""
    ok = await asyncio.to_thread(svc.store.healthy)
    if not ok:
        svc.metrics.store_errors.inc()
    return JSONResponse({"status": "ok" if ok else "store unavailable", "store": svc.store.shown},
                        status_code=200 if ok else 503)


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(svc: Service = Depends(service)):
    """Prometheus metrics: requests, latency by endpoint, search time, cache results, store errors."""
    return PlainTextResponse(svc.metrics.render(), media_type="text/plain; version=0.0.4")
