"""POST /v1/profiles and the lookups beside it on the real service (uvicorn in a subprocess), on SQLite and on a real
PostgreSQL server: what the store cannot keep is a 4xx naming the field, on both backends alike, never a 503 counted
as a store error."""
from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from pgserver import postgres_url  # noqa: F401 - fixture
from sp_plan.planner.profile import Profile

from test_serve import TOKEN, Server, _metric, module_server

FIXTURE = Path(__file__).parent / "fixtures" / "profile-dgx-h100.yaml"
#: shares the throwaway PostgreSQL server's xdist worker with tests/test_store.py and tests/test_serve.py
pytestmark = [pytest.mark.xdist_group("postgres"), pytest.mark.multiprocess]
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(request, tmp_path_factory):
    yield from module_server(tmp_path_factory, f"upload-{request.param}", request)


def doc(**changes) -> dict:
    """The fixture profile as an upload body, with ``changes`` (dotted keys reach into params)."""
    d = Profile.load(FIXTURE).model_dump(mode="json")
    d.pop("id", None)
    for key, value in changes.items():
        *path, last = key.split(".")
        at = d
        for k in path:
            at = at[k]
        at[last] = value
    return d


def upload(srv: Server, body: dict) -> httpx.Response:
    return httpx.post(f"{srv.url}/v1/profiles", json=body, headers=AUTH, timeout=60)


def assert_refused(r: httpx.Response, field: str, status: int = 422) -> dict:
    """``r`` is ``status`` with the JSON error naming ``field`` and a fix; returns the error."""
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["field"] == field and err["fix"], err
    return err


@pytest.mark.parametrize("key, value", [("id", "i" * 65), ("cluster_fingerprint", "f" * 65), ("cluster", "c" * 201),
                                        ("id", "a\x00b"), ("cluster", "dgx\x00h100")])
def test_what_the_store_cannot_keep_is_422_not_503(server, key, value):
    before = _metric(server, "sp_plan_store_errors_total")
    assert_refused(upload(server, doc(**{key: value})), f"profile.{key}")
    assert _metric(server, "sp_plan_store_errors_total") == before


def test_lookups_by_what_cannot_be_stored_find_nothing(server):
    before = _metric(server, "sp_plan_store_errors_total")
    for path in ("/v1/profiles/%00abc", "/v1/profiles/" + "i" * 65, "/v1/plans/%00"):
        assert httpx.get(server.url + path).status_code == 404, path
    assert httpx.delete(server.url + "/v1/profiles/%00abc", headers=AUTH).status_code == 404
    assert httpx.get(server.url + "/v1/profiles", params={"fingerprint": "\x00"}).json() == []
    body = {"cluster": "dgx-h100", "nodes": 2, "model": "llama3-8b", "workload": {"seq_len": "64k"}, "profile": "x\x00y"}
    assert_refused(httpx.post(server.url + "/v1/plan", json=body, timeout=120), "profile", 404)
    assert _metric(server, "sp_plan_store_errors_total") == before


@pytest.mark.parametrize("key, value, field", [
    ("params.attention_fwd", {"points": [[4096, 2.0]]}, "profile.params.attention_fwd"),
    ("params.matmul", {"points": [[4096, 1e30]]}, "profile.params.matmul"),
    ("params.comm", {"all_to_all/inter": {"alpha_s": 0, "efficiency": 50}}, "profile.params.comm.all_to_all/inter"),
    ("params.hbm_bandwidth", 1e30, "profile.params.hbm_bandwidth"),
    ("params.hbm_bandwidth", 4e12, "profile.params.hbm_bandwidth"),  # the H100's datasheet: 3.35e12
])
def test_impossible_figures_are_refused_on_upload_and_plans_go_on(server, key, value, field):
    """The fixture is a dgx-h100x2 profile: figures above the H100's datasheet are refused at upload, naming the
    field, so the topology's plans keep working (a stored one would fail each of them)."""
    err = assert_refused(upload(server, doc(**{key: value})), field)
    assert "sp-plan" in err["fix"]
    body = {"cluster": "dgx-h100", "nodes": 2, "model": "llama3-8b", "workload": {"seq_len": "32k"}}
    assert httpx.post(server.url + "/v1/plan", json=body, timeout=120).status_code == 200


def test_a_future_created_at_is_refused_and_pins_nothing(server):
    assert_refused(upload(server, doc(created_at="9999-01-01T00:00:00+00:00")), "profile.created_at")
    fp = doc()["cluster_fingerprint"]
    assert all(p["created_at"] < "9999" for p in httpx.get(server.url + "/v1/profiles", params={"fingerprint": fp}).json())


@pytest.mark.parametrize("key, value", [("id", "a/b"), ("id", "../../x"), ("id", "x.yaml"), ("id", "i" * 10_000),
                                        ("cluster_fingerprint", ""), ("cluster_fingerprint", "f" * 10_000)])
def test_an_upload_no_endpoint_could_address_is_refused(server, key, value):
    assert_refused(upload(server, doc(**{key: value})), f"profile.{key}")


def test_an_uploaded_id_is_addressed_by_every_endpoint(server):
    r = upload(server, doc(id="tune-2026.11_h100"))
    assert r.status_code == 201 and r.json()["id"] == "tune-2026.11_h100", r.text
    assert httpx.get(server.url + "/v1/profiles/tune-2026.11_h100").json()["id"] == "tune-2026.11_h100"
    assert httpx.delete(server.url + "/v1/profiles/tune-2026.11_h100", headers=AUTH).status_code == 200
