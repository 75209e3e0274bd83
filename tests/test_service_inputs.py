"""Bad input to the service, the Python API and the CLI is refused by name: a 4xx JSON body naming the field and the
fix over HTTP (never a 500 or a search that runs for days), a PlanError in Python, one line and exit 2 on the CLI.

The app runs in-process (Starlette's TestClient, the real FastAPI app with its process pool and a SQLite store)."""
from __future__ import annotations

import json
import os

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from sp_plan.cli.app import app as cli
from sp_plan.pipeline import MAX_SEED, MAX_TRIALS, PlanRequest
from sp_plan.planner.errors import NotFound, PlanError
from sp_plan.profiles import load_cluster, load_model
from sp_plan.service.app import Settings, create_app

#: one pytest-xdist worker for the module: its app (and the app's search process) starts once
pytestmark = [pytest.mark.xdist_group("service_inputs"), pytest.mark.multiprocess]
BODY = {"cluster": "dgx-h100", "nodes": 1, "model": "tiny-gpt", "workload": {"seq_len": "4k"}}
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("service-inputs")
    app = create_app(Settings(store=f"sqlite:///{tmp}/store.db", processes=1, max_body=200_000))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def refused(r, field: str, status: int = 422) -> dict:
    """The JSON error of a refused request: its status and field as expected, a problem and a fix given."""
    assert r.status_code == status, (r.status_code, r.text[:500])
    err = r.json()["error"]
    assert err["field"] == field and err["problem"] and err["fix"], err
    return err


def posted(client, path: str, body: dict):
    """POST ``body`` as JSON (lone surrogates written as their \\u escapes, as any JSON client may send them)."""
    return client.post(path, content=json.dumps(body).encode(), headers=JSON)


@pytest.mark.parametrize("extra, field", [
    ({"trials": MAX_TRIALS + 1}, "trials"), ({"trials": 10**9}, "trials"), ({"trials": 0}, "trials"),
    ({"seed": -1}, "seed"), ({"seed": MAX_SEED + 1}, "seed"), ({"seed": 2**70}, "seed")])
def test_bayes_trials_and_seed_out_of_range_are_refused_by_name(client, extra, field):
    err = refused(posted(client, "/v1/plan", {**BODY, "search": "bayes", **extra}), field)
    assert f"{MAX_TRIALS if field == 'trials' else MAX_SEED:,}" in err["fix"]
    with pytest.raises(PlanError) as e:
        PlanRequest(**BODY, search="bayes", **extra)
    assert e.value.field == field


def test_the_largest_trials_and_seed_are_accepted_and_published():
    req = PlanRequest(**BODY, search="bayes", trials=MAX_TRIALS, seed=MAX_SEED)
    assert (req.trials, req.seed) == (MAX_TRIALS, MAX_SEED)
    props = PlanRequest.model_json_schema()["properties"]
    assert props["trials"]["maximum"] == MAX_TRIALS and props["seed"]["maximum"] == MAX_SEED


@pytest.mark.parametrize("flag, value", [("--trials", MAX_TRIALS + 1), ("--seed", MAX_SEED + 1)])
def test_the_cli_refuses_trials_and_seed_out_of_range_in_one_line(flag, value):
    r = CliRunner().invoke(cli, ["plan", "--cluster", "dgx-h100", "--model", "tiny-gpt", "--seq-len", "4k",
                                 "--search", "bayes", "--no-profile", flag, str(value)])
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {flag}: must be from"), r.stderr


WIDE = {"kind": "lognormal", "mean": 1000, "sigma": 1e200, "min": 1, "max": 4096}
HUGE_WEIGHTS = {"kind": "histogram", "edges": [0, 100, 1000], "weights": [1e308, 1e308]}


@pytest.fixture(scope="module")
def winner(client):
    r = posted(client, "/v1/plan", {**BODY, "top": 1, "use_profile": False})
    assert r.status_code == 200, r.text
    return r.json()["winner"]


@pytest.mark.parametrize("path", ["/v1/plan", "/v1/estimate"])
def test_a_lognormal_too_wide_is_refused_by_name_and_huge_weights_are_planned(client, winner, path):
    def body(docs):
        workload = {"seq_len": "4k", "documents": docs}
        if path == "/v1/plan":
            return {**BODY, "workload": workload, "top": 1, "use_profile": False}
        return {"plan": winner, "cluster": "dgx-h100", "nodes": 1, "workload": workload, "use_profile": False}

    refused(posted(client, path, body(WIDE)), "workload.documents.sigma")
    r = posted(client, path, body(HUGE_WEIGHTS))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path, body, field", [
    ("/v1/plan", {**BODY, "profile": "x\ud800"}, "profile"),
    ("/v1/plan", {**BODY, "model": {"name": "tiny\udc00", "layers": 2}}, "model.name"),
    ("/v1/plan", {**BODY, "workload": {"seq_len": "4k", "documents": ["1\ud800"]}}, "workload.documents[0]"),
    ("/v1/plan", {**BODY, "x\ud800": 1}, "x\\ud800"),
    ("/v1/estimate", {"plan": {"algorithm": "ring\ud800"}, "cluster": "dgx-h100"}, "plan.algorithm"),
    ("/v1/profiles", {"id": "x\ud800", "cluster": "dgx-h100"}, "id"),
    ("/v1/profiles", {"cluster": "dgx-h100\udfff"}, "cluster")])
def test_a_lone_surrogate_in_any_string_is_refused_naming_its_field(client, path, body, field):
    err = refused(posted(client, path, body), field)  # json.dumps writes it as the \ud800 escape
    assert "surrogate" in err["problem"]


def test_a_lone_surrogate_as_raw_bytes_or_in_a_utf16_body_is_refused_too(client):
    raw = json.dumps({**BODY, "profile": "x"}).replace('"x"', '"x\ud800"', 1).encode("utf-8", "surrogatepass")
    refused(client.post("/v1/plan", content=raw, headers=JSON), "profile")
    utf16 = json.dumps({**BODY, "profile": "x\ud800"}).encode("utf-16")
    refused(client.post("/v1/plan", content=utf16, headers=JSON), "profile")


def test_a_surrogate_pair_is_text_and_reaches_the_app(client):
    r = posted(client, "/v1/plan", {**BODY, "model": "tiny-gpt\U0001F600"})  # written as \ud83d\ude00
    assert refused(r, "model", 404)["problem"] == "unknown preset 'tiny-gpt\U0001F600'"


def test_a_chunked_body_over_the_limit_is_413_as_with_a_content_length(client):
    def chunks():
        for _ in range(30):
            yield b" " * 10_000  # 300 kB against the fixture's 200 kB

    streamed = client.post("/v1/plan", content=chunks(), headers=JSON)
    sized = client.post("/v1/plan", content=b" " * 300_000, headers=JSON)
    assert "content-length" not in streamed.request.headers and "content-length" in sized.request.headers
    assert refused(streamed, "body", 413) == refused(sized, "body", 413)


def test_a_chunked_body_under_the_limit_is_planned(client):
    data = json.dumps({**BODY, "top": 1, "use_profile": False}).encode()
    r = client.post("/v1/plan", content=(data[i:i + 16] for i in range(0, len(data), 16)), headers=JSON)
    assert r.status_code == 200 and r.json()["plans"], r.text


@pytest.fixture(scope="module")
def hijacked(tmp_path_factory):
    """A service started in a directory holding a model file named ``tiny-gpt`` and directories named ``dgx-h100``
    and ``llama3-8b`` (its search process works there), and that directory (a test works there too: monkeypatch)."""
    tmp = tmp_path_factory.mktemp("hijack")
    spec = load_model("tiny-gpt").model_dump(mode="json") | {"name": "hijacked", "layers": 1}
    (tmp / "tiny-gpt").write_text(json.dumps(spec))
    (tmp / "dgx-h100").mkdir()
    (tmp / "llama3-8b").mkdir()
    here = os.getcwd()
    app = create_app(Settings(store=f"sqlite:///{tmp}/store.db", processes=1))
    os.chdir(tmp)
    try:
        with TestClient(app, raise_server_exceptions=False) as c:  # the search process starts here, in tmp
            os.chdir(here)
            yield c, tmp
    finally:
        os.chdir(here)


def test_the_service_reads_preset_names_as_presets_never_as_files_in_its_directory(hijacked, monkeypatch):
    c, tmp = hijacked
    monkeypatch.chdir(tmp)
    r = posted(c, "/v1/plan", {**BODY, "top": 1, "use_profile": False})
    assert r.status_code == 200, r.text
    assert r.json()["model"]["name"] == "tiny-gpt" and r.json()["cluster"]["name"].startswith("dgx-h100")
    est = posted(c, "/v1/estimate", {"plan": r.json()["winner"], "cluster": "dgx-h100", "nodes": 1,
                                     "model": "tiny-gpt", "use_profile": False})
    assert est.status_code == 200 and est.json()["model"]["name"] == "tiny-gpt", est.text
    presets = c.get("/v1/presets")
    assert presets.status_code == 200 and presets.json()["models"]["llama3-8b"]["name"] == "llama3-8b", presets.text
    report = c.get(f"/v1/plans/{r.json()['id']}/report")  # rebuilt in the search process, started in that directory
    assert report.status_code == 200 and "dgx-h100" in report.text, report.text[:300]


def test_the_loaders_read_a_file_by_a_preset_name_only_when_files_are_allowed(hijacked, monkeypatch):
    monkeypatch.chdir(hijacked[1])
    assert load_model("tiny-gpt").name == "hijacked"  # the CLI's and the Python API's rule: a file first
    assert load_model("tiny-gpt", files=False).name == "tiny-gpt"
    assert load_cluster("dgx-h100", 2, files=False).num_nodes == 2
    with pytest.raises(PlanError) as e:
        load_cluster("dgx-h100")
    assert e.value.field == "cluster"
    for load, name in ((load_model, "../clusters/dgx-h100"), (load_cluster, "../models/tiny-gpt")):
        with pytest.raises(NotFound):  # a preset name is never a path, not even one into the presets
            load(name, files=False)


def test_a_report_page_is_rendered_once_and_served_again(client):
    """Reads are open and a large plan's page takes seconds of a search process: a page asked for again is the kept
    one (the same bytes, from the service's report cache), not a second rendering."""
    r = posted(client, "/v1/plan", {**BODY, "top": 1, "use_profile": False, "workload": {"seq_len": "8k"}})
    assert r.status_code == 200, r.text
    kept = client.app.state.svc.reports.done
    first = client.get(f"/v1/plans/{r.json()['id']}/report")
    assert first.status_code == 200 and f"{r.json()['id']}/-" in kept
    again = client.get(f"/v1/plans/{r.json()['id']}/report")
    assert again.status_code == 200 and again.text == first.text and len(kept) == 1


def test_a_preset_clusters_own_name_is_a_404_that_gives_the_preset_and_its_nodes(client):
    err = refused(posted(client, "/v1/plan", {**BODY, "cluster": "dgx-h100x2"}), "cluster", 404)
    assert "nodes" in err["fix"] and "'dgx-h100'" in err["fix"]


def _request_validator(client, model: str):
    """A JSON-schema validator of ``model``'s body as /openapi.json publishes it (what a generated client checks)."""
    from jsonschema import Draft202012Validator

    doc = client.get("/openapi.json").json()
    return Draft202012Validator({"$ref": f"#/components/schemas/{model}", "components": doc["components"]}), doc


@pytest.mark.parametrize("workload", [
    {"seq_len": "128k"},
    {"seq_len": 131072, "batch": 2, "inference": True},
    {"seq_len": "32k", "documents": "magi-short", "window": 4096, "window_pattern": "5:1", "seed": 3},
    {"seq_len": "32k", "documents": [37, 512, 1900], "window": 4096},
])
def test_the_published_request_schema_takes_the_bodies_the_service_takes(client, workload):
    """The forms a request's workload may take (a length like '128k', a distribution's name, an integer window with
    its pattern, inference) are in /openapi.json, so a client generated from it sends them; the service answers."""
    validate, _ = _request_validator(client, "PlanRequest")
    body = {**BODY, "workload": workload, "top": 1, "use_profile": False}
    validate.validate(body)
    assert posted(client, "/v1/plan", body).status_code == 200
    assert not validate.is_valid({**body, "workload": {**workload, "seq_len": [4096]}})  # still a schema


def test_every_error_status_is_published_with_the_body_it_answers(client):
    """Refusals answer the ErrorBody /openapi.json declares, at the statuses it declares; /metrics is text and the
    health check's 503 is published."""
    from jsonschema import Draft202012Validator

    doc = client.get("/openapi.json").json()
    answers = doc["paths"]["/v1/plan"]["post"]["responses"]
    assert {"400", "401", "403", "404", "413", "422", "503"} <= set(answers)
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    error = Draft202012Validator({"$ref": "#/components/schemas/ErrorBody", "components": doc["components"]})
    for r, status in ((posted(client, "/v1/plan", {**BODY, "workload": {"seq_len": "4kk"}}), 422),
                      (posted(client, "/v1/plan", {**BODY, "cluster": "nosuch"}), 404),
                      (client.post("/v1/plan", content=b"\xff", headers=JSON), 400)):
        assert r.status_code == status and str(status) in answers, r.text
        error.validate(r.json())
    assert "text/plain" in doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert "503" in doc["paths"]["/healthz"]["get"]["responses"]
    assert "magi-short" in client.get("/v1/presets").json()["documents"]
