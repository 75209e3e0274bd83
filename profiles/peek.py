"""Where the store is, and the cluster's newest profile read from it without SQLAlchemy where that can be done.

A plan's default lookup asks the store for the cluster's newest profile. Opening a ``Store`` imports SQLAlchemy and
alembic (about 0.2 s, as long as the search at 1,024 GPUs). So a SQLite store at this sp-plan's schema head is read
with the standard library's sqlite3: one SELECT of the newest profile's document, on a file it does not create
(``mode=rw``, so that closing it removes the WAL's side files as the Store's connections do). Where that cannot
tell (a server database, another schema revision, a file it cannot read) the ``Store`` answers.
"""
from __future__ import annotations

import json
import os
import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

ENV_VAR = "SP_PLAN_STORE"
#: alembic's version table for the store; optuna keeps its own ``alembic_version`` in the same database
VERSION_TABLE = "sp_plan_alembic_version"
#: the newest revision under profiles/migrations/versions (a test holds it to alembic's own head)
HEAD_REVISION = "0002"
SQLITE_PREFIX = "sqlite:///"
TUNE = "; make one with `sp-plan tune`"
#: ``Store.latest_profile``'s query
NEWEST = "SELECT document FROM profiles WHERE fingerprint = ? ORDER BY created_at DESC, stored_at DESC LIMIT 1"


def default_store_url() -> str:
    """The default store: ``store.db`` (SQLite) in the user data directory."""
    import platformdirs  # noqa: PLC0415

    return f"{SQLITE_PREFIX}{platformdirs.user_data_path('sp-plan') / 'store.db'}"


def store_url(url: str | None = None) -> str:
    """The URL a ``Store(url)`` opens: ``url``, else ``$SP_PLAN_STORE``, else ``default_store_url()``."""
    return url or os.environ.get(ENV_VAR) or default_store_url()


def sqlite_path(url: str) -> Path | None:
    """The file of a plain ``sqlite:///PATH`` URL; None for any other URL (a server, a driver, a query, a URI)."""
    path = url.removeprefix(SQLITE_PREFIX)
    if path == url or not path or "?" in path or path.startswith(("file:", ":memory:")):
        return None
    return Path(path)


@dataclass(frozen=True)
class Glance:
    """What a glance at a store found for a topology: its newest profile's document (None: none stored) and the
    line that says so."""

    document: dict | None
    line: str = ""


def glance(url: str, fingerprint: str) -> Glance | None:
    """The newest profile of ``fingerprint`` in the store at ``url`` (``Store.latest_profile``'s order), read without
    SQLAlchemy where a read shows it: the default store's file is absent, or a SQLite store is at ``HEAD_REVISION``.
    None where it cannot tell; the ``Store`` then answers (and migrates, creates or refuses as it does)."""
    path = sqlite_path(url)
    if path is None:
        return None
    if not path.exists():
        return Glance(None, f"none stored for topology {fingerprint}{TUNE}") if url == default_store_url() else None
    try:
        with closing(sqlite3.connect(f"file:{quote(str(path))}?mode=rw", uri=True, timeout=5)) as conn:
            if conn.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchall() != [(HEAD_REVISION,)]:
                return None
            row = conn.execute(NEWEST, (fingerprint,)).fetchone()
    except sqlite3.Error:
        return None
    if row is None:
        return Glance(None, f"none stored for topology {fingerprint} in {url}{TUNE}")
    try:
        return Glance(json.loads(row[0]))
    except ValueError:  # not the JSON the Store writes: the Store says what is wrong with it
        return None
