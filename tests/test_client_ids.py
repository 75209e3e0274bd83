"""The client's ids in URLs: every id is one percent-encoded path segment, an id that would address another resource
is refused before any request, and a redirect is an error, never a success (a recording transport, then the real
service: a delete with a crafted id removes nothing)."""
from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from sp_plan.client import Client
from sp_plan.planner.errors import PlanError
from sp_plan.planner.profile import Profile

from test_serve import TOKEN, module_server

FIXTURE = Path(__file__).parent / "fixtures" / "profile-dgx-h100.yaml"
BAD_IDS = ["", "nope/../victim01", "../victim01", "..", "vict?x", "vict#x", "a\\b", "a\x00b", "a\nb", "a\tb"]


def recording(status: int = 200, headers: dict | None = None, body: object = None) -> tuple[Client, list]:
    """A client whose requests are recorded and answered ``status`` (no network)."""
    sent: list[httpx.Request] = []

    def answer(req: httpx.Request) -> httpx.Response:
        sent.append(req)
        return httpx.Response(status, headers=headers, json=body if body is not None else {"deleted": "x"})

    c = Client("http://planner.test:8000")
    c._http = httpx.Client(base_url=c.url, transport=httpx.MockTransport(answer))
    return c, sent


@pytest.mark.parametrize("id", BAD_IDS)
@pytest.mark.parametrize("call", ["profile", "delete_profile", "get_plan"])
def test_an_id_that_addresses_another_resource_is_refused_before_any_request(call, id):
    c, sent = recording()
    with pytest.raises(PlanError) as e:
        getattr(c, call)(id)
    assert e.value.field == ("plan" if call == "get_plan" else "profile"), e.value
    assert repr(id) in e.value.problem and e.value.fix
    assert sent == []


@pytest.mark.parametrize("id, path", [("abc%def", "/v1/profiles/abc%25def"), ("a b+c", "/v1/profiles/a%20b%2Bc"),
                                      ("x.y-z_1", "/v1/profiles/x.y-z_1")])
def test_an_id_is_one_percent_encoded_segment(id, path):
    c, sent = recording()
    c.delete_profile(id)
    assert [r.url.raw_path.decode() for r in sent] == [path]
    assert sent[0].url.query == b""


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_is_an_error_not_a_success(status):
    c, sent = recording(status, headers={"location": "/v1/profiles/other"})
    with pytest.raises(PlanError) as e:
        c.delete_profile("abcd1234")
    assert e.value.field == "server" and str(status) in e.value.problem and "/v1/profiles/other" in e.value.problem
    assert len(sent) == 1  # not followed


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "client-ids")


@pytest.mark.multiprocess  # the module's server
def test_crafted_ids_delete_nothing_on_the_real_service(server):
    victim = Profile.load(FIXTURE).model_copy(update={"id": "victim01"})
    with Client(server.url, token=TOKEN) as c:
        assert c.upload_profile(victim) == "victim01"
        for id in BAD_IDS:
            with pytest.raises(PlanError):
                c.delete_profile(id)
        with pytest.raises(PlanError, match="no profile 'nope%2Fvictim01'"):  # sent as '%252F': an unknown id
            c.delete_profile("nope%2Fvictim01")
        assert c.profile("victim01") == victim
        c.delete_profile("vict")  # a unique prefix still works
        with pytest.raises(PlanError, match="no profile 'victim01'"):
            c.profile("victim01")
