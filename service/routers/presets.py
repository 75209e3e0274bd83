"""What the service knows of clusters and models: the presets, and the clusters the store holds profiles for."""
from __future__ import annotations

from fastapi import APIRouter, Depends

from sp_plan.profiles import cluster_presets, load_model, model_presets
from sp_plan.profiles.documents import document_presets
from sp_plan.service.deps import reader
from sp_plan.service.errors import error_responses
from sp_plan.service.state import Service

router = APIRouter(tags=["store"], responses=error_responses(401, 403, 500, 503))


@router.get("/v1/presets")
async def presets(svc: Service = Depends(reader)):
    """The cluster presets (names), model presets (their specs) and named document-length distributions."""
    return {"clusters": cluster_presets(), "models": {n: load_model(n, files=False).model_dump(mode="json") for n in model_presets()},
            "documents": document_presets()}


@router.get("/v1/clusters")
async def clusters(svc: Service = Depends(reader)):
    """The clusters the store holds profiles for: name, topology fingerprint, profile count, newest profile."""
    seen: dict[tuple, dict] = {}
    for p in await svc.db(svc.store.list_profiles):  # newest first
        row = seen.setdefault((p.cluster, p.cluster_fingerprint), {
            "cluster": p.cluster, "fingerprint": p.cluster_fingerprint, "profiles": 0, "latest_profile": p.id,
            "latest_created_at": p.created_at})
        row["profiles"] += 1
    return list(seen.values())
