"""The profile store (profiles/store.py) on SQLite and on a real PostgreSQL server, and resolve_profile."""
from __future__ import annotations

import signal
import json
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from pgserver import fresh_database, postgres_url  # noqa: F401 - fixture
from sp_plan.planner.yamlio import yaml_dump
from sp_plan.planner.errors import NotFound, PlanError, StoreError
from sp_plan.planner.params import CommFit, Curve, Params
from sp_plan.planner.profile import MeasuredCandidate, Profile
from sp_plan.profiles import load_cluster
from sp_plan.profiles.store import MIGRATIONS, Store, default_store_url, resolve_profile, run_key, store_url
from sp_plan.service.answers import Answers

FIXTURE = Path(__file__).parent / "fixtures" / "profile-dgx-h100.yaml"
#: the tests of the store and of the service that use PostgreSQL share one pytest-xdist worker: the throwaway server
#: (a session fixture) starts once, not once per worker
pytestmark = pytest.mark.xdist_group("postgres")


def make_profile(fp: str = "f" * 16, **kw) -> Profile:
    base = dict(cluster="test", cluster_fingerprint=fp, stack={"torch": "2.13.0", "nccl": "2.27.3"},
                params=Params(matmul=Curve(points=((1024, 0.5), (65536, 0.8))), overlap=0.9,
                              comm={"all_to_all/intra": CommFit(alpha_s=1e-5, efficiency=0.8)}),
                fitted=["matmul from 6 GEMMs"], workloads=[{"model": "llama3-8b", "seq_len": 65536}],
                candidates=[MeasuredCandidate(summary="ulysses8", plan={"degrees": {"ulysses": 8}}, predicted_before_s=1.0,
                                              predicted_after_s=1.2, measured_s=1.25),
                            MeasuredCandidate(summary="ring8", plan={}, status="oom", reason="OOM on rank 2")],
                loo_error_before=0.2, loo_error_after=0.04, measurements={"links": {"a": [1, 2, 3]}})
    base.update(kw)
    return Profile(**base)


@pytest.fixture(params=["sqlite", "postgres"])
def url(request, tmp_path):
    """A fresh store URL on each backend (PostgreSQL: a new database on the throwaway server)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/store.db"
    return fresh_database(request.getfixturevalue("postgres_url"))


def test_profile_round_trip(url):
    st = Store(url)
    assert st.healthy() and st.revision() == "0002"
    p = make_profile()
    pid = st.save_profile(p)
    assert pid and p.id == pid and p.created_at
    back = st.get_profile(pid)
    assert back == p and back.params.comm["all_to_all/intra"].efficiency == 0.8
    assert st.get_profile(pid[:6]) == p  # unique prefix
    old = make_profile(created_at="2020-01-01T00:00:00+00:00")
    other = make_profile(fp="0" * 16)
    st.save_profile(old), st.save_profile(other)
    assert [x.id for x in st.list_profiles("f" * 16)] == [pid, old.id]
    assert len(st.list_profiles()) == 3
    assert st.latest_profile("f" * 16).id == pid and st.latest_profile("nope") is None
    p.loo_error_after = 0.01  # same id: replaced, not duplicated
    st.save_profile(p)
    assert st.get_profile(pid).loo_error_after == 0.01 and len(st.list_profiles()) == 3
    again = [make_profile(fp="1" * 16) for _ in range(2)]  # one id-less file uploaded twice: one row, its content's id
    assert st.save_profile(again[0]) == st.save_profile(again[1]) and len(st.list_profiles()) == 4
    st.delete_profile(pid)
    with pytest.raises(PlanError):
        st.get_profile(pid[:2])  # too short to be an id prefix
    assert st.latest_profile("f" * 16).id == old.id
    with pytest.raises(NotFound) as e:
        st.get_profile(pid)
    assert e.value.field == "profile" and "sp-plan profile list" in e.value.fix
    with pytest.raises(NotFound):
        st.delete_profile(pid)
    st.close()
    assert Store(url).get_profile(other.id) == other  # reopening: already at head


def test_link_fits_and_runs(url):
    st = Store(url)
    assert st.link_fit("abc") is None
    st.save_link_fit("abc", {"classes": {"intra": 1}})
    st.save_link_fit("abc", {"classes": {"intra": 2}})
    st.save_link_fit("xyz", {"classes": {}})
    assert st.link_fit("abc") == {"classes": {"intra": 2}}
    key = run_key("abc", {"torch": "2.13"}, {"name": "llama3-8b"}, {"seq_len": 65536}, {"budget": 10})
    assert key == run_key("abc", {"torch": "2.13"}, {"name": "llama3-8b"}, {"seq_len": 65536}, {"budget": 10})
    assert key != run_key("abc", {"torch": "2.13"}, {"name": "llama3-8b"}, {"seq_len": 65536}, {"budget": 11})
    for other in (("abd", {"torch": "2.13"}, {"name": "llama3-8b"}, {"seq_len": 65536}),  # a tune on each changed
                  ("abc", {"torch": "2.12"}, {"name": "llama3-8b"}, {"seq_len": 65536}),  # input measures afresh
                  ("abc", {"torch": "2.13"}, {"name": "llama3-70b"}, {"seq_len": 65536}),
                  ("abc", {"torch": "2.13"}, {"name": "llama3-8b"}, {"seq_len": 32768})):
        assert key != run_key(*other, {"budget": 10}), other
    rid, resumed = st.start_run(key, {"model": "llama3-8b"})
    assert not resumed
    st.record_step(rid, "links", "running", {})
    st.record_step(rid, "links", "ok", {"fit": [1.5, 2]})
    st.record_step(rid, "candidate:ulysses8", "failed", {"reason": "OOM"})
    assert Store(url).start_run(key, {}) == (rid, True)  # another process would see the same run
    assert st.steps(rid) == {"links": ("ok", {"fit": [1.5, 2]}), "candidate:ulysses8": ("failed", {"reason": "OOM"})}
    assert st.run(rid)["meta"] == {"model": "llama3-8b"} and st.run(rid)["status"] == "running"
    st.finish_run(rid)
    assert st.run(rid)["status"] == "done"
    rid2, resumed2 = st.start_run(key, {})
    assert rid2 != rid and not resumed2 and st.steps(rid2) == {}
    assert [r["id"] for r in st.runs(key)] == [rid2, rid]
    with pytest.raises(PlanError):
        st.finish_run(10**6)


def test_newer_schema_refused(url):
    st = Store(url)
    assert st.healthy()
    eng = sa.create_engine(url)
    with eng.begin() as c:
        c.execute(sa.text("UPDATE sp_plan_alembic_version SET version_num = '9999_future'"))
    eng.dispose()
    assert not st.healthy()
    with pytest.raises(StoreError) as e:
        Store(url)
    assert e.value.field == "store" and "newer" in e.value.problem and "upgrade sp-plan" in e.value.fix


@pytest.mark.parametrize("bad", ["nosuch://x", "not a url", "postgresql+psycopg://sp@127.0.0.1:1/db",
                                 "sqlite:///{tmp}/missing/dir/store.db", "sqlite:///{tmp}/afile/store.db", "",
                                 "sqlite://", "sqlite:///:memory:", "sqlite:///{tmp}/afile"])
def test_bad_store_url(bad, tmp_path):
    (tmp_path / "afile").write_text("x" * 4096)
    with pytest.raises(StoreError) as e:
        Store(bad.format(tmp=tmp_path))
    assert e.value.field == "store" and e.value.fix
    if bad in ("", "sqlite://", "sqlite:///:memory:"):  # nothing to open, or nothing kept: refused as such
        assert ("empty" if not bad else "in-memory") in e.value.problem
    if bad.endswith("afile"):  # a file, not a database: the fix says so, not "is the server up"
        assert "not a database" in e.value.problem and "sp-plan store" in e.value.fix


def test_a_damaged_store_file_is_named_damaged(tmp_path):
    """A SQLite store cut short (a copy that stopped, a full disk): the fix is a copy of the file, not the server."""
    Store(f"sqlite:///{tmp_path}/full.db").close()
    (tmp_path / "half.db").write_bytes((tmp_path / "full.db").read_bytes()[:8192])
    with pytest.raises(StoreError) as e:
        Store(f"sqlite:///{tmp_path}/half.db")
    assert "malformed" in e.value.problem and "damaged: restore it from a copy" in e.value.fix


def test_a_bad_store_from_the_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv("SP_PLAN_STORE", "nosuch://x")
    with pytest.raises(PlanError) as e:
        Store()
    assert e.value.field == "SP_PLAN_STORE" and "nosuch://x" in e.value.problem
    with pytest.raises(PlanError) as e:
        Store("nosuch://y")  # the caller's URL wins, and is named as the caller's
    assert e.value.field == "store"


def test_url_resolution(monkeypatch, tmp_path):
    import platformdirs

    assert default_store_url() == f"sqlite:///{platformdirs.user_data_path('sp-plan') / 'store.db'}"
    monkeypatch.delenv("SP_PLAN_STORE", raising=False)
    assert store_url() == default_store_url()
    monkeypatch.setenv("SP_PLAN_STORE", f"sqlite:///{tmp_path}/env.db")
    assert Store().url == f"sqlite:///{tmp_path}/env.db" and (tmp_path / "env.db").exists()
    assert store_url("sqlite:///x.db") == "sqlite:///x.db"
    assert (MIGRATIONS / "env.py").exists() and list((MIGRATIONS / "versions").glob("0001_*.py"))


def _python(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


WRITER = """
    import sys
    from sp_plan.planner.profile import Profile
    from sp_plan.profiles.store import Store
    url, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    st = Store(url)
    rid, _ = st.start_run("shared-key", {})
    for i in range(n):
        st.save_profile(Profile(cluster=tag, cluster_fingerprint="fp" + tag, measurements={"i": i, "pad": "x" * 2000}))
        st.record_step(rid, f"{tag}:{i}", "ok", {"i": i})
        st.save_link_fit("fp", {"by": tag, "i": i})
    print(rid)
"""


def test_two_processes_write_at_once(url, tmp_path):
    """Both start on an empty database, so they also race to create the schema."""
    n = 40
    procs = [_python(WRITER, url, tag, str(n)) for tag in ("a", "b")]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1] for o in outs]
    assert all(len(o[0].split()) == 1 for o in outs)
    rids = {int(o[0]) for o in outs}
    assert len(rids) == 1  # both joined the same unfinished run
    st = Store(url)
    assert len(st.list_profiles("fpa")) == n and len(st.list_profiles("fpb")) == n
    assert len(st.steps(rids.pop())) == 2 * n
    if not url.startswith("sqlite"):
        return
    with sqlite3.connect(tmp_path / "store.db") as c:
        assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


KILLED = """
    import sys
    from sp_plan.planner.profile import Profile
    from sp_plan.profiles.store import Store
    st = Store(sys.argv[1])
    rid, _ = st.start_run("k", {})
    i = 0
    while True:
        st.save_profile(Profile(cluster="k", cluster_fingerprint="fpk", measurements={"i": i, "pad": "y" * 50000}))
        st.record_step(rid, f"s{i}", "ok", {"i": i})
        i += 1
        if i == 5:
            print("ready", flush=True)
"""


def test_killed_writer_leaves_readable_store(tmp_path):
    url = f"sqlite:///{tmp_path}/store.db"
    p = _python(KILLED, url)
    assert p.stdout.readline().strip() == "ready", p.stderr.read()
    time.sleep(0.3)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    st = Store(url)
    profiles = st.list_profiles("fpk")
    assert len(profiles) >= 5 and all(len(x.measurements["pad"]) == 50000 for x in profiles)
    rid, resumed = st.start_run("k", {})
    assert resumed and len(st.steps(rid)) >= 5
    st.save_profile(make_profile())  # and it still takes writes
    with sqlite3.connect(tmp_path / "store.db") as c:
        assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


# ---- resolve_profile

@pytest.fixture
def cluster():
    return load_cluster("dgx-h100", 2)


def test_resolve_latest_matching(cluster, tmp_path):
    st = Store(f"sqlite:///{tmp_path}/s.db")
    p, line = resolve_profile(None, cluster, st)
    assert p is None and "none stored" in line and "sp-plan tune" in line
    old = make_profile(cluster.topology_fingerprint(), created_at="2021-01-01T00:00:00+00:00")
    new = make_profile(cluster.topology_fingerprint())
    st.save_profile(old), st.save_profile(new), st.save_profile(make_profile("1" * 16))
    p, line = resolve_profile(None, cluster, st)
    assert p == new and line == new.line() and new.id in line and "leave-one-out error 4.0%" in line


def test_resolve_refuses_other_fingerprint(cluster, tmp_path):
    st = Store(f"sqlite:///{tmp_path}/s.db")
    other = make_profile("1" * 16)
    st.save_profile(other)
    for spec in (other.id, other):
        p, line = resolve_profile(spec, cluster, st)
        assert p is None
        assert f"profile {other.id} is for topology {'1' * 16}, this cluster's is {cluster.topology_fingerprint()}" in line
    assert resolve_profile(None, cluster, st)[0] is None


def test_resolve_stack(cluster):
    prof = make_profile(cluster.topology_fingerprint(), id="abc123")
    assert resolve_profile(prof, cluster)[0] == prof  # a preset records no stack: not checked
    same = cluster.model_copy(update={"calibration": {"stack": {"torch": "2.13.0", "cuda": "12.8"}}})
    assert resolve_profile(prof, same)[0] == prof  # cuda only on one side: not compared
    diff = cluster.model_copy(update={"calibration": {"stack": {"torch": "2.12.0", "nccl": "2.27.3"}}})
    p, line = resolve_profile(prof, diff)
    assert p is None and "stack" in line and "torch" in line and "2.12.0" in line and "abc123" in line


@pytest.mark.parametrize("key", ["torch", "cuda", "cudnn", "nccl", "attention_backend"])
def test_a_profile_of_another_stack_in_any_key_is_not_applied(cluster, key):
    """Each part of the software stack a profile's figures depend on, the measured attention kernel included."""
    prof = make_profile(cluster.topology_fingerprint(), id="abc123", stack={key: "a"})
    other = cluster.model_copy(update={"calibration": {"stack": {key: "b"}}})
    p, line = resolve_profile(prof, other)
    assert p is None and f"{key}: profile a, this cluster b" in line
    assert resolve_profile(prof, cluster.model_copy(update={"calibration": {"stack": {key: "a"}}}))[0] == prof


def test_the_stamp_names_the_profile_a_plan_uses_after_an_older_one_is_imported(tmp_path):
    """The newest profile of a topology is the one created last, whenever it was stored: the stamp that versions
    cached answers names the profile ``latest_profile`` gives, and moves when that one is deleted."""
    st = Store(f"sqlite:///{tmp_path}/s.db")
    newer = st.save_profile(make_profile(id="newer", created_at="2026-11-02T00:00:00+00:00"))
    older = st.save_profile(make_profile(id="older", created_at="2026-11-01T00:00:00+00:00"))
    assert st.latest_profile("f" * 16).id == newer and st.profile_stamp("f" * 16).startswith(newer + "@")
    st.delete_profile(newer)
    assert st.latest_profile("f" * 16).id == older and st.profile_stamp("f" * 16).startswith(older + "@")


def test_a_profiles_line_counts_the_candidates_that_finished():
    prof = make_profile(candidates=[*make_profile().candidates, MeasuredCandidate(summary="x", plan={}, status="error")])
    assert "1 candidate(s) measured" in prof.line()


def test_params_given_price_a_pure_call_over_a_profiles():
    from sp_plan.planner.profile import pure_params

    prof = make_profile(params=Params(overlap=0.3))
    assert pure_params(prof, Params(overlap=0.9), "sp_plan.plan").overlap == 0.9
    assert pure_params(prof, None, "sp_plan.plan").overlap == 0.3 and pure_params(None, None, "x") is None


def test_resolve_file_id_and_none(cluster, tmp_path):
    st = Store(f"sqlite:///{tmp_path}/s.db")
    prof = make_profile(cluster.topology_fingerprint())
    path = tmp_path / "p.yaml"
    prof.save(path)
    p, line = resolve_profile(str(path), cluster, st)
    assert p == prof and line == prof.line()
    pid = st.save_profile(prof)
    assert resolve_profile(pid, cluster, st) == (prof, prof.line())
    assert resolve_profile(False, cluster, st) == (None, "profile: none (--no-profile)")
    with pytest.raises(PlanError) as e:
        resolve_profile("nosuchid", cluster, st)
    assert e.value.field == "profile"
    with pytest.raises(PlanError) as e:  # a file's suffix in any case names a file, not an id
        resolve_profile(str(tmp_path / "missing.YAML"), cluster, st)
    assert e.value.field == "profile" and "stored profile id" not in e.value.problem
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster_fingerprint: [unclosed\n")
    with pytest.raises(PlanError) as e:
        resolve_profile(str(bad), cluster, st)
    assert e.value.field == "profile" and "not valid YAML" in e.value.problem
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("cluster_fingerprint: abc\nparams: {overlap: 7}\n")
    with pytest.raises(PlanError) as e:
        resolve_profile(str(wrong), cluster, st)
    assert e.value.field == "profile" and "overlap" in e.value.problem


def test_resolve_default_store_absent(cluster, monkeypatch, tmp_path):
    monkeypatch.delenv("SP_PLAN_STORE", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    p, line = resolve_profile(None, cluster)
    assert p is None and "sp-plan tune" in line
    assert not (tmp_path / "xdg" / "sp-plan").exists()  # looking up does not create the default store
    monkeypatch.setenv("SP_PLAN_STORE", f"sqlite:///{tmp_path}/env.db")
    prof = make_profile(cluster.topology_fingerprint())
    Store().save_profile(prof)
    assert resolve_profile(None, cluster)[0] == prof


def test_stored_document_that_does_not_validate(tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    st = Store(url)
    pid = st.save_profile(make_profile())
    eng = sa.create_engine(url)
    with eng.begin() as c:
        c.execute(sa.text("UPDATE profiles SET document = :d"), {"d": '{"cluster_fingerprint": "x", "bogus": 1}'})
    eng.dispose()
    with pytest.raises(PlanError) as e:
        st.get_profile(pid)
    assert e.value.field == "profile.bogus" and "store" in e.value.problem


def test_a_0001_store_is_adopted_and_optuna_shares_the_database(url):
    """A store written before 0002 kept its revision in alembic's default table: reopened, it moves to the
    store's own table and upgrades; optuna's RDB storage then keeps its studies in the same database."""
    import optuna

    st = Store(url)
    pid = st.save_profile(make_profile())
    with st.engine.begin() as conn:  # what sp-plan 0001 left behind
        conn.execute(sa.text("DROP TABLE service_plans"))
        conn.execute(sa.text("DROP TABLE sp_plan_alembic_version"))
        conn.execute(sa.text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)"))
        conn.execute(sa.text("INSERT INTO alembic_version VALUES ('0001')"))
    st.close()
    st = Store(url)
    assert st.revision() == "0002" and st.get_profile(pid).id == pid
    answers = Answers(st)
    answers.save("abc", {"x": 1}, pid)
    assert answers.stored("abc") == {"x": 1} and answers.stored("nope") is None
    study = optuna.create_study(storage=url, study_name="shared", load_if_exists=True)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    st.close()
    again = Store(url)
    assert again.revision() == "0002" and again.healthy()
    assert len(optuna.load_study(study_name="shared", storage=url).trials) == 2


def test_a_database_that_fails_under_an_open_store_raises_store_error(tmp_path):
    """A failure of the database itself (here a table gone) is a StoreError on reads and writes alike; an unknown
    id is NotFound: the service answers them 503 and 404 by their class."""
    url = f"sqlite:///{tmp_path}/store.db"
    st = Store(url)
    pid = st.save_profile(make_profile())
    eng = sa.create_engine(url)
    with eng.begin() as c:
        c.execute(sa.text("DROP TABLE profiles"))
    eng.dispose()
    for call in (lambda: st.get_profile(pid), lambda: st.save_profile(make_profile()), st.list_profiles,
                 lambda: st.profile_stamp("f" * 16)):
        with pytest.raises(StoreError) as e:
            call()
        assert "no such table: profiles" in e.value.problem and e.value.fix
    st.close()


def test_open_retries_a_locked_sqlite_store(tmp_path, monkeypatch):
    """A store another process holds at first open ("database is locked" without the busy handler) is retried."""
    from sqlalchemy import exc as sa_exc

    from sp_plan.profiles import store as store_mod

    real, calls = Store._migrate, []

    def flaky(self):
        calls.append(1)
        if len(calls) < 3:
            raise sa_exc.OperationalError("PRAGMA journal_mode = WAL", {}, Exception("database is locked"))
        return real(self)

    monkeypatch.setattr(Store, "_migrate", flaky)
    st = Store(f"sqlite:///{tmp_path}/s.db")
    assert len(calls) == 3 and st.revision() is not None
    calls.clear()
    monkeypatch.setattr(store_mod, "OPEN_TRIES", 2)
    with pytest.raises(PlanError, match="database is locked"):
        Store(f"sqlite:///{tmp_path}/t.db")
    assert len(calls) == 2


def test_the_newest_profile_is_the_latest_time_whatever_its_offset(tmp_path):
    """Profiles stamped in other time zones rank by the time they name, not by their text; a stamp that is no time is
    refused when the profile is read."""
    st = Store(f"sqlite:///{tmp_path / 's.db'}")
    east = make_profile(created_at="2026-11-21T08:00:00+09:00")  # 2026-11-20 23:00 UTC
    utc = make_profile(created_at="2026-11-20T23:30:00+00:00")  # half an hour later
    day = make_profile(created_at="2026-11-20")  # a date: its midnight, UTC
    for p in (utc, east, day):
        st.save_profile(p)
    assert [p.id for p in st.list_profiles("f" * 16)] == [utc.id, east.id, day.id]
    assert st.latest_profile("f" * 16).id == utc.id
    assert st.get_profile(east.id).created_at == "2026-11-21T08:00:00+09:00"  # the document keeps its own stamp
    with pytest.raises(PlanError) as e:
        make_profile(created_at="yesterday")
    assert e.value.field == "profile.created_at" and "ISO 8601" in e.value.problem


def test_an_activation_factor_no_fit_gives_is_refused_on_import(tmp_path):
    """The fit keeps the activation factor within 0.05-20; a file claiming 1e30 (activations beyond any device) is
    refused with one line naming the field, not stored to break every later plan."""
    doc = make_profile().model_dump(mode="json")
    doc["params"]["activation_factor"] = 1e30
    (tmp_path / "p.yaml").write_text(yaml_dump(doc))
    with pytest.raises(PlanError) as e:
        Profile.load(tmp_path / "p.yaml")
    assert "activation_factor" in e.value.field and "\n" not in str(e.value)


@pytest.mark.parametrize("field, value", [
    ("id", "i" * 65), ("cluster_fingerprint", "f" * 65), ("cluster", "c" * 201),
    ("id", "a\x00b"), ("cluster", "dgx\x00h100"), ("cluster_fingerprint", "ff\x00ff"), ("cluster", "dgx\ud800"),
])
def test_what_a_column_cannot_keep_is_refused_naming_the_field(url, field, value):
    """A value longer than its column or holding NUL (which PostgreSQL's text cannot hold) is PlanError naming the
    profile's field on both backends alike, never a StoreError, and nothing is stored."""
    st = Store(url)
    with pytest.raises(PlanError) as e:
        st.save_profile(make_profile(**{field: value}))
    assert type(e.value) is PlanError and e.value.field == f"profile.{field}", e.value
    assert st.list_profiles() == []
    assert st.save_profile(make_profile(id="i" * 64, cluster="c" * 200, cluster_fingerprint="f" * 64)) == "i" * 64


@pytest.mark.parametrize("lookup", ["i" * 65, "\x00", "abc\x00def", "\ud800abc", None])
def test_an_id_no_profile_can_have_is_not_found(url, lookup):
    """Lookups by an id or fingerprint the columns cannot hold find nothing (NotFound, empty, None), without a
    StoreError from the database."""
    st = Store(url)
    st.save_profile(make_profile(id="abcdef012345"))
    with pytest.raises(NotFound):
        st.get_profile(lookup)
    with pytest.raises(NotFound):
        st.delete_profile(lookup)
    assert not st.has_profile(lookup)
    text = lookup or "\x00"  # a fingerprint of None lists every profile, an id of None asks for the newest
    assert st.list_profiles(text) == [] and st.latest_profile(text) is None
    assert st.profile_stamp(text) is None and st.profile_stamp("f" * 16, text) is None
    assert Answers(st).stored(text) is None
    assert [p.id for p in st.list_profiles()] == ["abcdef012345"]


PRESET_FP = load_cluster("dgx-h100", nodes=2).topology_fingerprint()


@pytest.mark.parametrize("cluster, fp, params, field", [
    ("dgx-h100x2", PRESET_FP, {"matmul": Curve(points=((4096, 2.0),))}, "profile.params.matmul"),
    ("dgx-h100x2", PRESET_FP, {"comm": {"all_to_all/inter": CommFit(efficiency=50)}},
     "profile.params.comm.all_to_all/inter"),
    ("dgx-h100x2", PRESET_FP, {"hbm_bandwidth": 4e12}, "profile.params.hbm_bandwidth"),
    ("my-cluster", "f" * 16, {"attention_fwd": Curve(points=((4096, 1e30),))}, "profile.params.attention_fwd"),
    ("my-cluster", "f" * 16, {"comm": {"all_gather/intra": CommFit(efficiency=5000)}},
     "profile.params.comm.all_gather/intra"),
    ("my-cluster", "f" * 16, {"hbm_bandwidth": 1e30}, "profile.params.hbm_bandwidth"),
])
def test_impossible_figures_are_refused_before_they_are_stored(tmp_path, cluster, fp, params, field):
    """What no cluster makes true is refused for any profile; on the preset the profile names (its fingerprint
    that preset's), what the datasheet refuses at plan time is refused on save; nothing is stored."""
    st = Store(f"sqlite:///{tmp_path}/s.db")
    with pytest.raises(PlanError) as e:
        st.save_profile(make_profile(cluster=cluster, cluster_fingerprint=fp, params=Params(**params)))
    assert e.value.field == field and "\n" not in str(e.value)
    assert st.list_profiles() == []


@pytest.mark.parametrize("cluster, fp", [("my-cluster", "f" * 16), ("dgx-h100x2", "f" * 16), ("cpu-local", None)])
def test_figures_a_placeholder_peak_allows_are_kept(tmp_path, cluster, fp):
    """Twice the peak, 4 TB/s: true of a CPU cluster's placeholder peaks, so kept for a cluster file's profile, one
    whose fingerprint is no preset's, and cpu-local's (no datasheet); a plan on cpu-local uses it."""
    fp = fp or load_cluster(cluster).topology_fingerprint()
    st = Store(f"sqlite:///{tmp_path}/s.db")
    p = make_profile(cluster=cluster, cluster_fingerprint=fp, stack={},
                     params=Params(matmul=Curve(points=((4096, 2.0),)), hbm_bandwidth=4e12,
                                   comm={"all_gather/intra": CommFit(efficiency=20)}))
    assert st.get_profile(st.save_profile(p)) == p
    if cluster == "cpu-local":
        assert resolve_profile(None, load_cluster(cluster), st)[0] == p


def test_a_stored_impossible_hbm_figure_is_refused_when_a_plan_uses_it(tmp_path):
    """A profile stored before its upload was checked: the plan names the figure and the profile to delete."""
    st = Store(f"sqlite:///{tmp_path}/s.db")
    cluster = load_cluster("dgx-h100", nodes=2)
    p = make_profile(cluster="dgx-h100x2", cluster_fingerprint=PRESET_FP, stack={}, params=Params(hbm_bandwidth=4e12))
    with pytest.raises(PlanError) as e:
        resolve_profile(p, cluster, st)
    assert e.value.field == "profile" and "hbm_bandwidth" in e.value.problem and "3.35e+12" in e.value.problem


def test_a_created_at_in_the_future_is_refused(url):
    """A profile dated ahead of now would stay its topology's newest over every later tune: more than a day ahead is
    refused naming profile.created_at; a day's clock skew is kept, and a later tune then becomes the newest."""
    from datetime import datetime, timedelta, timezone

    st = Store(url)
    for created in ("9999-01-01T00:00:00+00:00", (datetime.now(timezone.utc) + timedelta(days=2)).isoformat()):
        with pytest.raises(PlanError) as e:
            st.save_profile(make_profile(created_at=created))
        assert e.value.field == "profile.created_at" and "future" in e.value.problem
    assert st.list_profiles() == []
    skewed = make_profile(created_at=(datetime.now(timezone.utc) + timedelta(hours=2)).isoformat())
    st.save_profile(skewed)
    assert st.latest_profile("f" * 16).id == skewed.id
    later = make_profile(created_at=(datetime.now(timezone.utc) + timedelta(hours=3)).isoformat())
    st.save_profile(later)
    assert st.latest_profile("f" * 16).id == later.id


@pytest.mark.parametrize("id", ["a/b", "../../x", "a\\b", "x.yaml", "X.JSON", "p.yml", "a b", "-x", ".hidden", "i" * 10_000,
                                "vict?x", "ü1"])
def test_an_id_no_command_can_name_is_refused(tmp_path, id):
    """An id is one URL path segment and never a file name: what GET/DELETE /v1/profiles/{id} or `--profile` could
    not name is refused on save, naming profile.id; nothing is stored."""
    st = Store(f"sqlite:///{tmp_path}/s.db")
    with pytest.raises(PlanError) as e:
        st.save_profile(make_profile(id=id))
    assert e.value.field == "profile.id" and "\n" not in str(e.value)
    assert st.list_profiles() == []


@pytest.mark.parametrize("id", ["abc123", "tune-2026.11_h100", "A1", "x.yaml2"])
def test_ids_of_letters_digits_dots_dashes_are_kept(tmp_path, id):
    st = Store(f"sqlite:///{tmp_path}/s.db")
    assert st.get_profile(st.save_profile(make_profile(id=id))).id == id


@pytest.mark.parametrize("fp", ["", "   "])
def test_an_empty_fingerprint_is_refused(tmp_path, fp):
    with pytest.raises(PlanError) as e:
        Store(f"sqlite:///{tmp_path}/s.db").save_profile(make_profile(fp=fp))
    assert e.value.field == "profile.cluster_fingerprint"


def test_a_run_a_live_process_holds_is_not_taken_over(url):
    """A second tune of one key on this host while the first's process lives is refused (both would write one run's
    checkpoints); once that process is gone, the run resumes here and records its new owner."""
    from sp_plan.profiles.tune.owner import owner, running_elsewhere, started

    st = Store(url)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        held = {**owner(), "pid": holder.pid, "started": started(holder.pid)}
        # the pid given again to another process (a restarted container): that run's process is gone
        assert running_elsewhere({"owner": {**held, "started": held["started"] - 1}}) is None
        assert running_elsewhere({"owner": {**held, "boot": "another-boot"}}) is None
        rid, _ = st.start_run("busy-key", {"model": "m", "owner": held})
        with pytest.raises(PlanError) as err:
            st.start_run("busy-key", {"owner": owner()}, busy=running_elsewhere)
        assert err.value.field == "tune" and f"running in process {holder.pid} on this host" in err.value.problem
        assert st.run(rid)["meta"]["owner"]["pid"] == holder.pid
    finally:
        holder.kill()
        holder.wait()
    assert st.start_run("busy-key", {"owner": owner()}, busy=running_elsewhere) == (rid, True)
    assert st.run(rid)["meta"] == {"model": "m", "owner": owner()}
    assert running_elsewhere({"owner": {"host": "elsewhere", "pid": holder.pid}}) is None  # unseen: resumed as before


def test_a_store_names_an_argument_of_the_wrong_type(tmp_path):
    with pytest.raises(StoreError) as e:
        Store(5)
    assert e.value.field == "store" and "no store URL" in e.value.problem
    with pytest.raises(PlanError) as e:
        Store(f"sqlite:///{tmp_path}/s.db").save_profile(None)
    assert e.value.field == "profile" and "no Profile" in e.value.problem


# ---- importing a profile file

def test_importing_the_same_file_again_replaces_its_row_and_keeps_its_created_at(url):
    """A file with an id but no created_at (the store stamps it), and one with neither (a content id): imported
    twice, each is one row under one id, its created_at the first import's, so it does not become the newest."""
    st = Store(url)
    for given in ("hand1", None):
        first = make_profile(id=given)
        pid, taken = st.import_profile(first.model_copy(deep=True))
        assert st.get_profile(pid).created_at  # stamped
        old = "2020-01-01T00:00:00+00:00"  # as if stamped long ago: a fresh stamp would differ
        st.save_profile(make_profile(id=pid, created_at=old))
        again = st.import_profile(first.model_copy(deep=True))
        assert again == (pid, None) and taken is None and (given is None or pid == given)
        assert st.get_profile(pid).created_at == old
    assert len(st.list_profiles("f" * 16)) == 2


def test_an_imported_file_whose_id_holds_another_profile_is_kept_beside_it(url):
    st = Store(url)
    st.import_profile(make_profile(id="same1"))
    pid, taken = st.import_profile(make_profile(id="same1", loo_error_after=0.07))
    assert taken == "same1" and pid != "same1"
    assert st.get_profile("same1").loo_error_after == 0.04 and st.get_profile(pid).loo_error_after == 0.07
    assert st.import_profile(make_profile(id="same1", loo_error_after=0.07)) == (pid, "same1")


def test_two_imports_of_different_profiles_with_one_id_at_once_keep_both(url):
    """The taken-id check and the write are one transaction: two processes importing different profiles under one
    id never both find it free (one would replace the other)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    for k in range(3):
        Store(url).save_profile(make_profile("d" * 16, id=f"other{k}"))
        with ctx.Pool(2) as pool:
            ids = pool.starmap(_import_one, [(url, f"race{k}", 0.04), (url, f"race{k}", 0.05)])
        errors = sorted(Store(url).get_profile(i).loo_error_after for i, _ in ids)
        assert errors == [0.04, 0.05] and sorted(t is None for _, t in ids) == [False, True]


def _import_one(url: str, pid: str, error: float) -> tuple[str, str | None]:
    return Store(url).import_profile(make_profile(id=pid, loo_error_after=error))


def test_a_prefix_of_several_ids_says_so(tmp_path):
    """An id prefix that several stored profiles share is refused as such, not reported as no profile."""
    st = Store(f"sqlite:///{tmp_path}/s.db")
    for pid in ("abcd1", "abcd2"):
        st.save_profile(make_profile(id=pid))
    with pytest.raises(PlanError) as e:
        st.get_profile("abcd")
    assert not isinstance(e.value, NotFound) and "abcd1, abcd2" in e.value.problem and "more of the id" in e.value.fix
    assert st.get_profile("abcd2").id == "abcd2"
    with pytest.raises(NotFound):
        st.get_profile("abce")


def test_a_row_this_sp_plan_cannot_read_is_named_and_the_others_listed(tmp_path):
    """A profile a newer sp-plan wrote into a shared store (schema_version 2) stops the listing only where the
    caller asks for that: `profile list` lists the others and names it, one line with why."""
    from typer.testing import CliRunner

    from sp_plan.cli.app import app

    url = f"sqlite:///{tmp_path}/s.db"
    st = Store(url)
    for pid in ("new1", "old1"):
        st.save_profile(make_profile(id=pid))
    with sqlite3.connect(tmp_path / "s.db") as c:
        doc = json.loads(c.execute("SELECT document FROM profiles WHERE id = 'new1'").fetchone()[0])
        c.execute("UPDATE profiles SET document = ? WHERE id = 'new1'", (json.dumps({**doc, "schema_version": 2}),))
    st.close()
    with pytest.raises(PlanError):
        Store(url).list_profiles()
    bad: list = []
    assert [p.id for p in Store(url).list_profiles(unreadable=bad)] == ["old1"] and [i for i, _ in bad] == ["new1"]
    r = CliRunner().invoke(app, ["profile", "list", "--store", url])
    assert r.exit_code == 0 and "old1" in r.stdout
    assert r.stderr.startswith("profile new1: cannot read it (profile.schema_version: ") and "upgrade" in r.stderr


def test_a_tunes_profile_is_stored_and_its_run_finished_in_one_transaction(tmp_path):
    """A tune killed between storing its profile and finishing its run would resume and store it again: both are
    one transaction, and a run that is not there leaves no profile behind."""
    st = Store(f"sqlite:///{tmp_path}/s.db")
    rid, _ = st.start_run("k", {})
    pid = st.save_profile(make_profile(), finishing=rid)
    assert st.run(rid)["status"] == "done" and st.get_profile(pid).id == pid
    assert st.start_run("k", {})[1] is False  # nothing left to resume
    with pytest.raises(PlanError) as e:
        st.save_profile(make_profile(id="orphan"), finishing=rid + 99)
    assert e.value.field == "run" and not st.has_profile("orphan")


def test_a_stack_read_as_numbers_matches_the_same_figures_as_text():
    """A cluster file's YAML reads ``cudnn: 90100`` as a number; the profile keeps its stack as text."""
    from sp_plan.profiles.resolve import stack_mismatch

    assert stack_mismatch({"cudnn": "90100", "torch": "2.13"}, {"cudnn": 90100, "torch": 2.13}) is None
    assert stack_mismatch({"cudnn": "90100"}, {"cudnn": 90200}) == "cudnn: profile 90100, this cluster 90200"


def test_the_memory_bandwidth_no_profile_can_beat_is_the_fastest_devices(cluster):
    from sp_plan.profiles.resolve import datasheet_hbm

    nt = next(iter(cluster.node_types.values()))
    one_a100 = [nt.devices[0].model_copy(update={"model": "A100-SXM4-80GB"}), *nt.devices[1:]]
    mixed = cluster.model_copy(update={"node_types": {k: v.model_copy(update={"devices": one_a100})
                                                      for k, v in cluster.node_types.items()}})
    assert datasheet_hbm(mixed) == datasheet_hbm(cluster) > 2.1e12  # the H100's 3.35 TB/s, not the A100's 2.04


def test_a_blank_store_url_is_refused_naming_the_store():
    from sp_plan.profiles.resolve import check_store

    for blank in ("", "   "):
        with pytest.raises(StoreError) as e:
            check_store(blank)
        assert e.value.field == "store"
