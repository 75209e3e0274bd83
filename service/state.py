"""One running service's state: its settings, store, tokens, search pool, answers and metrics."""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

from sp_plan.planner.errors import NotFound, PlanError, StoreError
from sp_plan.planner.profile import Profile
from sp_plan.profiles import cluster_presets, model_presets, unknown_cluster
from sp_plan.planner.yamlio import FILE_SUFFIXES
from sp_plan.profiles.store import Store
from sp_plan.service import auth
from sp_plan.service.answers import Answers
from sp_plan.service.cache import Coalescer
from sp_plan.service.metrics import Metrics
from sp_plan.pipeline import PlanRequest, PlanResponse
from sp_plan.service.pool import SearchPool, rebuilt, search_job
from sp_plan.service.settings import Settings

PROFILES_FIX = "see the stored ids at GET /v1/profiles"


#: rendered report pages the service keeps (a 65,536-rank plan's is about 1.7 MB)
REPORTS_KEPT = 16


class Service:
    """What the routes share, made once at startup (the app's lifespan) and closed at shutdown."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.store = Store(settings.store)
        self.tokens = auth.load_tokens(settings.token_file, settings.listed_tokens())
        self.metrics = Metrics()
        self.pool = SearchPool(settings.processes or max(1, os.cpu_count() or 1))
        self.answers = Answers(self.store, settings.cache_size, offload=self.db)
        # rendered report pages by (plan id, profile id): a large plan's page takes seconds of a pool process and
        # reads are open, so a page is rendered once, and a few are kept (one can be megabytes)
        self.reports = Coalescer(REPORTS_KEPT)

    def close(self) -> None:
        """Stop the search pool and release the store's connections."""
        self.pool.close()
        self.store.close()

    # ---- the store, off the event loop
    async def db(self, fn, *args):
        """A store call in a thread; a StoreError is counted (and answered 503)."""
        try:
            return await asyncio.to_thread(fn, *args)
        except StoreError:
            self.metrics.store_errors.inc()
            raise

    async def stamp(self, req: PlanRequest, fingerprint: str) -> str | None:
        """The stamp of the profile ``req`` would be priced with (Store.profile_stamp); 'none' without one."""
        if not req.use_profile:
            return "none"
        if self.store.engine.dialect.name != "sqlite":
            return await self.db(self.store.profile_stamp, fingerprint, req.profile)
        try:  # a local indexed read (~0.5 ms): cheaper than a thread hop
            return self.store.profile_stamp(fingerprint, req.profile)
        except StoreError:
            self.metrics.store_errors.inc()
            raise

    def stored_profile(self, id: str | None) -> Profile | None:
        """The stored profile a request names (NotFound if unknown; a file path is refused)."""
        if id is None:
            return None
        if "/" in id or "\\" in id or Path(id).suffix.lower() in FILE_SUFFIXES:
            raise PlanError("profile", f"{id!r} is not a profile id", "upload the file to POST /v1/profiles and pass its id")
        try:
            return self.store.get_profile(id)
        except NotFound as e:
            raise NotFound(e.field, e.problem, PROFILES_FIX) from None

    def delete_profile(self, id: str) -> str:
        """Remove a stored profile (NotFound, pointing at GET /v1/profiles, if unknown); returns its id."""
        try:
            return self.store.delete_profile(id)
        except NotFound as e:
            raise NotFound(e.field, e.problem, PROFILES_FIX) from None

    def kept_profile(self, id: str | None) -> Profile | None:
        """The stored profile an answer was priced with, or None (none, a file, or deleted since)."""
        if not id or id == "file":
            return None
        try:
            return self.store.get_profile(id)
        except NotFound:
            return None

    # ---- the search pool
    async def search(self, req: PlanRequest, inputs, storage: str | None, study: str | None) -> PlanResponse:
        """The search in a pool process, timed into the metrics; its PlanError raised here with its class."""
        how, value, seconds = await self.pool.run("search", "retry; if it recurs, ask for a smaller world",
                                                  search_job, req, inputs, storage, study)
        self.metrics.search.labels(req.search).observe(seconds)
        if how == "error":
            raise rebuilt(value)
        return value


def check_sources(cluster, model) -> None:
    """Presets by name only (a name is never read as a server-side file): an unknown one is NotFound."""
    if isinstance(cluster, str) and cluster not in cluster_presets():
        raise unknown_cluster(cluster, NotFound, " or send an inline cluster")
    if isinstance(model, str) and model not in model_presets():
        raise NotFound("model", f"unknown preset {model!r}", f"use one of {model_presets()} or send an inline model")
