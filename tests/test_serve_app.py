"""The service's parts in-process: the HTTP status from the error's class, the settings from the flags and the
environment, the answers' cache, and routes that are plain functions on routers (tests/test_serve.py runs the
same app as a real uvicorn server)."""
from __future__ import annotations

import asyncio
import json
import re

import pytest
import sqlalchemy as sa
import typer
import typer.main
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from sp_plan.cli.serve import serve_cmd
from sp_plan.planner.errors import MissingExtra, NotFound, PlanError, StoreError, Unavailable
from sp_plan.profiles.store import Store
from sp_plan.service.answers import Answers
from sp_plan.service.app import app_from_env, create_app
from sp_plan.service.auth import Forbidden, Unauthorized
from sp_plan.service.errors import status_of
from sp_plan.service.errors import error_response
from sp_plan.service.limits import BodyLimit, TooLarge
from sp_plan.service.pool import rebuilt
from sp_plan.service.routers import ROUTERS
from sp_plan.service.settings import SETTINGS_ENV, Settings, settings_env


@pytest.mark.parametrize("error, status", [
    (NotFound("profile", "no profile 'x'", "list them"), 404),
    (StoreError("store", "store s failed", "check it"), 503),
    (StoreError("--store", "store s failed", "check it"), 503),
    (Unavailable("search", "the search process died", "retry"), 503),
    (TooLarge(10), 413),
    (Unauthorized("a bearer token is required", "send one"), 401),
    (Forbidden("the token is not accepted", "use another"), 403),
    (PlanError("--store", "looks like the store's field", "but is plain bad input"), 422),
    (PlanError("workload.batch", "must be positive", "pass 1 or more"), 422),
    (MissingExtra("matplotlib", "report", "the report"), 422),
])
def test_the_status_comes_from_the_class_whatever_the_field_says(error, status):
    assert status_of(error) == status


def test_an_error_from_the_search_process_keeps_its_class_and_fields():
    e = rebuilt((NotFound, "cluster", "unknown preset 'x'", "use a preset"))
    assert type(e) is NotFound and status_of(e) == 404
    assert (e.field, e.problem, e.fix, str(e)) == ("cluster", "unknown preset 'x'", "use a preset",
                                                   "cluster: unknown preset 'x'; use a preset")


def test_settings_read_the_variables_serve_always_read_and_no_others(monkeypatch):
    monkeypatch.setenv("SP_PLAN_STORE", "sqlite:////tmp/from-env.db")
    monkeypatch.setenv("SP_PLAN_TOKENS", "a-token,b-token")
    for bare in ("STORE", "PRIVATE", "MAX_WORLD", "PROCESSES", "TOKENS"):  # no field is read by its bare name
        monkeypatch.setenv(bare, "7")
    s = Settings()
    assert s.store == "sqlite:////tmp/from-env.db" and s.listed_tokens() == "a-token,b-token"
    assert not s.private and s.max_world == 65536 and s.processes is None
    assert Settings(store="sqlite:////tmp/given.db").store == "sqlite:////tmp/given.db"  # the flag wins
    assert "a-token" not in repr(s) and "a-token" not in settings_env(s)  # tokens never travel to the workers


def test_empty_store_and_tokens_variables_count_as_unset(monkeypatch):
    """With SP_PLAN_STORE and SP_PLAN_TOKENS set but empty, serve has no store URL and no tokens from them, as the
    store and the token check treat them (the server starts on its default store, with no listed tokens)."""
    monkeypatch.delenv(SETTINGS_ENV, raising=False)
    monkeypatch.setenv("SP_PLAN_STORE", "")
    monkeypatch.setenv("SP_PLAN_TOKENS", "")
    s = Settings()
    assert s.store is None and s.listed_tokens() is None


def test_workers_take_the_settings_the_server_hands_them(monkeypatch, tmp_path):
    given = Settings(store=f"sqlite:///{tmp_path}/s.db", private=True, max_world=64, processes=2, freeze_gc=True)
    monkeypatch.setenv(SETTINGS_ENV, settings_env(given))
    monkeypatch.setenv("SP_PLAN_STORE", "sqlite:////tmp/not-this-one.db")
    assert app_from_env().state.settings == given


def test_the_settings_defaults_are_serves_flag_defaults():
    app = typer.Typer(add_completion=False)
    app.command()(serve_cmd)
    command = typer.main.get_command(app)
    flags = {p.name: p.default for p in command.params}
    defaults = Settings.model_construct()
    for name in ("store", "token_file", "private", "max_world", "max_body", "processes"):
        assert flags[name] == getattr(defaults, name), name


def test_every_route_is_a_module_function_on_a_router():
    routes = [r for router in ROUTERS for r in router.routes if isinstance(r, APIRoute)]
    assert len(routes) == 12 and {r.path for r in routes} <= set(create_app().openapi()["paths"])
    for r in routes:
        assert "<locals>" not in r.endpoint.__qualname__ and r.endpoint.__module__.startswith("sp_plan.service.routers.")


def test_answers_are_computed_once_stored_and_read_again(tmp_path):
    store = Store(f"sqlite:///{tmp_path}/s.db")
    calls = []

    async def compute():
        calls.append(1)
        await asyncio.sleep(0.01)
        return {"response": {"id": "k", "families": [1]}, "request": {}}, None

    async def main(answers: Answers):
        first = await asyncio.gather(*(answers.get("k", compute) for _ in range(3)))
        return first, await answers.get("k", compute)

    first, again = asyncio.run(main(Answers(store, size=4)))
    assert sorted(how for _, how in first) == ["coalesced", "coalesced", "computed"] and again[1] == "memory"
    both = first[0][0]
    assert json.loads(both[0])["families"] == [] and json.loads(both[1])["families"] == [1]
    fresh = Answers(store, size=4)  # a restarted service: the table answers, no search
    assert asyncio.run(fresh.get("k", compute)) == (both, "store") and len(calls) == 1
    with pytest.raises(NotFound):
        fresh.document("nope")
    store.close()


def test_an_answer_stored_again_under_its_id_replaces_the_first(tmp_path):
    """Two service workers over one table may compute one new request at once: the second to finish replaces the
    first's row rather than failing on its id."""
    store = Store(f"sqlite:///{tmp_path}/s.db")
    answers = Answers(store)
    answers.save("k", {"response": {"step": 1}}, "p1")
    answers.save("k", {"response": {"step": 2}}, "p1")
    assert answers.document("k") == {"response": {"step": 2}}
    store.close()


def test_a_remembered_body_is_found_only_under_the_profile_stamp_it_was_priced_with(tmp_path):
    """A raw request answered before is answered again from memory while its profile is unchanged; after the
    profile is replaced (a new stamp) it is priced again."""
    store = Store(f"sqlite:///{tmp_path}/s.db")
    answers = Answers(store)
    answers.remember("raw", "topology", "p1@t1", b"priced with p1 at t1")
    assert answers.remembered("raw", "p1@t1") == b"priced with p1 at t1" and answers.fingerprint("raw") == "topology"
    assert answers.remembered("raw", "p1@t2") is None and answers.remembered("raw", None) is None
    store.close()


async def _echo(scope, receive, send):
    """An app that reads the whole body and says how many bytes it got."""
    body = b""
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"got %d bytes" % len(body)})


def _sent(chunks: list[bytes], length: bytes | None = None, limit: int = 10) -> tuple[int, bytes]:
    """(status, body) of a POST whose body comes in ``chunks`` through ``BodyLimit`` over ``_echo``."""
    msgs = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent = []

    async def receive():
        return msgs.pop(0)

    async def send(m):
        sent.append(m)

    headers = [] if length is None else [(b"content-length", length)]
    asyncio.run(BodyLimit(_echo, limit, error_response)({"type": "http", "headers": headers, "method": "POST",
                                                         "path": "/"}, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_the_body_limit_counts_a_streamed_body_and_reads_every_chunk():
    """--max-body holds for a body sent in chunks (no Content-Length) as for a declared one, at exactly the limit
    too; a lone surrogate in a later chunk is refused as in the first."""
    assert _sent([b"x" * 10], b"10") == (200, b"got 10 bytes") and _sent([b"x" * 11], b"11")[0] == 413
    assert _sent([b"x" * 5, b"x" * 5]) == (200, b"got 10 bytes")
    status, body = _sent([b"x" * 5, b"x" * 8])
    assert status == 413 and json.loads(body)["error"]["field"] == "body"
    status, body = _sent([b'{"model":', b' "\\ud800"}'], limit=100)
    assert status == 422 and json.loads(body)["error"]["field"] == "model"


@pytest.mark.multiprocess  # the app's search pool
def test_a_failing_store_is_503_with_the_json_body_and_counted(tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    with TestClient(create_app(Settings(store=url, processes=1))) as c:
        assert c.get("/v1/profiles").json() == []
        assert c.get("/v1/profiles/abcd").status_code == 404
        eng = sa.create_engine(url)
        with eng.begin() as conn:
            conn.execute(sa.text("DROP TABLE profiles"))
        eng.dispose()
        r = c.get("/v1/profiles")
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert "no such table" in err["problem"] and err["fix"] and r.json()["detail"].startswith(err["field"] + ": ")
        metrics = c.get("/metrics").text
    assert float(re.search(r"^sp_plan_store_errors_total (\S+)$", metrics, re.M).group(1)) == 1


def test_a_bug_is_a_500_json_body_that_closes_the_connection(tmp_path):
    """An unexpected error is 500 with the JSON body, and ``Connection: close``: the server drops the connection
    after it, so a keep-alive client must not send its next request down it."""
    app = create_app(Settings(store=f"sqlite:///{tmp_path}/s.db", processes=1))

    @app.get("/v1/boom")
    async def boom():
        raise RuntimeError("a bug")

    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.get("/v1/boom")
    assert r.status_code == 500 and r.json()["error"]["field"] == "server", r.text
    assert r.headers["connection"] == "close"
