"""Fuzzing the service's request bodies: every generated or damaged body to /v1/plan, /v1/estimate and
/v1/profiles is answered with 2xx or a 4xx whose JSON names the field and the fix, never a 5xx or a crash.

The app runs in-process (Starlette's TestClient, the real FastAPI app with its process pool and a SQLite store);
tests/test_serve.py covers the same app as a real uvicorn server."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import example, given
from hypothesis import strategies as st

from fuzzing import budget, mutated, text_mutated
from sp_plan.planner.profile import Profile
from sp_plan.profiles import load_model
from sp_plan.service.app import Settings, create_app

TOKEN = "fuzz-token"
#: one pytest-xdist worker for the module: its app (and the app's search process) starts once
pytestmark = pytest.mark.xdist_group("fuzz_service")
PROFILE = Path(__file__).parent / "fixtures" / "profile-dgx-h100.yaml"
PLAN_BODY = {"cluster": "cpu-local", "nodes": 1, "model": load_model("tiny-gpt").model_dump(mode="json"),
             "workload": {"seq_len": 512, "batch": 1, "causal": True}, "top": 2}


def app_client(tmp_path_factory, name: str):
    """The real app in-process (TestClient) on a SQLite store of its own, TOKEN its one token."""
    tmp = tmp_path_factory.mktemp(name)
    (tmp / "tokens").write_text(TOKEN + "\n")
    app = create_app(Settings(store=f"sqlite:///{tmp}/store.db", token_file=str(tmp / "tokens"), processes=1,
                              max_body=200_000))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    yield from app_client(tmp_path_factory, "fuzz-service")


@pytest.fixture(scope="module")
def estimate_body(client):
    r = client.post("/v1/plan", json=PLAN_BODY)
    assert r.status_code == 200, r.text
    return {"plan": r.json()["winner"], "cluster": "cpu-local", "nodes": 1}


def answered(r) -> None:
    """2xx, or a 4xx with the project's JSON error (field, problem, fix); never a server error."""
    assert r.status_code < 500, (r.status_code, r.text[:500])
    if r.status_code >= 400:
        err = r.json()["error"]
        assert err["field"] and err["problem"] and err["fix"], err


def post(client, path: str, body, raw: bytes | None = None, token: bool = False):
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {TOKEN}"} if token else {})
    data = raw if raw is not None else json.dumps(body, allow_nan=True).encode()
    return client.post(path, content=data, headers=headers)


@budget(0.5)
@given(st.data())
@example(data=None)
def test_mutated_plan_bodies_are_answered_or_refused_with_the_field(client, data):
    body = PLAN_BODY if data is None else data.draw(mutated(PLAN_BODY))
    answered(post(client, "/v1/plan", body))


@budget(0.5)
@given(st.data())
def test_mutated_estimate_bodies_are_answered_or_refused_with_the_field(client, estimate_body, data):
    answered(post(client, "/v1/estimate", data.draw(mutated(estimate_body))))


@budget(0.5)
@given(st.data())
def test_mutated_profile_uploads_are_stored_or_refused_with_the_field(client, data):
    doc = json.loads(Profile.load(PROFILE).model_dump_json())
    answered(post(client, "/v1/profiles", data.draw(mutated(doc)), token=True))


@budget(0.5)
@given(st.sampled_from(["/v1/plan", "/v1/estimate", "/v1/profiles"]), st.data())
def test_damaged_bodies_are_refused_with_the_field(client, path, data):
    raw = data.draw(text_mutated(json.dumps(PLAN_BODY)))
    answered(post(client, path, None, raw=raw, token=True))
