"""`sp-plan serve` end to end: the real server (uvicorn in a subprocess on 127.0.0.1), the client, raw HTTP and the
CLI's --server, on SQLite and on a real PostgreSQL server (tests/pgserver.py)."""
from __future__ import annotations

import html
import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from pgserver import fresh_database, postgres_url  # noqa: F401 - fixture
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from sp_plan.cli.app import app
from sp_plan.client import Client
from sp_plan.planner.errors import PlanError
from sp_plan.planner.model import Workload
from sp_plan.planner.plan import Plan
from sp_plan.planner.profile import Profile
from sp_plan.profiles.store import Store
from sp_plan.runtime.spawn import free_port
from sp_plan.pipeline import PlanRequest, PlanResponse, run_plan

FIXTURE = Path(__file__).parent / "fixtures" / "profile-dgx-h100.yaml"
#: the tests of the store and of the service that use PostgreSQL share one pytest-xdist worker: the throwaway server
#: (a session fixture) and this module's two uvicorn servers (module fixtures) start once, not once per worker
pytestmark = pytest.mark.xdist_group("postgres")
TOKEN = "t0ken-for-tests-7f3a"
PLAN = ["--cluster", "dgx-h100", "--nodes", "2", "--model", "llama3-8b", "--top", "3"]


class Server:
    """`sp-plan serve` in a subprocess on a free loopback port; its output goes to a log file."""

    def __init__(self, store: str, tmp: Path, *extra: str):
        self.store, self.tmp, self.extra = store, tmp, extra
        (tmp / "tokens").write_text(f"# test tokens\n{TOKEN}\n")
        self.log = tmp / "server.log"
        self.start()

    def start(self, tries: int = 5) -> None:
        """Start on a free port; another process may take it between the probe and the bind, so that retries."""
        for _ in range(tries):
            if self._start():
                return
        raise AssertionError(f"no free port in {tries} tries:\n{self.log.read_text()}")

    def _start(self) -> bool:
        self.port, since = free_port(), self.log.stat().st_size if self.log.exists() else 0
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k not in ("SP_PLAN_TOKENS", "SP_PLAN_TOKEN")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sp_plan.cli.app", "serve", "--port", str(self.port), "--store", self.store,
             "--token-file", str(self.tmp / "tokens"), "--processes", "1", "--max-body", "200000", *self.extra],
            stdout=open(self.log, "a"), stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                assert "is in use" in self.log.read_text()[since:], self.log.read_text()
                return False
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"server did not start:\n{self.log.read_text()}")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


def _fresh_url(request, tmp_path: Path, backend: str) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path}/store.db"
    return fresh_database(request.getfixturevalue("postgres_url"), "s")


def module_server(tmp_path_factory, name: str, request=None):
    """A module fixture's `sp-plan serve`, in a folder of its own: on SQLite there, or with ``request`` on its
    param's backend ("sqlite" or "postgres"); stopped when the module is done."""
    tmp = tmp_path_factory.mktemp(name)
    srv = Server(_fresh_url(request, tmp, request.param if request else "sqlite"), tmp)
    yield srv
    srv.stop()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(request, tmp_path_factory):
    yield from module_server(tmp_path_factory, f"serve-{request.param}", request)


def _effort(printed: str) -> str:
    """A plan's printout with its count of priced candidates left out."""
    return re.sub(r"candidates, [\d,]+ priced", "candidates, N priced", printed)


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The CLI in this process (typer's CliRunner: no interpreter start per call), as a CompletedProcess."""
    r = CliRunner().invoke(app, list(args), env=env)
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)


def _scraped(text: str, name: str, **labels) -> float:
    """A metric's value in a /metrics page (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(name) and (not labels or "{" + want + "}" in line):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _metric(srv: Server, name: str, **labels) -> float:
    return _scraped(httpx.get(f"{srv.url}/metrics").text, name, **labels)


@pytest.mark.parametrize("server", ["sqlite"], indirect=True)  # the store's backends answer alike: the tests below
def test_plan_over_http_is_the_cli_plan(server, tmp_path):
    """`sp-plan plan --server` prints what the local run prints; the client's winner is the Python API's."""
    local = _cli("plan", *PLAN, "--seq-len", "64k", "--store", server.store, "-o", str(tmp_path / "local.yaml"),
                 "--report", str(tmp_path / "local.html"))
    remote = _cli("plan", *PLAN, "--seq-len", "64k", "--server", server.url, "-o", str(tmp_path / "remote.yaml"))
    assert local.returncode == 0 and remote.returncode == 0, local.stderr + remote.stderr
    # every line alike but the count of priced candidates: the search's own effort, which grows where the local
    # grid runs in forked shares (`--jobs`), each pruned against its own bounds
    assert _effort(remote.stdout.replace("remote.yaml", "local.yaml")) == \
        _effort(local.stdout.replace(f"wrote {tmp_path / 'local.html'}\n", "")) and "ranked layouts" in local.stdout
    assert Plan.load(tmp_path / "remote.yaml") == Plan.load(tmp_path / "local.yaml")

    req = PlanRequest(cluster="dgx-h100", nodes=2, model="llama3-8b", workload=Workload(seq_len=65536), top=3,
                      families=True)
    with Client(server.url) as c:
        res = c.plan(req)
    here = run_plan(req, server.store)
    assert res.winner == here.winner == res.plans[0] and res.plans == here.plans and res.families == here.families
    assert res.id and res.profile is None and res.profile_line == here.profile_line

    raw = httpx.post(f"{server.url}/v1/plan", json={"cluster": "dgx-h100", "nodes": 2, "model": "llama3-8b",
                                                  "workload": {"seq_len": "64k"}, "top": 3})
    assert raw.status_code == 200 and raw.json()["id"] == res.id  # "64k" and 65536 are one request
    got = httpx.get(f"{server.url}/v1/plans/{res.id}")
    assert got.status_code == 200 and Plan.model_validate(got.json()["winner"]) == res.winner
    page = httpx.get(f"{server.url}/v1/plans/{res.id}/report", timeout=120)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    when = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC")  # the report's "made at" minute
    assert when.sub("", page.text) == when.sub("", (tmp_path / "local.html").read_text())  # = `plan --report`
    assert html.escape(res.winner.summary()) in page.text and "<img" in page.text


def test_families_are_sent_only_when_asked_for(server):
    """The best layout of each algorithm variant is most of a large answer: opt-in, from the one search and cache."""
    body = {"cluster": "dgx-h100", "nodes": 2, "model": "llama3-8b", "workload": {"seq_len": "48k"}, "top": 2}
    computed = _metric(server, "sp_plan_plan_cache_total", result="computed")
    slim = httpx.post(f"{server.url}/v1/plan", json=body, timeout=120)
    full = httpx.post(f"{server.url}/v1/plan", json={**body, "families": True}, timeout=120)
    assert slim.status_code == full.status_code == 200 and len(slim.content) < len(full.content)
    assert _metric(server, "sp_plan_plan_cache_total", result="computed") == computed + 1  # one search for both
    s, f = PlanResponse.model_validate_json(slim.content), PlanResponse.model_validate_json(full.content)
    assert s.families == [] and len(f.families) > 1 and s.model_copy(update={"families": f.families}) == f
    with Client(server.url) as c:
        assert c.get_plan(s.id) == s and c.get_plan(s.id, families=True) == f
    req = PlanRequest.model_validate(body)
    assert run_plan(req, server.store) == s.model_copy(update={"id": None})
    assert run_plan(req.model_copy(update={"families": True}), server.store).families == f.families


def test_estimate_over_http_is_the_cli_estimate(server, tmp_path):
    _cli("plan", *PLAN, "--seq-len", "32k", "--no-profile", "--store", server.store, "-o", str(tmp_path / "p.yaml"))
    args = ["estimate", str(tmp_path / "p.yaml"), "--cluster", "dgx-h100", "--nodes", "2", "--seq-len", "128k"]
    local = _cli(*args, "--store", server.store)
    remote = _cli(*args, "--server", server.url)
    assert local.returncode == 0 and remote.returncode == 0, local.stderr + remote.stderr
    assert remote.stdout == local.stdout and "tokens/s" in local.stdout
    raw = httpx.post(f"{server.url}/v1/estimate", json={"plan": {"algorithm": "ulysses", "degrees": {"ulysses": 8}},
                                                       "cluster": "dgx-h100", "model": "llama3-8b",
                                                       "workload": {"seq_len": "64k", "inference": True}})
    assert raw.status_code == 200 and raw.json()["plan"]["predicted"]["step_time_s"] > 0
    assert raw.json()["workload"]["training"] is False
    unknown = httpx.post(f"{server.url}/v1/estimate", json={"plan": {"algorithm": "ulysses", "degrees": {"ulysses": 8}},
                                                           "cluster": "dgx-h100", "model": "gpt-9"})
    assert unknown.status_code == 404 and unknown.json()["error"]["field"] == "model"
    other = ["--nodes", "4", "--store", server.store]  # a plan for another cluster: the same one-line error
    local, remote = _cli(*args, *other), _cli(*args, *other[:2], "--server", server.url)
    assert local.returncode == remote.returncode == 2 and local.stderr == remote.stderr and "cluster_fingerprint" in local.stderr


def test_bayes_search_keeps_its_study_in_the_store(server):
    import optuna

    req = PlanRequest(cluster="dgx-h100", nodes=2, model="llama3-8b", workload=Workload(seq_len=16384), search="bayes",
                      trials=8, seed=3, top=2)
    res = Client(server.url).plan(req)
    here = run_plan(req, server.store)
    assert res.winner == here.winner and res.search.trials == 8 == here.search.trials
    assert f"sp-plan-{res.id}" in optuna.get_all_study_names(storage=server.store)


def test_uploaded_profile_is_listed_used_and_invalidates_the_cache(server, tmp_path):
    req = dict(cluster="dgx-h100", nodes=2, model="llama3-8b", workload={"seq_len": "128k"}, top=2)
    with Client(server.url) as anon:
        before = anon.plan(**req)
    assert before.profile is None
    up = _cli("profile", "import", str(FIXTURE), "--server", server.url, env={"SP_PLAN_TOKEN": TOKEN})
    assert up.returncode == 0, up.stderr
    pid = up.stdout.strip()
    with Client(server.url) as c:
        assert pid in [p.id for p in c.profiles()] and c.profile(pid).cluster_fingerprint == "c4bc4ea2f6b051f2"
        clusters = httpx.get(f"{server.url}/v1/clusters").json()
        assert {"cluster": "dgx-h100x2", "fingerprint": "c4bc4ea2f6b051f2"}.items() <= \
            next(x for x in clusters if x["fingerprint"] == "c4bc4ea2f6b051f2").items()
        after = c.plan(**req)  # a new profile: a new cache key, priced with the profile
        assert after.profile == pid and after.id != before.id and f"using profile {pid}" in after.profile_line
        assert after.winner.predicted != before.winner.predicted
        plain = c.plan(**req, use_profile=False)
        assert plain.profile is None and plain.winner == before.winner
        named = c.plan(**req, profile=pid[:6])
        assert named.profile == pid and named.winner == after.winner
    with Client(server.url, token=TOKEN) as w:
        w.delete_profile(pid)
        assert pid not in [p.id for p in w.profiles()]
        with pytest.raises(PlanError) as e:
            w.delete_profile(pid)
        assert e.value.field == "profile"


def test_tune_with_server_uploads_the_profile_it_stored(server, tmp_path, monkeypatch):
    """`sp-plan tune --server`: the profile tune stores is uploaded, listed and used. The measuring is replaced by
    the fixture's profile (a world of one here; tests/test_tune.py runs the real tune on 4 ranks)."""
    from sp_plan.profiles.tune import run as tune_run

    def measured(cluster, model, work, store=None, opts=None, progress=None):
        p = Profile.load(FIXTURE).model_copy(update={"fitted": ["tune --server test"]})
        store.save_profile(p)
        return tune_run.TuneReport(profile=p, best=None, resumed=False, reused=[], stop_reason="budget")

    monkeypatch.setattr(tune_run, "tune", measured)
    monkeypatch.setattr(tune_run, "check_world", lambda cluster, world: None)
    local = f"sqlite:///{tmp_path}/tune.db"
    r = _cli("tune", "--cluster", "dgx-h100", "--nodes", "2", "--model", "llama3-8b", "--seq-len", "32k",
             "--store", local, "--server", server.url, env={"SP_PLAN_TOKEN": TOKEN})
    assert r.returncode == 0, r.stdout + r.stderr
    (mine,) = Store(local).list_profiles()
    assert f"uploaded profile {mine.id} to {server.url}" in r.stdout
    with Client(server.url) as c:
        assert c.profile(mine.id).fitted == ["tune --server test"]
        assert c.plan(cluster="dgx-h100", nodes=2, model="llama3-8b", workload={"seq_len": "32k"}, top=1).profile == mine.id
    bad = _cli("tune", "--cluster", "dgx-h100", "--nodes", "2", "--model", "llama3-8b", "--seq-len", "32k",
               "--store", local, "--server", server.url, env={"SP_PLAN_TOKEN": "wrong"})
    assert bad.returncode == 2 and "Authorization: the token is not accepted" in bad.stderr and "stored profile" in bad.stdout


def test_writes_need_a_token_that_is_never_logged(server):
    body = Profile.load(FIXTURE).model_dump(mode="json")
    missing = httpx.post(f"{server.url}/v1/profiles", json=body)
    wrong = httpx.post(f"{server.url}/v1/profiles", json=body, headers={"Authorization": "Bearer not-the-token-91"})
    delete = httpx.delete(f"{server.url}/v1/profiles/abcd", headers={"Authorization": "Basic eDp5"})
    assert (missing.status_code, wrong.status_code, delete.status_code) == (401, 403, 401)
    for r in (missing, wrong, delete):
        assert r.json()["error"]["field"] == "Authorization" and r.json()["error"]["fix"]
    ok = httpx.post(f"{server.url}/v1/profiles", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 201 and ok.json()["id"]
    assert httpx.get(f"{server.url}/v1/profiles/{ok.json()['id']}").status_code == 200  # reads are open
    log = server.log.read_text()
    assert TOKEN not in log and "not-the-token-91" not in log and "POST /v1/profiles" in log


def test_bad_input_is_a_4xx_with_the_field_and_the_fix(server):
    p = lambda body: httpx.post(f"{server.url}/v1/plan", json=body)  # noqa: E731
    base = {"cluster": "dgx-h100", "model": "llama3-8b", "workload": {"seq_len": "128k"}}
    cases = [  # (body change, status, field)
        ({"cluster": "dgx-h999"}, 404, "cluster"),
        ({"model": "llama9"}, 404, "model"),
        ({"profile": "feedbeef"}, 404, "profile"),
        ({"profile": "/etc/passwd"}, 422, "profile"),
        ({"cluster": "/etc/hosts.yaml"}, 404, "cluster"),
        ({"workload": {"seq_len": "12x"}}, 422, "workload.seq_len"),
        ({"workload": {"seq_len": 1024, "batch": 0}}, 422, "workload.batch"),
        ({"nodes": 9000}, 422, "cluster"),
        ({"nodes": 10**9}, 422, "nodes"),
        ({"nodes": 0}, 422, "nodes"),
        ({"cluster": {"nodes": []}}, 422, "cluster.node_types"),
        ({"model": {"layers": 2, "hidden": 100, "heads": 3}}, 422, "model.head_dim"),
        ({"search": "anneal"}, 422, "search"),
        ({"top": 0}, 422, "top"),
        ({"unknown": 1}, 422, "unknown"),
    ]
    for change, status, field in cases:
        r = p({**base, **change})
        assert r.status_code == status, (change, r.text)
        err = r.json()["error"]
        assert err["field"] == field and err["problem"] and err["fix"], (change, err)
    # the CLI's line for the same bad input: the same problem and fix, its field named by the flag
    cli = _cli("plan", "--cluster", "dgx-h100", "--model", "llama3-8b", "--seq-len", "12x")
    err = p({**base, "workload": {"seq_len": "12x"}}).json()["error"]
    assert cli.returncode == 2 and cli.stderr.startswith(f"error: --seq-len: {err['problem']}; {err['fix']}"), cli.stderr
    big = httpx.post(f"{server.url}/v1/plan", content=b"{" + b" " * 300000 + b"}",
                     headers={"content-type": "application/json"})
    assert big.status_code == 413 and big.json()["error"]["field"] == "body"
    junk = httpx.post(f"{server.url}/v1/plan", content=b'{"cluster":', headers={"content-type": "application/json"})
    assert junk.status_code == 422 and junk.json()["error"]["field"] == "body"
    assert httpx.get(f"{server.url}/v1/plans/nope").status_code == 404
    assert httpx.get(f"{server.url}/v1/profiles/nope").status_code == 404
    assert httpx.get(f"{server.url}/healthz").status_code == 200  # nothing above hurt the server
    assert _metric(server, "sp_plan_requests_total", endpoint="/v1/plan", method="POST", status="404") >= 4


def test_identical_concurrent_requests_are_computed_once(server):
    body = {"cluster": "dgx-h100", "nodes": 4, "model": "llama3-8b", "workload": {"seq_len": 3 * 2**16}, "top": 2}
    before = {k: _metric(server, "sp_plan_plan_cache_total", result=k) for k in ("computed", "coalesced", "memory")}
    with ThreadPoolExecutor(8) as ex:
        rs = list(ex.map(lambda _: httpx.post(f"{server.url}/v1/plan", json=body, timeout=120), range(8)))
    assert all(r.status_code == 200 for r in rs) and len({r.text for r in rs}) == 1
    d = {k: _metric(server, "sp_plan_plan_cache_total", result=k) - v for k, v in before.items()}
    assert d["computed"] == 1 and d["coalesced"] + d["memory"] == 7
    assert _metric(server, "sp_plan_search_seconds_count", kind="grid") >= 1


def test_presets_openapi_health_and_metrics(server):
    pr = httpx.get(f"{server.url}/v1/presets").json()
    assert "dgx-h100" in pr["clusters"] and pr["models"]["llama3-8b"]["layers"] == 32
    spec = httpx.get(f"{server.url}/openapi.json", timeout=60).json()  # built on the first request
    assert {"/v1/plan", "/v1/estimate", "/v1/profiles", "/v1/profiles/{id}", "/v1/plans/{id}", "/v1/presets",
            "/v1/clusters", "/healthz", "/metrics"} <= set(spec["paths"])
    assert "PlanRequest" in spec["components"]["schemas"] and "Cluster" in spec["components"]["schemas"]
    assert httpx.get(f"{server.url}/docs", timeout=60).status_code == 200
    h = httpx.get(f"{server.url}/healthz").json()
    assert h["status"] == "ok"
    assert _metric(server, "sp_plan_request_seconds_count", endpoint="/healthz", method="GET") >= 1


def _children(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (Linux /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _alive(pid: int) -> bool:
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z"
    except OSError:
        return False


def test_sigkill_and_restart_lose_nothing_acknowledged(server):
    """SIGKILL right after the answers, restart on the same store: the profile and the plan are served again."""
    with Client(server.url, token=TOKEN) as c:
        pid = c.upload_profile(Profile.load(FIXTURE).model_copy(update={"fitted": ["sigkill test"]}))
        res = c.plan(cluster="dgx-h100", nodes=2, model="llama3-8b", workload={"seq_len": "32k"}, top=2)
    assert res.profile == pid
    workers = _children(server.proc.pid)
    assert workers, "the search ran in the pool"
    server.kill()
    deadline = time.monotonic() + 15  # the pool's workers follow their server (service.pool.die_with_parent)
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(w) for w in workers), "orphaned search workers outlived the killed server"
    server.start()
    with Client(server.url) as c:
        assert c.profile(pid).fitted == ["sigkill test"] and c.profile(pid).id == pid
        assert c.get_plan(res.id) == res
        assert c.plan(cluster="dgx-h100", nodes=2, model="llama3-8b", workload={"seq_len": "32k"}, top=2) == res
    assert _metric(server, "sp_plan_plan_cache_total", result="store") == 1  # answered from the store, not searched


def _in_process(store: str, tmp: Path, *extra: str, monkeypatch) -> TestClient:
    """The app `sp-plan serve` builds from these flags, served in this process (Starlette's TestClient): the flags
    reach the app as they do under uvicorn, without a server start (the tests above run the real uvicorn)."""
    import uvicorn

    (tmp / "tokens").write_text(f"# test tokens\n{TOKEN}\n")
    ran = {}
    monkeypatch.setattr(uvicorn, "run", lambda target, **kw: ran.update(target=target))
    monkeypatch.delenv("SP_PLAN_TOKENS", raising=False)
    r = _cli("serve", "--store", store, "--token-file", str(tmp / "tokens"), "--processes", "1", *extra)
    assert r.returncode == 0 and "target" in ran, r.stderr
    ran["target"].state.settings = ran["target"].state.settings.model_copy(update={"freeze_gc": False})
    return TestClient(ran["target"], raise_server_exceptions=False)


@pytest.mark.postgres  # its database comes from the session's server, which another test may have started
def test_a_lost_database_is_503_and_counted(request, tmp_path, monkeypatch):
    """The PostgreSQL database dropped under a running service: /healthz and writes answer 503 with a JSON error
    and /metrics counts the store errors; the service itself keeps answering."""
    url = _fresh_url(request, tmp_path, "postgres")
    with _in_process(url, tmp_path, monkeypatch=monkeypatch) as srv:
        eng = sa.create_engine(url.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT")
        with eng.connect() as c:
            c.execute(sa.text(f"DROP DATABASE {url.rsplit('/', 1)[1]} WITH (FORCE)"))
        eng.dispose()
        assert srv.get("/healthz").status_code == 503
        up = srv.post("/v1/profiles", json=Profile.load(FIXTURE).model_dump(mode="json"),
                      headers={"Authorization": f"Bearer {TOKEN}"})
        assert up.status_code == 503 and up.json()["error"]["field"] == "store", up.text
        assert _scraped(srv.get("/metrics").text, "sp_plan_store_errors_total") >= 2


def test_private_service_needs_a_token_to_read(tmp_path, monkeypatch):
    with _in_process(f"sqlite:///{tmp_path}/store.db", tmp_path, "--private", monkeypatch=monkeypatch) as srv:
        assert srv.get("/v1/profiles").status_code == 401
        assert srv.get("/v1/profiles", headers={"Authorization": "Bearer nope"}).status_code == 403
        assert srv.get("/v1/profiles", headers={"Authorization": f"Bearer {TOKEN}"}).json() == []
        assert srv.get("/healthz").status_code == 200


def test_plan_report_and_sensitivity_are_local_only():
    r = _cli("plan", *PLAN, "--seq-len", "64k", "--server", "http://127.0.0.1:9", "--report", "r.html")
    assert r.returncode == 2 and "--report" in r.stderr and "/v1/plans/ID/report" in r.stderr
    r = _cli("plan", *PLAN, "--seq-len", "64k", "--server", "http://127.0.0.1:9", "--jobs", "2")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--jobs" in r.stderr and "--workers" in r.stderr


def test_serve_refuses_bad_options(tmp_path):
    r = _cli("serve", "--token-file", str(tmp_path / "missing"), "--store", f"sqlite:///{tmp_path}/s.db")
    assert r.returncode == 2 and "--token-file" in r.stderr and "Traceback" not in r.stderr
    r = _cli("serve", "--private", "--store", f"sqlite:///{tmp_path}/s.db", env={"SP_PLAN_TOKENS": ""})
    assert r.returncode == 2 and "--private" in r.stderr


def test_client_says_when_the_service_is_down():
    with pytest.raises(PlanError) as e:
        Client(f"http://127.0.0.1:{free_port()}").plan(cluster="dgx-h100", model="llama3-8b", workload={"seq_len": 1024})
    assert e.value.field == "server" and "sp-plan serve" in e.value.fix


def test_a_stopping_server_ends_a_search_in_flight(tmp_path):
    """SIGTERM stops the service within its grace even while a long search runs: the request in flight is ended
    after the grace and the search process with it, where the server used to wait for the search to finish."""
    from sp_plan.cli.serve import GRACE_S

    srv = Server(f"sqlite:///{tmp_path / 'store.db'}", tmp_path)
    try:
        body = {"cluster": "dgx-h100", "nodes": 64, "model": "llama3-70b", "workload": {"seq_len": "1m"},
                "search": "bayes", "trials": 10_000}
        sent = subprocess.Popen([sys.executable, "-c", "import httpx, json, sys; httpx.post(sys.argv[1], json="
                                 "json.loads(sys.argv[2]), headers={'Authorization': 'Bearer ' + sys.argv[3]}, "
                                 "timeout=300)", f"{srv.url}/v1/plan", json.dumps(body), TOKEN],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(3)  # the search has started in the pool
        t0 = time.monotonic()
        srv.proc.terminate()
        srv.proc.wait(GRACE_S + 30)
        assert time.monotonic() - t0 < GRACE_S + 30
        sent.kill()
    finally:
        srv.stop()
