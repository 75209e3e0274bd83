"""A glance at a SQLite store (profiles/peek.py) finds what the Store would, or defers to it."""
from __future__ import annotations

import sqlite3

from alembic.config import Config
from alembic.script import ScriptDirectory

from sp_plan.planner.profile import Profile
from sp_plan.profiles import load_cluster
from sp_plan.profiles.peek import HEAD_REVISION, glance, sqlite_path
from sp_plan.profiles.resolve import resolve_params
from sp_plan.profiles.store import MIGRATIONS, VERSION_TABLE, Store, resolve_profile
from test_store import make_profile


def test_head_revision_is_alembics_head():
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    assert ScriptDirectory.from_config(cfg).get_current_head() == HEAD_REVISION


def test_sqlite_path_reads_plain_files_only(tmp_path):
    assert sqlite_path(f"sqlite:///{tmp_path}/s.db") == tmp_path / "s.db"
    assert sqlite_path("sqlite:///rel.db").name == "rel.db"
    for url in ("postgresql+psycopg://u@h/db", "sqlite+pysqlite:///x.db", "sqlite:///file:x.db?mode=ro&uri=true",
                "sqlite:///x.db?timeout=3", "sqlite:///:memory:", "sqlite://"):
        assert sqlite_path(url) is None, url


def test_glance_agrees_with_the_store(tmp_path):
    """Empty at head: none, with the Store's own line; a profile of another topology: still none; of this one:
    the newest, as the Store returns it."""
    cluster = load_cluster("dgx-h100", nodes=2)
    fp = cluster.topology_fingerprint()
    url = f"sqlite:///{tmp_path}/s.db"
    assert glance(url, fp) is None  # a missing file that is not the default store: the Store creates it
    st = Store(url)
    seen = glance(url, fp)
    assert seen.document is None and seen.line == resolve_profile(None, cluster, st)[1].removeprefix("profile: ")
    st.save_profile(make_profile("0" * 16))
    assert glance(url, fp) == seen
    older, newer = (make_profile(fp, created_at=t) for t in ("2026-01-01T00:00:00+00:00", "2026-02-01T00:00:00+00:00"))
    st.save_profile(newer)
    st.save_profile(older)
    assert st.latest_profile(fp) == newer
    assert Profile.model_validate(glance(url, fp).document) == newer
    assert resolve_params(cluster, None, url)[2] == newer == resolve_profile(None, cluster, st)[0]


def test_glance_defers_where_it_cannot_tell(tmp_path):
    """Another schema revision, a legacy version table, a file that is no database: the Store answers."""
    cluster = load_cluster("dgx-h100", nodes=2)
    fp = cluster.topology_fingerprint()
    url = f"sqlite:///{tmp_path}/s.db"
    Store(url).close()
    with sqlite3.connect(tmp_path / "s.db") as conn:
        conn.execute(f"UPDATE {VERSION_TABLE} SET version_num = '0001'")
    assert glance(url, fp) is None
    with sqlite3.connect(tmp_path / "s.db") as conn:
        conn.execute(f"DROP TABLE {VERSION_TABLE}")
    assert glance(url, fp) is None
    (tmp_path / "junk.db").write_text("not a database\n")
    assert glance(f"sqlite:///{tmp_path}/junk.db", fp) is None


def test_glance_neither_writes_nor_creates(tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    Store(url).close()
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    assert glance(url, "f" * 16).document is None
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before
    assert glance(f"sqlite:///{tmp_path}/absent.db", "f" * 16) is None
    assert not (tmp_path / "absent.db").exists()
