"""A glance at a SQLite store (profiles/peek.py) answers "none stored" only where the Store would, and nothing else."""
from __future__ import annotations

import sqlite3

from alembic.config import Config
from alembic.script import ScriptDirectory

from sp_plan.profiles import load_cluster
from sp_plan.profiles.peek import HEAD_REVISION, none_stored, sqlite_path
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
    the glance cannot tell, and the Store returns it."""
    cluster = load_cluster("dgx-h100", nodes=2)
    fp = cluster.topology_fingerprint()
    url = f"sqlite:///{tmp_path}/s.db"
    assert none_stored(url, fp) is None  # a missing file that is not the default store: the Store creates it
    st = Store(url)
    line = none_stored(url, fp)
    assert line is not None and line == resolve_profile(None, cluster, st)[1].removeprefix("profile: ")
    st.save_profile(make_profile("0" * 16))
    assert none_stored(url, fp) == line
    prof = make_profile(fp)
    st.save_profile(prof)
    assert none_stored(url, fp) is None
    assert resolve_params(cluster, None, url)[2] == prof


def test_glance_defers_where_it_cannot_tell(tmp_path):
    """Another schema revision, a legacy version table, a file that is no database: the Store answers."""
    cluster = load_cluster("dgx-h100", nodes=2)
    fp = cluster.topology_fingerprint()
    url = f"sqlite:///{tmp_path}/s.db"
    Store(url).close()
    with sqlite3.connect(tmp_path / "s.db") as conn:
        conn.execute(f"UPDATE {VERSION_TABLE} SET version_num = '0001'")
    assert none_stored(url, fp) is None
    with sqlite3.connect(tmp_path / "s.db") as conn:
        conn.execute(f"DROP TABLE {VERSION_TABLE}")
    assert none_stored(url, fp) is None
    (tmp_path / "junk.db").write_text("not a database\n")
    assert none_stored(f"sqlite:///{tmp_path}/junk.db", fp) is None


def test_glance_neither_writes_nor_creates(tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    Store(url).close()
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    assert none_stored(url, "f" * 16) is not None
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before
    assert none_stored(f"sqlite:///{tmp_path}/absent.db", "f" * 16) is None
    assert not (tmp_path / "absent.db").exists()
