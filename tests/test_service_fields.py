"""A refused request names the place in the body the user sent: the dotted path from the body's top level
(``plan.degrees.ring``, ``workload.seq_len``, ``workload.documents.0``), whether pydantic or the planner refused it,
so that a client can point at the key to fix, and never a key the user did not write (a model's internal name, a
union's tag, the form a value is converted to).

The app runs in-process (Starlette's TestClient, the real FastAPI app with its process pool and a SQLite store)."""
from __future__ import annotations

import json

import pytest
from test_fuzz_service import TOKEN, app_client

from sp_plan.service.errors import located

#: one pytest-xdist worker for the module: its app (and the app's search process) starts once
pytestmark = [pytest.mark.xdist_group("service_fields"), pytest.mark.multiprocess]
BODY = {"cluster": "dgx-h100", "nodes": 1, "model": "tiny-gpt", "workload": {"seq_len": "4k"}}
#: an estimate of a plan written by hand (no search needed): ring attention over the node's 8 GPUs
ESTIMATE = {"cluster": "dgx-h100", "nodes": 1, "model": "tiny-gpt", "use_profile": False,
            "workload": {"seq_len": "4k"}, "plan": {"algorithm": "ring", "degrees": {"ring": 8}}}
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    yield from app_client(tmp_path_factory, "service-fields")


def refused(r, field: str, status: int = 422) -> dict:
    """The JSON error of a refused request: its status and field as expected, a problem and a fix given, and the
    CLI's one line starting with the same field."""
    assert r.status_code == status, (r.status_code, r.text[:500])
    body = r.json()
    err = body["error"]
    assert err["field"] == field and err["problem"] and err["fix"], err
    assert body["detail"].startswith(f"{field}: "), body["detail"]
    return err


def posted(client, path: str, body, headers: dict | None = None):
    """POST ``body`` as JSON (with the JSON Content-Type unless ``headers`` are given)."""
    return client.post(path, content=json.dumps(body).encode(), headers=JSON if headers is None else headers)


def estimate(plan: dict | None = None, workload: dict | None = None) -> dict:
    """The estimate body with its plan's fields, or its workload, replaced (None: a key left out)."""
    body = {**ESTIMATE, "plan": {**ESTIMATE["plan"], **(plan or {})}}
    if workload is not None:
        body["workload"] = workload
    return {k: v for k, v in body.items() if v is not None}


@pytest.mark.parametrize("plan, field", [
    ({"degrees": {"ring": 3}}, "plan.degrees"),
    ({"stage_layers": [1, 2, 3]}, "plan.stage_layers"),
    ({"order": ["ulysses"]}, "plan.order"),
    ({"order": ["x"]}, "plan.order"),
    ({"kv_chunks": 0}, "plan.kv_chunks"),
    ({"virtual_stages": 7}, "plan.virtual_stages"),
    ({"token_layout": "zzz"}, "plan.token_layout"),
    ({"placement": "zzz"}, "plan.placement"),
    ({"groups": {"ring": [[0, 9]]}}, "plan.groups.ring"),
    ({"cluster_fingerprint": "nope"}, "plan.cluster_fingerprint"),
    ({"degrees": {"ring": "x"}}, "plan.degrees.ring"),
])
def test_an_estimates_inline_plan_is_refused_naming_the_plans_field(client, plan, field):
    """The plan is one object of the estimate's body: a mistake in it is named inside ``plan``, as pydantic names
    its own refusals there, and never as a top-level key the request does not have."""
    refused(posted(client, "/v1/estimate", estimate(plan)), field)


@pytest.mark.parametrize("seq_len", ["1k1", 0])
@pytest.mark.parametrize("path", ["/v1/plan", "/v1/estimate"])
def test_a_bad_seq_len_is_named_inside_the_workload(client, path, seq_len):
    """seq_len is sent inside ``workload``: the error says ``workload.seq_len``, where the user finds it."""
    body = {**BODY, "workload": {"seq_len": seq_len}} if path == "/v1/plan" else estimate(workload={"seq_len": seq_len})
    refused(posted(client, path, body), "workload.seq_len")


def test_a_seq_len_the_plans_degrees_do_not_divide_is_named_in_the_workload_sent(client):
    refused(posted(client, "/v1/estimate", estimate(workload={"seq_len": 4097})), "workload.seq_len")
    # the request's own workload is the one priced, so it is named even where the plan carries a workload too
    both = estimate({"workload": {"seq_len": 4096}}, workload={"seq_len": 4097})
    refused(posted(client, "/v1/estimate", both), "workload.seq_len")


@pytest.mark.parametrize("path", ["/v1/plan", "/v1/estimate"])
@pytest.mark.parametrize("documents, field", [
    ([None], "workload.documents.0"),
    ([1.5], "workload.documents.0"),
    ([4096, "x"], "workload.documents.1"),
    ([], "workload.documents"),
    ({"kind": "histogram", "edges": [0, 100], "weights": ["x"]}, "workload.documents.weights.0"),
    ({"kind": "histogram", "edges": [0, 100], "weights": [-1]}, "workload.documents.weights"),
    ({"kind": "lognormal", "mean": "x", "sigma": 1, "min": 1, "max": 10}, "workload.documents.mean"),
    ({"kind": "lengths", "lengths": [None]}, "workload.documents.lengths.0"),
    ({"kind": "lengths", "lengths": []}, "workload.documents.lengths"),
    ({"kind": "nope"}, "workload.documents"),
])
def test_documents_are_named_as_sent_without_the_unions_tags(client, path, documents, field):
    """A list of lengths is named by its index in that list, a histogram or lognormal by its keys; the tag pydantic
    gives each kind of documents (lengths, histogram, lognormal) is not a key of the body and is left out."""
    workload = {"seq_len": "4k", "documents": documents}
    body = {**BODY, "workload": workload} if path == "/v1/plan" else estimate(workload=workload)
    refused(posted(client, path, body), field)


@pytest.mark.parametrize("pattern", ["5:", False])
def test_a_bad_window_pattern_beside_an_integer_window_is_named_window_pattern(client, pattern):
    """``window: 512`` with ``window_pattern`` is the CLI's spelling: the error names the key sent, not the
    ``window.pattern`` it is turned into."""
    body = {**BODY, "workload": {"seq_len": "4k", "window": 512, "window_pattern": pattern}}
    refused(posted(client, "/v1/plan", body), "workload.window_pattern")
    refused(posted(client, "/v1/estimate", estimate(workload=body["workload"])), "workload.window_pattern")


def test_a_bad_pattern_inside_a_window_object_keeps_its_path(client):
    body = {**BODY, "workload": {"seq_len": "4k", "window": {"size": 512, "pattern": "5:"}}}
    refused(posted(client, "/v1/plan", body), "workload.window.pattern")


@pytest.mark.parametrize("path", ["/v1/plan", "/v1/estimate", "/v1/profiles"])
@pytest.mark.parametrize("headers", [{}, {"Content-Type": "text/plain"}, {"Content-Type": "application/x-www-form-urlencoded"}])
def test_a_json_body_sent_without_the_json_content_type_is_told_to_send_it(client, path, headers):
    """A valid JSON body sent as text (curl -d without -H, a client's default) reads as no object at all: the fix
    says which header is missing instead of sending the user back to the schema."""
    auth = {"Authorization": f"Bearer {TOKEN}"} if path == "/v1/profiles" else {}
    err = refused(posted(client, path, BODY, {**headers, **auth}), "body")
    assert "Content-Type: application/json" in err["fix"], err


def test_a_json_body_that_is_no_object_is_sent_to_the_schema_not_the_header(client):
    err = refused(posted(client, "/v1/plan", [BODY]), "body")
    assert "Content-Type" not in err["fix"] and "/openapi.json" in err["fix"], err


def test_fields_that_are_no_place_in_the_body_are_kept():
    """The body, the request, the token and the server are not keys of a body, even of one holding such a key."""
    body = {"body": 1, "token": 2, "server": 3, "request": 4, "workload": {"seq_len": 0}}
    for field in ("body", "token", "server", "request", "Authorization"):
        assert located(field, body) == field
    assert located("seq_len", body) == "workload.seq_len"
    assert located("seq_len", None) == "seq_len"  # no JSON body: nothing to look in
    assert located("workload.documents[0]", body) == "workload.documents[0]"  # not a key the body holds: as raised


def test_a_plan_field_the_estimate_did_not_send_is_named_inside_its_plan():
    """A plan's own field (its order, derived where it is left out) is about the plan even when the body does not
    hold it; a field the request has at its top level too (model, workload) is the request's."""
    body = {"cluster": "dgx-h100", "plan": {"algorithm": "ring", "degrees": {"ring": 8}}}
    assert located("order", body) == "plan.order"
    assert located("degrees.ring", body) == "plan.degrees.ring"
    assert located("model", body) == "model"
