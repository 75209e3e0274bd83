"""`sp-plan serve` as deployed: uvicorn with its C parts (uvloop, httptools) and the startup heap frozen (gc.freeze),
so no full collection stalls the cached answers in flight (benchmarks/bench_serve.py measures them)."""
from __future__ import annotations

import gc

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
