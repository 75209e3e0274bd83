"""Operations: the health check and the Prometheus metrics (no token needed, even with --private)."""
from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response

from sp_plan.service.deps import service
from sp_plan.service.state import Service

router = APIRouter(tags=["ops"])


@router.get("/healthz")
async def healthz(svc: Service = Depends(service)):
    """200 when the store answers with the schema this sp-plan writes, else 503."""
    ok = await asyncio.to_thread(svc.store.healthy)
    if not ok:
        svc.metrics.store_errors.inc()
    return JSONResponse({"status": "ok" if ok else "store unavailable", "store": svc.store.shown},
                        status_code=200 if ok else 503)


@router.get("/metrics")
async def metrics(svc: Service = Depends(service)):
    """Prometheus metrics: requests, latency by endpoint, search time, cache results, store errors."""
    return Response(svc.metrics.render(), media_type="text/plain; version=0.0.4")
