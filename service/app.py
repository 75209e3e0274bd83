"""The planner service: FastAPI over service/planning.py and the profile store (design.md, "The store and the service").

``create_app(Settings)`` builds one app; ``app_from_env`` is uvicorn's factory for ``--workers N`` (the
settings travel in ``$SP_PLAN_SERVE_SETTINGS``, tokens never: each worker reads the token file or
``$SP_PLAN_TOKENS`` itself). Searches run in a process pool off the event loop; identical concurrent
requests are computed once and answers are kept by request key (service/cache.py), in memory and in
the store's ``service_plans`` table, written before the answer is sent.
"""
from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from fastapi.responses import HTMLResponse, JSONResponse, Response

from sp_plan.planner.errors import PlanError
from sp_plan.planner.profile import Profile
from sp_plan.service import auth
from sp_plan.service.cache import LRU, Coalescer
from sp_plan.service.collector import collector_paused
from sp_plan.service.limits import BodyLimit, TooLarge
from sp_plan.service.metrics import Metrics
from sp_plan.service.planning import (MAX_WORLD, EstimateRequest, EstimateResponse, PlanRequest, PlanResponse,
                                      build_cluster, request_key, resolve, run_estimate, search)

SETTINGS_ENV = "SP_PLAN_SERVE_SETTINGS"
JSON = "application/json"


def die_with_parent(parent: int) -> None:
    """Search-pool initializer: end this worker when the server that started it is gone (a SIGKILLed server
    cannot shut its pool down, and an orphaned worker would wait on its queue forever)."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="sp-plan-parent-watch", daemon=True).start()


def freeze_heap() -> None:
    """Collect once, then freeze what survives (gc.freeze): the ~10^5 objects of the imported planner, torch, FastAPI
    and SQLAlchemy are never traversed again, so a full collection no longer stalls every request in flight (0.05-0.3 s
    measured with benchmarks/bench_serve.py's cached workload)."""
    gc.collect()
    gc.freeze()


@dataclass
class Settings:
    """What `sp-plan serve` was started with."""

    store: str | None = None
    token_file: str | None = None
    private: bool = False
    max_world: int = MAX_WORLD
    max_body: int = 4 * 2**20
    processes: int | None = None  # search processes (default: the cores / uvicorn workers)
    cache_size: int = 1024
    freeze_gc: bool = False  # `sp-plan serve`: move the startup heap out of the collector's reach (gc.freeze)


class NotFound(PlanError):
    """An unknown preset, profile or plan: 404."""


class Unavailable(PlanError):
    """The store or the search pool failed: 503."""


def status_of(e: PlanError) -> int:
    if isinstance(e, auth.Unauthorized):
        return e.status
    if isinstance(e, NotFound):
        return 404
    if isinstance(e, TooLarge):
        return 413
    if isinstance(e, Unavailable) or e.field == "--store":
        return 503
    return 422


def error_response(e: PlanError, status: int | None = None) -> JSONResponse:
    """The JSON error body: the field, the problem and the fix (the CLI's one line in ``detail``)."""
    return JSONResponse({"error": {"field": e.field, "problem": e.problem, "fix": e.fix}, "detail": str(e)},
                        status_code=status or status_of(e))


def _validation_error(exc: RequestValidationError) -> PlanError:
    """pydantic's errors as one PlanError: the deepest location (the branch of a union the input was meant for)."""
    errs = exc.errors()
    e = max(errs, key=lambda x: len(x.get("loc", ()))) if errs else {"loc": ("body",), "msg": "invalid"}
    if e.get("type") == "json_invalid":
        return PlanError("body", f"not valid JSON ({e.get('msg', 'invalid')})", "send a JSON body as in /openapi.json")
    loc = [str(x) for x in e.get("loc", ()) if x not in ("body", "str", "Cluster", "ModelSpec", "Workload", "Plan")
           and not str(x).startswith("function-")]
    return PlanError(".".join(loc) or "body", e.get("msg", "invalid"),
                     "fix that field" if loc else "send a JSON body as in /openapi.json")


def encoded(response: dict) -> tuple[bytes, bytes]:
    """A plan answer as sent: (without families, with them), encoded once and served as bytes on every hit."""
    return json.dumps({**response, "families": []}).encode(), json.dumps(response).encode()


def _search_job(req: PlanRequest, inputs, storage: str | None, study: str | None):
    """In a pool process: the search, or the PlanError as plain fields (it does not pickle by itself); the pool
    process owns its garbage collector, paused around the search (``collector_paused``)."""
    t0 = time.perf_counter()
    try:
        with collector_paused():
            res = search(req, inputs, storage=storage, study=study)
        return "ok", res, time.perf_counter() - t0
    except PlanError as e:
        return "error", (e.field, e.problem, e.fix), time.perf_counter() - t0


def _report_job(req: PlanRequest, res: PlanResponse, profile: Profile | None) -> str:
    """In a pool process: the HTML report (integrations/report.py, matplotlib) of a computed plan, as `plan --report`
    writes it: the top plans and the best of every other variant, about the winner."""
    from sp_plan.cli.report import report_plans  # noqa: PLC0415
    from sp_plan.integrations.report import render_report  # noqa: PLC0415
    from sp_plan.planner.equivalent import group  # noqa: PLC0415

    rows, chosen = report_plans([r.plan for r in group(res.plans)], res.families)
    return render_report(rows, build_cluster(req, None), profile=profile, chosen=chosen, notes=[res.profile_line])


def _warm() -> None:
    """Import the planner in a pool process before the first request needs it."""
    import sp_plan.planner.bayes  # noqa: F401,PLC0415
    import sp_plan.planner.search  # noqa: F401,PLC0415


class Service:
    """One app's state: store, tokens, pool, cache and metrics."""

    def __init__(self, settings: Settings):
        from sp_plan.profiles.store import Store  # noqa: PLC0415

        self.settings = settings
        self.store = Store(settings.store)
        self.tokens = auth.load_tokens(settings.token_file)
        self.metrics = Metrics()
        self.cache = Coalescer(settings.cache_size)  # by request key (resolved inputs + profile version)
        self.fingerprints = LRU(settings.cache_size)  # raw request hash -> the cluster's topology fingerprint
        self.answers = LRU(settings.cache_size)  # (raw request hash, profile stamp) -> answer
        self.requests = Coalescer(0)  # raw request hash -> the identical request in flight (nothing kept)
        self.processes = settings.processes or max(1, os.cpu_count() or 1)
        self.pool = self._pool()

    def _pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(self.processes, mp_context=get_context("spawn"), initializer=die_with_parent,
                                   initargs=(os.getpid(),))

    async def warm(self) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(self.pool, _warm) for _ in range(self.processes)))

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.store.close()

    async def db(self, fn, *args):
        """A store call in a thread; failures counted and answered 503."""
        try:
            return await asyncio.to_thread(fn, *args)
        except PlanError as e:
            if e.field == "--store":
                self.metrics.store_errors.inc()
            raise

    async def run_search(self, req: PlanRequest, inputs, storage, study) -> PlanResponse:
        loop = asyncio.get_running_loop()
        try:
            how, value, seconds = await loop.run_in_executor(self.pool, _search_job, req, inputs, storage, study)
        except BrokenProcessPool:
            self.pool = self._pool()  # a search process died (killed, out of memory): a fresh pool for the next
            raise Unavailable("search", "the search process died", "retry; if it recurs, ask for a smaller world") from None
        self.metrics.search.labels(req.search).observe(seconds)
        if how == "error":
            raise PlanError(*value)
        return value

    async def stamp(self, req: PlanRequest, fingerprint: str) -> str | None:
        """The stamp of the profile ``req`` would be priced with (Store.profile_stamp); 'none' without one."""
        if not req.use_profile:
            return "none"
        if self.store.engine.dialect.name == "sqlite":  # a local indexed read (~0.5 ms): cheaper than a thread hop
            try:
                return self.store.profile_stamp(fingerprint, req.profile)
            except PlanError:
                self.metrics.store_errors.inc()
                raise
        return await self.db(self.store.profile_stamp, fingerprint, req.profile)

    # ---- request checks
    def check_sources(self, cluster, model) -> None:
        """Presets by name only (a name is never read as a server-side file): unknown ones are 404."""
        from sp_plan.profiles import cluster_presets, model_presets  # noqa: PLC0415

        if isinstance(cluster, str) and cluster not in cluster_presets():
            raise NotFound("cluster", f"unknown preset {cluster!r}", f"use one of {cluster_presets()} or send an inline cluster")
        if isinstance(model, str) and model not in model_presets():
            raise NotFound("model", f"unknown preset {model!r}", f"use one of {model_presets()} or send an inline model")

    def stored_profile(self, id: str | None) -> Profile | None:
        """The stored profile a request names (404 if unknown; a file path is refused)."""
        if id is None:
            return None
        if "/" in id or "\\" in id or Path(id).suffix in (".yaml", ".yml", ".json"):
            raise PlanError("profile", f"{id!r} is not a profile id", "upload the file to POST /v1/profiles and pass its id")
        try:
            return self.store.get_profile(id)
        except PlanError as e:
            if e.field == "profile":
                raise NotFound(e.field, e.problem, "see the stored ids at GET /v1/profiles") from None
            raise


class Counted:
    """ASGI middleware: requests by method, route and status, and their latency, into the app's Metrics."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0, status = time.perf_counter(), [500]

        async def seen(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, seen)
        finally:
            m = scope["app"].state.svc.metrics
            endpoint = getattr(scope.get("route"), "path", "unmatched")
            m.requests.labels(scope["method"], endpoint, str(status[0])).inc()
            m.latency.labels(scope["method"], endpoint).observe(time.perf_counter() - t0)


def create_app(settings: Settings | None = None) -> FastAPI:
    """The FastAPI app of `sp-plan serve`."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        svc = Service(settings)
        app.state.svc = svc
        await svc.warm()
        if settings.freeze_gc:
            freeze_heap()
        try:
            yield
        finally:
            svc.close()

    app = FastAPI(title="sp-plan", summary="sequence-parallel layouts for long-context Transformers, as a service",
                  lifespan=lifespan)
    app.state.settings = settings
    app.add_middleware(BodyLimit, max_bytes=settings.max_body, on_error=error_response)

    app.add_middleware(Counted)

    @app.exception_handler(PlanError)
    async def plan_error(request: Request, e: PlanError):
        return error_response(e)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, e: Exception):  # a bug, not bad input: still a JSON body, and logged
        import logging  # noqa: PLC0415

        logging.getLogger("sp_plan.service").exception("unexpected error in %s %s", request.method, request.url.path)
        return error_response(PlanError("server", f"unexpected {type(e).__name__}", "report it with the request body"),
                              500)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError):
        return error_response(_validation_error(e), 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):  # e.g. a body that is not UTF-8: 400
        if e.status_code == 404:
            problem, fix = f"no route {request.method} {request.url.path}", "see /docs for the endpoints"
        elif e.status_code == 405:
            problem, fix = f"{request.method} is not allowed on {request.url.path}", "see /docs for the methods"
        else:
            problem, fix = str(e.detail), "send a UTF-8 JSON body (Content-Type: application/json)"
        return error_response(PlanError("request", problem, fix), e.status_code)

    def svc_of(request: Request) -> Service:
        return request.app.state.svc

    async def reader(request: Request) -> Service:
        svc = svc_of(request)
        if svc.settings.private:
            auth.check(request.headers.get("authorization"), svc.tokens)
        return svc

    async def writer(request: Request) -> Service:
        svc = svc_of(request)
        auth.check(request.headers.get("authorization"), svc.tokens)
        return svc

    # ---- planning
    @app.post("/v1/plan", response_model=PlanResponse, tags=["plan"])
    async def plan(req: PlanRequest, svc: Service = Depends(reader)):
        """Ranked plans with breakdowns, the winner as a plan file, and the profile used."""
        raw = hashlib.sha256(req.model_dump_json().encode()).hexdigest()
        fp = svc.fingerprints.get(raw)
        if fp is not None:  # asked before: one indexed query for the profile's stamp, no cluster built
            body = svc.answers.get((raw, await svc.stamp(req, fp)))
            if body is not None:
                svc.metrics.cache.labels("memory").inc()
                return Response(body, media_type=JSON)

        async def answer():  # ((body, profile stamp), how): build and resolve, then a kept answer or the search
            svc.check_sources(req.cluster, req.model)
            cluster = await asyncio.to_thread(build_cluster, req, svc.settings.max_world)
            fp = cluster.topology_fingerprint()
            stamp = await svc.stamp(req, fp)  # read before the profile: a stamp never names a newer profile than used
            prof = await svc.db(svc.stored_profile, req.profile)
            inputs = await svc.db(resolve, req, svc.store, svc.settings.max_world, prof, cluster)
            key = request_key(req, inputs)

            async def compute():  # the whole answer (with families) is stored and cached, both encodings made once
                doc = await svc.db(svc.store.service_plan, key)
                if doc is not None:
                    return encoded(doc["response"]), "store"
                res = await svc.run_search(req.model_copy(update={"families": True}), inputs, svc.store.url,
                                           f"sp-plan-{key}")
                res.id = key
                doc = {"response": res.model_dump(mode="json"), "request": req.model_dump(mode="json")}
                await svc.db(svc.store.save_service_plan, key, doc, res.profile)  # acknowledged only once stored
                return encoded(doc["response"]), "computed"

            both, how = await svc.cache.get(key, compute)
            svc.fingerprints.put(raw, fp)
            svc.answers.put((raw, stamp), both[req.families])
            return (both[req.families], stamp), how

        # identical requests in flight are built and resolved once (not 8 clusters built at once, each slowing the
        # one whose search the others wait for); one that waited checks the profile stamp, as a cached hit does
        (body, stamp), how = await svc.requests.get(raw, answer)
        if how == "coalesced":
            fp = svc.fingerprints.get(raw)
            if fp is None or stamp != await svc.stamp(req, fp):  # a profile changed while it waited
                (body, stamp), how = await answer()
        svc.metrics.cache.labels(how).inc()
        return Response(body, media_type=JSON)

    @app.post("/v1/estimate", response_model=EstimateResponse, tags=["plan"])
    async def estimate(req: EstimateRequest, svc: Service = Depends(reader)):
        """One plan priced on a cluster: step time, MFU, memory and the per-phase breakdown."""
        svc.check_sources(req.cluster, req.model)
        prof = await svc.db(svc.stored_profile, req.profile)
        res = await svc.db(run_estimate, req, svc.store, svc.settings.max_world, prof)
        return Response(res.model_dump_json(), media_type=JSON)

    @app.get("/v1/plans/{id}", response_model=PlanResponse, tags=["plan"])
    async def get_plan(id: str, families: bool = False, svc: Service = Depends(reader)):
        """A plan response the service computed (kept in the store); ``?families=true`` as in POST /v1/plan."""
        doc = await svc.db(svc.store.service_plan, id)
        if doc is None:
            raise NotFound("id", f"no plan {id!r}", "use the id a POST /v1/plan answered")
        return Response(encoded(doc["response"])[families], media_type=JSON)

    @app.get("/v1/plans/{id}/report", response_class=HTMLResponse, tags=["plan"])
    async def report(id: str, svc: Service = Depends(reader)):
        """The HTML report of a computed plan (what `sp-plan plan --report` writes), rendered in the process pool."""
        doc = await svc.db(svc.store.service_plan, id)
        if doc is None:
            raise NotFound("id", f"no plan {id!r}", "use the id a POST /v1/plan answered")
        res = PlanResponse.model_validate(doc["response"])
        prof = None
        if res.profile and res.profile != "file":
            try:
                prof = await svc.db(svc.store.get_profile, res.profile)
            except PlanError as e:
                if e.field != "profile":
                    raise  # a profile deleted since: the report without its measured candidates
        loop = asyncio.get_running_loop()
        try:
            page = await loop.run_in_executor(svc.pool, _report_job, PlanRequest.model_validate(doc["request"]), res, prof)
        except BrokenProcessPool:
            svc.pool = svc._pool()
            raise Unavailable("report", "the report process died", "retry") from None
        return HTMLResponse(page)

    # ---- presets and the store
    @app.get("/v1/presets", tags=["store"])
    async def presets(svc: Service = Depends(reader)):
        """The cluster presets (names) and model presets (their specs)."""
        from sp_plan.profiles import cluster_presets, load_model, model_presets  # noqa: PLC0415

        return {"clusters": cluster_presets(), "models": {n: load_model(n).model_dump(mode="json") for n in model_presets()}}

    @app.get("/v1/clusters", tags=["store"])
    async def clusters(svc: Service = Depends(reader)):
        """The clusters the store holds profiles for: name, topology fingerprint, profile count, newest profile."""
        seen: dict[tuple, dict] = {}
        for p in await svc.db(svc.store.list_profiles):  # newest first
            row = seen.setdefault((p.cluster, p.cluster_fingerprint), {
                "cluster": p.cluster, "fingerprint": p.cluster_fingerprint, "profiles": 0, "latest_profile": p.id,
                "latest_created_at": p.created_at})
            row["profiles"] += 1
        return list(seen.values())

    @app.get("/v1/profiles", response_model=list[Profile], tags=["store"])
    async def profiles(fingerprint: str | None = None, svc: Service = Depends(reader)):
        """The stored profiles, newest first (optionally of one topology fingerprint)."""
        docs = [p.model_dump(mode="json") for p in await svc.db(svc.store.list_profiles, fingerprint)]
        return Response(json.dumps(docs), media_type=JSON)

    @app.get("/v1/profiles/{id}", response_model=Profile, tags=["store"])
    async def profile(id: str, svc: Service = Depends(reader)):
        """One stored profile (its id or a unique prefix of 4+ characters)."""
        return Response((await svc.db(svc.stored_profile, id)).model_dump_json(), media_type=JSON)

    @app.post("/v1/profiles", status_code=201, tags=["store"])
    async def upload(p: Profile, svc: Service = Depends(writer)):
        """Store a profile (token needed); its id is kept unless another profile holds it. Answers its id."""
        def save() -> str:
            if p.id and svc.store.has_profile(p.id) and svc.store.get_profile(p.id) != p:
                p.id = None  # that id holds a different profile: keep both
            return svc.store.save_profile(p)

        pid = await svc.db(save)
        return JSONResponse({"id": pid, "cluster": p.cluster, "fingerprint": p.cluster_fingerprint}, status_code=201)

    @app.delete("/v1/profiles/{id}", tags=["store"])
    async def delete(id: str, svc: Service = Depends(writer)):
        """Remove a stored profile (token needed)."""
        try:
            await svc.db(svc.store.delete_profile, id)
        except PlanError as e:
            if e.field == "profile":
                raise NotFound(e.field, e.problem, "see the stored ids at GET /v1/profiles") from None
            raise
        return {"deleted": id}

    # ---- operations
    @app.get("/healthz", tags=["ops"])
    async def healthz(request: Request):
        """200 when the store answers with the schema this sp-plan writes, else 503."""
        svc = svc_of(request)
        ok = await asyncio.to_thread(svc.store.healthy)
        if not ok:
            svc.metrics.store_errors.inc()
        return JSONResponse({"status": "ok" if ok else "store unavailable", "store": svc.store.shown},
                            status_code=200 if ok else 503)

    @app.get("/metrics", tags=["ops"])
    async def metrics(request: Request):
        """Prometheus metrics: requests, latency by endpoint, search time, cache results, store errors."""
        return Response(svc_of(request).metrics.render(), media_type="text/plain; version=0.0.4")

    return app


def app_from_env() -> FastAPI:
    """uvicorn's factory (``--workers N``): the settings from ``$SP_PLAN_SERVE_SETTINGS``."""
    return create_app(Settings(**json.loads(os.environ.get(SETTINGS_ENV, "{}"))))


def settings_env(settings: Settings) -> str:
    return json.dumps(asdict(settings))
