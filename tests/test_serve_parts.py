"""`sp-plan serve` under load: uvicorn with its C parts (uvloop, httptools), the startup heap frozen (gc.freeze) so no
full collection stalls the cached answers in flight, and identical new requests resolved once
(benchmarks/bench_serve.py measures them)."""
from __future__ import annotations

import gc
import re
from concurrent.futures import ThreadPoolExecutor

import uvicorn
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from sp_plan.cli.app import app
from sp_plan.service.app import Settings, create_app


def test_serve_runs_uvicorn_with_uvloop_httptools_and_a_frozen_heap(tmp_path, monkeypatch):
    ran = {}
    monkeypatch.setattr(uvicorn, "run", lambda target, **kw: ran.update(target=target, **kw))
    r = CliRunner().invoke(app, ["serve", "--store", f"sqlite:///{tmp_path}/s.db", "--port", "8123"])
    assert r.exit_code == 0, r.output
    assert "uvloop + httptools" in r.stderr  # the test extra installs uvicorn[standard], as the service extra does
    assert ran["loop"] == ran["http"] == "auto" and ran["target"].state.settings.freeze_gc is True


def test_freeze_gc_freezes_the_heap_after_startup_and_only_when_asked(tmp_path):
    gc.unfreeze()
    try:
        with TestClient(create_app(Settings(store=f"sqlite:///{tmp_path}/a.db", processes=1))) as c:
            assert c.get("/healthz").status_code == 200 and gc.get_freeze_count() == 0
        with TestClient(create_app(Settings(store=f"sqlite:///{tmp_path}/b.db", processes=1, freeze_gc=True))) as c:
            assert c.get("/healthz").status_code == 200 and gc.get_freeze_count() > 10_000
    finally:
        gc.unfreeze()


def test_identical_requests_in_flight_build_and_resolve_once(tmp_path, monkeypatch):
    """Eight identical new requests at once: one cluster built and one search; seven answers joined it."""
    import sp_plan.service.routers.plans as plans

    built = []
    real = plans.build_cluster
    monkeypatch.setattr(plans, "build_cluster", lambda *a: built.append(1) or real(*a))
    body = {"cluster": "dgx-h100", "nodes": 4, "model": "llama3-8b", "workload": {"seq_len": "96k"}, "top": 2}
    with TestClient(create_app(Settings(store=f"sqlite:///{tmp_path}/s.db", processes=1))) as c:
        with ThreadPoolExecutor(8) as ex:
            rs = list(ex.map(lambda _: c.post("/v1/plan", json=body), range(8)))
        assert all(r.status_code == 200 for r in rs) and len({r.content for r in rs}) == 1
        assert len(built) == 1
        metrics = c.get("/metrics").text
    count = {k: float(v) for k, v in re.findall(r'sp_plan_plan_cache_total\{result="(\w+)"\} (\S+)', metrics)}
    assert count["computed"] == 1 and count.get("coalesced", 0) + count.get("memory", 0) == 7  # late ones: memory
