"""Stored profiles: list, read, upload (token needed) and delete (token needed)."""
from __future__ import annotations

import json

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response

from sp_plan.planner.profile import Profile
from sp_plan.service.deps import reader, writer
from sp_plan.service.errors import error_responses
from sp_plan.service.state import Service

JSON = "application/json"
router = APIRouter(tags=["store"], responses=error_responses(400, 401, 403, 404, 413, 422, 500, 503))


@router.get("/v1/profiles", response_model=list[Profile])
async def profiles(fingerprint: str | None = None, svc: Service = Depends(reader)):
    """The stored profiles, newest first (optionally of one topology fingerprint)."""
    docs = [p.model_dump(mode="json") for p in await svc.db(svc.store.list_profiles, fingerprint)]
    return Response(json.dumps(docs), media_type=JSON)


@router.get("/v1/profiles/{id}", response_model=Profile)
async def profile(id: str, svc: Service = Depends(reader)):
    """One stored profile (its id or a unique prefix of 4+ characters)."""
    return Response((await svc.db(svc.stored_profile, id)).model_dump_json(), media_type=JSON)


@router.post("/v1/profiles", status_code=201)
async def upload(p: Profile, svc: Service = Depends(writer)):
    """Store a profile (token needed); its id is kept unless another profile holds it. Answers its id.

    Refused with 422 naming the field, as `sp-plan profile import` refuses it: an id other than letters, digits,
    '.', '_' and '-' (starting with a letter or digit, at most 64 characters, no .yaml/.yml/.json suffix), an empty
    or over-long cluster_fingerprint, a created_at more than a day ahead, and figures no device reaches (the
    guide's "Managing profiles")."""
    pid, _ = await svc.db(svc.store.import_profile, p)
    return JSONResponse({"id": pid, "cluster": p.cluster, "fingerprint": p.cluster_fingerprint}, status_code=201)


@router.delete("/v1/profiles/{id}")
async def delete(id: str, svc: Service = Depends(writer)):
    """Remove a stored profile (token needed; its id or a unique prefix of 4+ characters); answers the id removed."""
    return {"deleted": await svc.db(svc.delete_profile, id)}
