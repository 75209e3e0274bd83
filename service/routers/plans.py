"""Plans and estimates: POST /v1/plan, POST /v1/estimate, and the plans the service computed (GET /v1/plans/...)."""
from __future__ import annotations

import asyncio
import hashlib
from functools import partial

from fastapi import APIRouter, Depends
from fastapi.responses import HTMLResponse, Response

from sp_plan.service.answers import encoded
from sp_plan.service.errors import error_responses
from sp_plan.service.deps import reader
from sp_plan.pipeline import (EstimateRequest, EstimateResponse, PlanRequest, PlanResponse, build_cluster,
                                      request_key, resolve, run_estimate)
from sp_plan.service.pool import report_job
from sp_plan.service.state import Service, check_sources

JSON = "application/json"
router = APIRouter(tags=["plan"], responses=error_responses(400, 401, 403, 404, 413, 422, 500, 503))


@router.post("/v1/plan", response_model=PlanResponse)
async def plan(req: PlanRequest, svc: Service = Depends(reader)):
    """Ranked plans with breakdowns, the winner as a plan file, and the profile used."""
    raw = hashlib.sha256(req.model_dump_json().encode()).hexdigest()
    body = await remembered(svc, req, raw)
    if body is not None:
        svc.metrics.cache.labels("memory").inc()
        return Response(body, media_type=JSON)
    # identical requests in flight are built and resolved once (not 8 clusters built at once, each slowing the
    # one whose search the others wait for); one that waited checks the profile stamp, as a remembered one does
    (body, stamp), how = await svc.answers.requests.get(raw, partial(answer, svc, req, raw))
    if how == "coalesced" and not await unchanged(svc, req, raw, stamp):  # a profile changed while it waited
        (body, stamp), how = await answer(svc, req, raw)
    svc.metrics.cache.labels(how).inc()
    return Response(body, media_type=JSON)


async def remembered(svc: Service, req: PlanRequest, raw: str) -> bytes | None:
    """The body sent for this raw request before, if its profile is unchanged: one indexed query for the profile's
    stamp, no cluster built."""
    fp = svc.answers.fingerprint(raw)
    return None if fp is None else svc.answers.remembered(raw, await svc.stamp(req, fp))


async def unchanged(svc: Service, req: PlanRequest, raw: str, stamp: str | None) -> bool:
    """Whether the profile of a raw request answered with ``stamp`` still has that stamp."""
    fp = svc.answers.fingerprint(raw)
    return fp is not None and stamp == await svc.stamp(req, fp)


async def answer(svc: Service, req: PlanRequest, raw: str) -> tuple[tuple[bytes, str | None], str]:
    """((body, profile stamp), how): build the cluster and resolve the inputs, then a kept answer or the search."""
    check_sources(req.cluster, req.model)
    cluster = await asyncio.to_thread(build_cluster, req, svc.settings.max_world, False)  # names: presets only
    fp = cluster.topology_fingerprint()
    stamp = await svc.stamp(req, fp)  # read before the profile: a stamp never names a newer profile than used
    prof = await svc.db(svc.stored_profile, req.profile)
    inputs = await svc.db(resolve, req, svc.store, svc.settings.max_world, prof, cluster, False)
    key = request_key(req, inputs)
    both, how = await svc.answers.get(key, partial(searched, svc, req, inputs, key))
    body = both[req.families]
    svc.answers.remember(raw, fp, stamp, body)
    return (body, stamp), how


async def searched(svc: Service, req: PlanRequest, inputs, key: str) -> tuple[dict, str | None]:
    """The search for a new request key: the whole answer (with families) as it is stored, and its profile's id."""
    res = await svc.search(req.model_copy(update={"families": True}), inputs, svc.store.url, f"sp-plan-{key}")
    res.id = key
    return {"response": res.model_dump(mode="json"), "request": req.model_dump(mode="json")}, res.profile


@router.post("/v1/estimate", response_model=EstimateResponse)
async def estimate(req: EstimateRequest, svc: Service = Depends(reader)):
    """One plan priced on a cluster: step time, MFU, memory and the per-phase breakdown."""
    check_sources(req.cluster, req.model)
    prof = await svc.db(svc.stored_profile, req.profile)
    res = await svc.db(run_estimate, req, svc.store, svc.settings.max_world, prof, False)  # names: presets only
    return Response(res.model_dump_json(), media_type=JSON)


@router.get("/v1/plans/{id}", response_model=PlanResponse)
async def get_plan(id: str, families: bool = False, svc: Service = Depends(reader)):
    """A plan response the service computed (kept in the store); ``?families=true`` as in POST /v1/plan."""
    doc = await svc.db(svc.answers.document, id)
    return Response(encoded(doc["response"])[families], media_type=JSON)


@router.get("/v1/plans/{id}/report", response_class=HTMLResponse)
async def report(id: str, svc: Service = Depends(reader)):
    """The HTML report of a computed plan (what `sp-plan plan --report` writes), rendered in the process pool."""
    doc = await svc.db(svc.answers.document, id)
    res = PlanResponse.model_validate(doc["response"])
    prof = await svc.db(svc.kept_profile, res.profile)  # a profile deleted since: no measured candidates shown
    render = partial(rendered, svc, PlanRequest.model_validate(doc["request"]), res, prof)
    page, _ = await svc.reports.get(f"{id}/{prof.id if prof else '-'}", render)
    return HTMLResponse(page)


async def rendered(svc: Service, req: PlanRequest, res: PlanResponse, prof) -> tuple[str, str]:
    """(the report page of a computed plan, 'computed'), rendered in the process pool."""
    return await svc.pool.run("report", "retry", report_job, req, res, prof), "computed"
