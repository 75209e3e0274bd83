"""What the service client sends and how it reads the answer, through a Client built as callers build it and a mock
transport (no server): an error answer is the service's PlanError, a redirect is an error naming it, and the
families and fingerprint options reach the request's query."""
from __future__ import annotations

import httpx
import pytest

from sp_plan.client import Client
from sp_plan.pipeline import run_plan
from sp_plan.planner.errors import PlanError
from sp_plan.planner.profile import Profile

URL = "http://planner.test:8000"
PLAN = {"cluster": "cpu-local", "model": "tiny-gpt", "workload": {"seq_len": "4k"}, "use_profile": False, "top": 1}
ERROR = {"field": "workload.seq_len", "problem": "'4q' is not a length", "fix": "give a length such as 4k"}
PROFILES = [Profile(id=pid, cluster="test", cluster_fingerprint=fp).model_dump(mode="json")
            for pid, fp in (("pa", "a" * 16), ("pb", "b" * 16))]


def client_of(monkeypatch, answer) -> tuple[Client, list[httpx.Request]]:
    """A Client as its constructor builds it, each request recorded and answered by ``answer`` (no network)."""
    sent: list[httpx.Request] = []

    def record(req: httpx.Request) -> httpx.Response:
        sent.append(req)
        return answer(req)

    real = httpx.Client
    with monkeypatch.context() as m:  # only the Client's own httpx client gets the mock transport
        m.setattr(httpx, "Client", lambda *a, **kw: real(*a, transport=httpx.MockTransport(record), **kw))
        c = Client(URL)
    return c, sent


@pytest.fixture(scope="module")
def stored_answer() -> dict:
    """A plan answer as the service keeps it, with the families."""
    return run_plan({**PLAN, "families": True}).model_dump(mode="json")


@pytest.mark.parametrize("status", [400, 422])
def test_an_error_answer_is_the_services_plan_error(monkeypatch, status):
    """A 4xx answer with the service's error body raises its field, problem and fix."""
    c, sent = client_of(monkeypatch, lambda req: httpx.Response(status, json={"error": ERROR}))
    with pytest.raises(PlanError) as e:
        c.plan(**PLAN)
    assert (e.value.field, e.value.problem, e.value.fix) == (ERROR["field"], ERROR["problem"], ERROR["fix"])
    assert len(sent) == 1


@pytest.mark.parametrize("status", [302, 307])
def test_a_redirect_is_not_followed(monkeypatch, status):
    """A redirect answer is a PlanError naming the server and where it pointed; the client makes no second request."""
    c, sent = client_of(monkeypatch, lambda req: httpx.Response(status, headers={"location": f"{URL}/v1/profiles"})
                        if req.url.path == "/v1/plan" else httpx.Response(200, json=[]))
    with pytest.raises(PlanError) as e:
        c.plan(**PLAN)
    assert e.value.field == "server" and f"answered {status}, a redirect" in e.value.problem
    assert f"{URL}/v1/profiles" in e.value.problem
    assert [r.url.path for r in sent] == ["/v1/plan"]


def test_a_plan_is_fetched_with_its_families_only_when_asked(monkeypatch, stored_answer):
    """get_plan(id, families=True) asks for ?families=true and gets them; without it, none are asked for."""
    def answer(req: httpx.Request) -> httpx.Response:
        asked = req.url.params.get("families") == "true"
        return httpx.Response(200, json=stored_answer if asked else {**stored_answer, "families": []})

    c, sent = client_of(monkeypatch, answer)
    assert c.get_plan("k1", families=True).families
    assert sent[-1].url.path == "/v1/plans/k1" and sent[-1].url.params.get("families") == "true"
    assert c.get_plan("k1").families == [] and "families" not in sent[-1].url.params


def test_profiles_of_one_fingerprint_are_asked_for_by_it(monkeypatch):
    """profiles(fingerprint=...) sends the filter and lists only that topology's profiles; without it, all."""
    def answer(req: httpx.Request) -> httpx.Response:
        fp = req.url.params.get("fingerprint")
        return httpx.Response(200, json=[p for p in PROFILES if fp in (None, p["cluster_fingerprint"])])

    c, sent = client_of(monkeypatch, answer)
    assert [p.id for p in c.profiles(fingerprint="a" * 16)] == ["pa"]
    assert sent[-1].url.params.get("fingerprint") == "a" * 16
    assert [p.id for p in c.profiles()] == ["pa", "pb"] and "fingerprint" not in sent[-1].url.params
    assert c.profiles(fingerprint="") == [] and sent[-1].url.params.get("fingerprint") == ""  # as the store: none
