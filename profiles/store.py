"""The profile store: profiles, link fits and tune checkpoints in one SQLAlchemy database.

``Database`` opens the database and keeps its schema (one alembic history for every table in it); ``Store`` holds
the profiles, link fits and tune checkpoints. The service keeps its answers in the same database through its own
object (service/answers.py). Failures of the database raise ``StoreError``, unknown profiles ``NotFound``.

SQLite in the user data directory by default, any SQLAlchemy URL (PostgreSQL included) through
``--store URL`` or ``SP_PLAN_STORE``. The schema is kept by alembic (profiles/migrations/), upgraded
on open; a database written by a newer sp-plan is refused. Every write is one transaction: SQLite
runs in WAL mode with a busy timeout and takes its write lock at BEGIN, PostgreSQL serializes the
few read-then-write steps with advisory locks, so a killed process loses at most its write in flight
and concurrent writers corrupt nothing. No module state: pass the ``Store`` where it is needed.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import time
import weakref
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql as sa_pg, sqlite as sa_sqlite

from sp_plan.planner.errors import NotFound, PlanError, StoreError, of_type
from sp_plan.planner.cluster import preset_nodes
from sp_plan.planner.plausible import check_bounds, check_hbm, check_params
from sp_plan.planner.profile import Profile, created_utc
from sp_plan.planner.yamlio import FILE_SUFFIXES, model_from_data
from sp_plan.profiles import MAX_NODES, cluster_presets, preset_cluster
from sp_plan.profiles.peek import (  # noqa: F401 - the store's names, defined where a glance needs no SQLAlchemy
    ENV_VAR, VERSION_TABLE, default_store_url, sqlite_path, store_url)
from sp_plan.profiles.resolve import datasheet_hbm, resolve_profile, stack_mismatch  # noqa: F401 - as above

MIGRATIONS = Path(__file__).parent / "migrations"
#: opens of a busy SQLite store before giving up (Store._open)
OPEN_TRIES = 6
#: the characters of a profile id: the store's own ids are hex; none holds '/', '\\' or a character a URL escapes
ID_CHARS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
#: how far ahead of this machine's clock a created_at may be (another machine's clock, its time zone written wrong)
FUTURE_SLACK = timedelta(days=1)
STORE_FIX = ("check that the database server is up and reachable (or the SQLite file's directory exists and is "
             f"writable), or pass another --store URL / set {ENV_VAR}")

_meta = sa.MetaData()
profiles_t = sa.Table(
    "profiles", _meta,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("cluster", sa.String(200), nullable=False),
    sa.Column("fingerprint", sa.String(64), nullable=False),
    sa.Column("stack", sa.JSON, nullable=False),
    sa.Column("created_at", sa.String(40), nullable=False),
    sa.Column("stored_at", sa.String(40), nullable=False),
    sa.Column("schema_version", sa.Integer, nullable=False),
    sa.Column("candidates_ok", sa.Integer, nullable=False),
    sa.Column("candidates_total", sa.Integer, nullable=False),
    sa.Column("loo_error_before", sa.Float),
    sa.Column("loo_error_after", sa.Float),
    sa.Column("document", sa.JSON, nullable=False),
)
link_fits_t = sa.Table(
    "link_fits", _meta,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("fingerprint", sa.String(64), nullable=False),
    sa.Column("links", sa.JSON, nullable=False),
    sa.Column("created_at", sa.String(40), nullable=False),
)
runs_t = sa.Table(
    "tune_runs", _meta,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("key", sa.String(128), nullable=False),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("meta", sa.JSON, nullable=False),
    sa.Column("created_at", sa.String(40), nullable=False),
    sa.Column("updated_at", sa.String(40), nullable=False),
)
steps_t = sa.Table(
    "tune_steps", _meta,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.Integer, sa.ForeignKey("tune_runs.id", ondelete="CASCADE"), nullable=False),
    sa.Column("name", sa.String(1000), nullable=False),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("payload", sa.JSON, nullable=False),
    sa.Column("updated_at", sa.String(40), nullable=False),
    sa.UniqueConstraint("run_id", "name", name="uq_tune_steps_run_name"),
)


# The stamp queries, built once: the service runs one per cached answer, and building the statement and its
# cache key each time cost ~3x the query itself (about 70 of 105 us on SQLite).
_STAMP_BY_ID = sa.select(profiles_t.c.id, profiles_t.c.stored_at).where(profiles_t.c.id == sa.bindparam("id"))
#: a fingerprint's profiles, newest first: the one created last (a profile imported later may be older)
NEWEST_FIRST = (profiles_t.c.created_at.desc(), profiles_t.c.stored_at.desc())
_STAMP_NEWEST = (sa.select(profiles_t.c.id, profiles_t.c.stored_at)
                 .where(profiles_t.c.fingerprint == sa.bindparam("fp")).order_by(*NEWEST_FIRST).limit(1))


def bad_char(text: str) -> str | None:
    """The first character of ``text`` a store column must not hold, else None: one that is not printable, such as a
    control character (PostgreSQL's text cannot hold NUL at all) or a lone surrogate (no UTF-8 encoding)."""
    return next((c for c in text if not c.isprintable()), None)


def storable(text: object, column: sa.Column) -> bool:
    """Whether ``text`` can be a value of the string ``column``: a str of at most its length, no bad_char. A
    lookup by anything else finds nothing, without asking the database (which would fail on it, not answer)."""
    return isinstance(text, str) and len(text) <= column.type.length and bad_char(text) is None


def check_text(text: str, column: sa.Column, field: str) -> None:
    """PlanError(field) unless ``text`` fits ``column`` (storable): refused as input, never truncated, and never a
    StoreError, which would read as an outage."""
    limit = column.type.length
    if len(text) > limit:
        raise PlanError(field, f"{len(text):,} characters, more than the store keeps (at most {limit})",
                        f"shorten it to {limit} characters or fewer")
    c = bad_char(text)
    if c is not None:
        raise PlanError(field, f"{text[:40]!r} holds {c!r} (U+{ord(c):04X}), which the store cannot keep",
                        "use printable characters only")


def check_id(id: str) -> None:
    """PlanError(profile.id) unless every command and endpoint can name ``id``: it fits its column (check_text), is
    ID_CHARS (as one URL path segment, never read as a path) and has no file suffix (`--profile x.yaml` reads a file)."""
    check_text(id, profiles_t.c.id, "profile.id")
    fix = ("use letters, digits, '.', '_' and '-', starting with a letter or digit, without a file suffix; or leave "
           "id out (the store assigns one)")
    if not ID_CHARS.fullmatch(id):
        raise PlanError("profile.id", f"{id!r} is not an id sp-plan can look up", fix)
    if Path(id).suffix.lower() in FILE_SUFFIXES:
        raise PlanError("profile.id", f"{id!r} ends like a file name, which `--profile` reads as a file", fix)


def check_columns(profile: Profile) -> None:
    """The profile's id, cluster and fingerprint fit the store's columns (check_text) and can be looked up (check_id;
    a fingerprint is not empty), on every backend alike."""
    if profile.id:
        check_id(profile.id)
    check_text(profile.cluster, profiles_t.c.cluster, "profile.cluster")
    check_text(profile.cluster_fingerprint, profiles_t.c.fingerprint, "profile.cluster_fingerprint")
    if not profile.cluster_fingerprint.strip():
        raise PlanError("profile.cluster_fingerprint", "is empty: the profile would apply to no cluster",
                        "write the topology fingerprint of the cluster it was tuned on (`sp-plan plan` prints it)")


def preset_of(profile: Profile):
    """The preset cluster a profile was tuned on (its ``cluster`` a preset's name such as ``dgx-h100x2``, and its
    fingerprint that preset's), or None: a cluster file's profile, checked when a plan uses it."""
    node, nodes = preset_nodes(profile.cluster)
    if node not in cluster_presets() or not 1 <= nodes <= MAX_NODES:
        return None
    cluster = preset_cluster(node, nodes)
    return cluster if cluster.topology_fingerprint() == profile.cluster_fingerprint else None


def check_plausible(profile: Profile) -> None:
    """Impossible figures refused before a profile is stored (PlanError naming profile.params.FIELD): what no
    cluster makes true (check_bounds) always, and on the preset it was tuned on, what check_params and the device's
    memory datasheet refuse when a plan uses it; a stored impossible profile would fail every plan of its topology."""
    check_bounds(profile.params)
    cluster = preset_of(profile)
    if cluster is not None:
        check_params(profile.params, cluster)
        check_hbm(profile.params, datasheet_hbm(cluster))


def check_created(profile: Profile) -> None:
    """PlanError(profile.created_at) for a time more than FUTURE_SLACK ahead of now: the store's newest profile of a
    topology is the latest created_at, so a future one would stay the default for good, over every later tune."""
    if not profile.created_at:
        return
    created = datetime.fromisoformat(created_utc(profile.created_at))
    if created > datetime.now(timezone.utc) + FUTURE_SLACK:
        raise PlanError("profile.created_at", f"{profile.created_at} is in the future",
                        "write the time the profile was tuned, or leave created_at out (the store stamps it)")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def redact(url: str) -> str:
    """The URL with any password hidden, for messages."""
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except sa_exc.ArgumentError:
        return url


def _first_line(e: BaseException) -> str:
    text = str(getattr(e, "orig", None) or e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _lock_key(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big", signed=True)


class Database:
    """One SQLAlchemy database at this sp-plan's alembic head: opened (and migrated) once, then transactions whose
    failures raise StoreError (see the module docstring)."""

    def __init__(self, url: str | None = None, existing: bool = False):
        #: where the URL came from, named in errors: the caller's (``store``, the CLI's --store) or the environment's
        self.source = ENV_VAR if url is None and os.environ.get(ENV_VAR) else "store"
        if url is not None and not isinstance(url, str):
            raise StoreError("store", f"{type(url).__name__} is no store URL", "give a SQLAlchemy URL such as "
                             "sqlite:////path/store.db, or None for $SP_PLAN_STORE or the default store")
        if url is not None and not url.strip():
            raise StoreError("store", "the store URL is empty", "give a SQLAlchemy URL such as "
                             "sqlite:////path/store.db, or leave --store out for $SP_PLAN_STORE or the default store")
        self.url = store_url(url)
        self.shown = redact(self.url)
        self._reader: sa.Engine | None = None
        self._check_not_folder()
        if existing and (url is not None or os.environ.get(ENV_VAR)):
            self._check_exists()
        try:
            self.engine = self._engine(self.url, default=url is None and not os.environ.get(ENV_VAR))
            # closed when the store goes or the process exits (atexit, which the CLI's fast exit runs too): SQLite
            # moves its write-ahead log into the .db file only when the last connection closes, so a store file
            # copied after a command holds what the command wrote
            weakref.finalize(self, self.engine.dispose)
            self._open()
        except PlanError as e:
            raise StoreError(self.source, e.problem, e.fix) from None
        except (sa_exc.ArgumentError, ValueError) as e:
            raise StoreError(self.source, f"cannot open store {self.shown} ({_first_line(e)})",
                             "give a SQLAlchemy URL such as sqlite:////path/store.db or "
                             "postgresql+psycopg://user@host/db") from None
        except ImportError as e:
            raise StoreError(self.source, f"cannot open store {self.shown} (no database driver: {_first_line(e)})",
                             "install it, for PostgreSQL: pip install 'sp-plan[postgres]'") from None
        except (sa_exc.SQLAlchemyError, OSError) as e:
            text = _first_line(e)
            fix = (f"pass the URL of an sp-plan store (a SQLite file sp-plan wrote, or a new file) instead of "
                   f"{self.shown}" if "not a database" in text else
                   "the SQLite file is damaged: restore it from a copy, or pass another --store" if "malformed" in text
                   else STORE_FIX)
            raise StoreError(self.source, f"cannot open store {self.shown} ({text})", fix) from None

    # ---- opening
    def _check_not_folder(self) -> None:
        """A SQLite URL names a file: a folder there is refused with the URL of a file in it (SQLite says only
        that it is unable to open the database file)."""
        path = sqlite_path(self.url)
        if path is not None and path.is_dir():
            raise StoreError(self.source, f"{self.shown} names the folder {path}, not a file",
                             f"name a file in it, e.g. sqlite:///{path / 'store.db'}")

    def _check_exists(self) -> None:
        """A SQLite file named by --store or $SP_PLAN_STORE exists: a command that only reads (``existing``) makes no
        store of a mistyped path and does not report it as empty."""
        try:
            u = sa.engine.make_url(self.url)
        except sa_exc.ArgumentError:
            return  # __init__ names the bad URL
        path = u.database or ""
        if u.get_backend_name() == "sqlite" and path and not path.startswith("file:") and path != ":memory:" \
                and not Path(path).exists():
            raise StoreError(self.source, f"no store at {self.shown}: {path} does not exist",
                             "check the path (a store is made by `sp-plan tune` or `sp-plan profile import`)")

    @staticmethod
    def _engine(url: str, default: bool) -> sa.Engine:
        u = sa.engine.make_url(url)
        if u.get_backend_name() != "sqlite":
            args = {"connect_timeout": 10} if u.get_driver_name() in ("psycopg", "psycopg2") else {}
            return sa.create_engine(u, pool_pre_ping=True, connect_args=args)
        path = u.database or ""
        if not path or path == ":memory:" or "mode=memory" in str(u):
            raise StoreError("store", f"{url} is an in-memory SQLite database: a profile stored there is gone when "
                             "the process ends", "give a file, e.g. sqlite:////path/store.db")
        if not path.startswith("file:"):
            if default:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            elif not Path(path).parent.is_dir():
                raise StoreError("store", f"cannot open store {url}: directory {Path(path).parent} does not exist",
                                 "create the directory or pass another --store URL")
        engine = sa.create_engine(u, connect_args={"timeout": 30})

        @sa.event.listens_for(engine, "connect")
        def _connect(dbapi_conn, _record):  # pysqlite: let SQLAlchemy's BEGIN below govern transactions
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA busy_timeout = 30000")
            if path and path != ":memory:":
                cur.execute("PRAGMA journal_mode = WAL")
            cur.execute("PRAGMA synchronous = FULL")
            cur.execute("PRAGMA foreign_keys = ON")
            cur.close()

        @sa.event.listens_for(engine, "begin")
        def _begin(conn):  # take the write lock up front: no deadlocked lock upgrades between writers
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine

    def _open(self) -> None:
        """Migrate, retrying a SQLite store a few times while another process holds it: SQLite returns
        SQLITE_BUSY without calling the busy handler where waiting could deadlock (a reader upgrading to a writer,
        WAL recovery on first open; sqlite.org/c3ref/busy_handler.html), so two processes creating one store at
        once may see "database is locked" before the 30 s timeout."""
        for attempt in range(OPEN_TRIES):
            try:
                return self._migrate()
            except sa_exc.OperationalError as e:
                busy = self.engine.dialect.name == "sqlite" and ("locked" in str(e) or "busy" in str(e))
                if not busy or attempt == OPEN_TRIES - 1:
                    raise
                self.engine.dispose()
                time.sleep(0.05 * 2 ** attempt + random.random() * 0.05)

    def _script(self):
        from alembic.script import ScriptDirectory  # noqa: PLC0415
        from alembic.config import Config  # noqa: PLC0415

        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        return cfg, ScriptDirectory.from_config(cfg)

    def _check_revision(self, current: str | None, script) -> None:
        if current is None:
            return
        known = {r.revision for r in script.walk_revisions()}
        if current not in known:
            raise StoreError("store", f"store {self.shown} has schema revision {current!r}, newer than this sp-plan "
                             f"knows (up to {script.get_current_head()!r})",
                             "upgrade sp-plan (pip install -U sp-plan) or pass another --store URL")

    def _migrate(self) -> None:
        """Bring the schema to alembic head (refusing a newer one); concurrent openers take turns."""
        from alembic import command  # noqa: PLC0415
        from alembic.runtime.migration import MigrationContext  # noqa: PLC0415

        cfg, script = self._script()
        head = script.get_current_head()
        with self.engine.connect() as conn:
            current = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()
            conn.rollback()
        self._check_revision(current, script)
        if current == head:
            return
        with self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _lock_key("sp-plan store migrate")})
            current = self._adopt_legacy_version(conn, script)
            self._check_revision(current, script)
            if current != head:
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")

    @staticmethod
    def _adopt_legacy_version(conn: sa.Connection, script) -> str | None:
        """The store's revision; a store of 0001 kept it in alembic's default table (which optuna's storage
        needs for itself): move it into VERSION_TABLE, in the migration's transaction."""
        from alembic.runtime.migration import MigrationContext  # noqa: PLC0415

        ours = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        current = ours.get_current_revision()
        if current is not None or not sa.inspect(conn).has_table("alembic_version"):
            return current
        legacy = MigrationContext.configure(conn).get_current_revision()
        if legacy not in {r.revision for r in script.walk_revisions()}:
            return current  # optuna's (or another tool's) version table: not ours
        ours.stamp(script, legacy)
        conn.execute(sa.text("DELETE FROM alembic_version"))
        return legacy

    def revision(self) -> str | None:
        """The alembic revision the database is at."""
        from alembic.runtime.migration import MigrationContext  # noqa: PLC0415

        with self.transaction() as conn:
            return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()

    @contextmanager
    def transaction(self) -> Iterator[sa.Connection]:
        """One transaction; database errors raise StoreError."""
        try:
            with self.engine.begin() as conn:
                yield conn
        except sa_exc.SQLAlchemyError as e:
            raise StoreError("store", f"store {self.shown} failed ({_first_line(e)})", STORE_FIX) from None
        except json.JSONDecodeError as e:
            raise self._damaged(e) from None

    @contextmanager
    def reading(self) -> Iterator[sa.Connection]:
        """A connection for reads that need no transaction. SQLite: its own engine without BEGIN IMMEDIATE, so
        readers never queue for the write lock (each statement is atomic on its own); else as transaction()."""
        if self.engine.dialect.name != "sqlite":
            with self.transaction() as conn:
                yield conn
            return
        if self._reader is None:
            self._reader = sa.create_engine(self.engine.url, connect_args={"timeout": 30})
            weakref.finalize(self, self._reader.dispose)

            @sa.event.listens_for(self._reader, "connect")
            def _connect(dbapi_conn, _record):  # autocommit: no BEGIN at all
                dbapi_conn.isolation_level = None
                dbapi_conn.execute("PRAGMA busy_timeout = 30000")
        try:
            with self._reader.connect() as conn:
                yield conn
        except sa_exc.SQLAlchemyError as e:
            raise StoreError("store", f"store {self.shown} failed ({_first_line(e)})", STORE_FIX) from None
        except json.JSONDecodeError as e:
            raise self._damaged(e) from None

    def _damaged(self, e: json.JSONDecodeError) -> StoreError:
        """A stored document the JSON column cannot decode: written by no sp-plan (a damaged file or a hand edit);
        the database's own driver raises it while reading rows, outside SQLAlchemy's errors."""
        return StoreError("store", f"store {self.shown} holds a document that is not JSON ({e.msg}, character "
                          f"{e.pos})", "restore the store from a copy, or delete the damaged row with the database's "
                          "own tools")

    def healthy(self) -> bool:
        """True when the database answers and its schema is the one this sp-plan writes."""
        try:
            _, script = self._script()
            return self.revision() == script.get_current_head()
        except Exception:  # noqa: BLE001 - a health check answers, it does not raise
            return False

    def close(self) -> None:
        """Release the connection pool."""
        self.engine.dispose()
        if self._reader is not None:
            self._reader.dispose()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.shown!r})"


class Store(Database):
    """Profiles, link fits and tune checkpoints in one database (see the module docstring)."""

    # ---- profiles
    def save_profile(self, profile: Profile, finishing: int | None = None) -> str:
        """Store (or replace, same id) a profile; assigns ``id`` and ``created_at`` when missing; returns the id.
        A profile the store cannot keep as given (check_columns), created in the future (check_created) or with
        impossible figures (check_plausible) is PlanError naming the field. ``finishing``: the tune run that made
        it, marked done in the same transaction (a tune killed between the two would store it again on resume)."""
        _check_storable(profile)
        if not profile.id:
            profile.id = content_id(profile)
        with self.transaction() as conn:
            self._write_profile(conn, profile)
            if finishing is not None and not conn.execute(runs_t.update().where(runs_t.c.id == finishing)
                                                          .values(status="done", updated_at=_now())).rowcount:
                raise PlanError("run", f"no tune run {finishing} in store {self.shown}", "pass a run id from start_run")
        return profile.id

    def import_profile(self, profile: Profile) -> tuple[str, str | None]:
        """Store a profile file's profile: (its id, the file's id where another profile holds that, else None). The
        file's id is kept unless the store holds a different profile under it (then a content id: both kept); the
        same profile again replaces its row, its stored ``created_at`` kept where the file has none. The check and
        the write are one transaction, so two imports at once never both take one id."""
        _check_storable(profile)
        with self.transaction() as conn:
            if conn.engine.dialect.name == "postgresql":  # SQLite's BEGIN IMMEDIATE already serializes writers
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _lock_key("import profile")})
            taken = self._place(conn, profile)
            self._write_profile(conn, profile)
        return profile.id, taken

    @staticmethod
    def _place(conn: sa.Connection, profile: Profile) -> str | None:
        """Give ``profile`` the id it is stored under (``import_profile``); the file's id where another profile
        holds it, else None. A stored ``created_at`` fills one the file lacks, so the same file matches its row."""
        own, taken = profile.created_at, None
        for _ in range(2):  # the file's id, then (taken) its content id, which a different profile cannot hold
            profile.id = profile.id or content_id(profile)
            stored = conn.execute(sa.select(profiles_t.c.document).where(profiles_t.c.id == profile.id)).scalar()
            if stored is None:
                return taken
            profile.created_at = own or stored.get("created_at")
            if stored == profile.model_dump(mode="json"):
                return taken
            taken, profile.id, profile.created_at = taken or profile.id, None, own
        raise StoreError("profile", f"the ids {taken} and {content_id(profile)} both hold other profiles",
                         "give the file an id of its own (`id:`)")

    def _write_profile(self, conn: sa.Connection, profile: Profile) -> None:
        """Insert (or replace, same id) ``profile`` in ``conn``'s transaction, stamping a missing ``created_at``."""
        if not profile.created_at:
            profile.created_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        row = {"id": profile.id, "cluster": profile.cluster, "fingerprint": profile.cluster_fingerprint,
               "stack": dict(profile.stack), "created_at": created_utc(profile.created_at), "stored_at": _now(),
               "schema_version": profile.schema_version,
               "candidates_ok": sum(1 for c in profile.candidates if c.status == "ok"),
               "candidates_total": len(profile.candidates), "loo_error_before": profile.loo_error_before,
               "loo_error_after": profile.loo_error_after, "document": profile.model_dump(mode="json")}
        conn.execute(profiles_t.delete().where(profiles_t.c.id == profile.id))
        conn.execute(profiles_t.insert().values(**row))

    def _resolve_id(self, conn: sa.Connection, id: str) -> str | None:
        if not storable(id, profiles_t.c.id):
            return None
        if conn.execute(sa.select(profiles_t.c.id).where(profiles_t.c.id == id)).first():
            return id
        if len(id) >= 4:  # a unique prefix, like git
            # LIKE finds the candidates by the id's index; SQLite's LIKE ignores ASCII case, so the prefix is also
            # compared exactly: an id matches by its characters on every backend
            ids = conn.execute(sa.select(profiles_t.c.id).where(profiles_t.c.id.startswith(id, autoescape=True))
                               .where(sa.func.substr(profiles_t.c.id, 1, len(id)) == id).limit(4)).scalars().all()
            if len(ids) == 1:
                return ids[0]
            if ids:
                shown = ", ".join(sorted(ids)[:3]) + (", ..." if len(ids) > 3 else "")
                raise PlanError("profile", f"{id!r} is the prefix of several stored profiles ({shown})",
                                "give more of the id")
        return None

    def _profile(self, doc: dict) -> Profile:
        return model_from_data(Profile, doc, "profile", f"store {self.shown}")

    def _unknown(self, id: str) -> NotFound:
        return NotFound("profile", f"no profile {id!r} in store {self.shown}",
                         f"see the stored ids with `sp-plan profile list{'' if self.url == default_store_url() else ' --store ' + self.shown}`")

    def has_profile(self, id: str) -> bool:
        """Whether a profile with exactly this id is stored."""
        if not storable(id, profiles_t.c.id):
            return False
        with self.transaction() as conn:
            return conn.execute(sa.select(profiles_t.c.id).where(profiles_t.c.id == id)).first() is not None

    def get_profile(self, id: str) -> Profile:
        """The stored profile with this id (or a unique prefix of at least 4 characters)."""
        with self.transaction() as conn:
            real = self._resolve_id(conn, id)
            doc = real and conn.execute(sa.select(profiles_t.c.document).where(profiles_t.c.id == real)).scalar()
        if doc is None:
            raise self._unknown(id)
        return self._profile(doc)

    def list_profiles(self, fingerprint: str | None = None, unreadable: list | None = None) -> list[Profile]:
        """Stored profiles, newest first, optionally only those of one topology fingerprint. A row this sp-plan cannot
        read (written by a newer one into a shared store) raises its PlanError; with ``unreadable`` (a list) it is
        appended there as (id, PlanError) and the others are listed."""
        q = sa.select(profiles_t.c.id, profiles_t.c.document).order_by(*NEWEST_FIRST)
        if fingerprint is not None:
            if not storable(fingerprint, profiles_t.c.fingerprint):
                return []
            q = q.where(profiles_t.c.fingerprint == fingerprint)
        with self.transaction() as conn:
            rows = conn.execute(q).all()
        out = []
        for pid, doc in rows:
            try:
                out.append(self._profile(doc))
            except PlanError as e:
                if unreadable is None:
                    raise
                unreadable.append((pid, e))
        return out

    def latest_profile(self, fingerprint: str) -> Profile | None:
        """The newest profile of this topology fingerprint, or None."""
        if not storable(fingerprint, profiles_t.c.fingerprint):
            return None
        q = (sa.select(profiles_t.c.document).where(profiles_t.c.fingerprint == fingerprint)
             .order_by(*NEWEST_FIRST).limit(1))
        with self.transaction() as conn:
            doc = conn.execute(q).scalar()
        return None if doc is None else self._profile(doc)

    def profile_stamp(self, fingerprint: str, id: str | None = None) -> str | None:
        """'ID@STORED_AT' of the profile a plan would use (``id``, else the fingerprint's newest), or None: a cheap
        version that changes whenever that profile is replaced, deleted or superseded."""
        if id is None and not storable(fingerprint, profiles_t.c.fingerprint):
            return None
        with self.reading() as conn:
            if id is not None:
                row = conn.execute(_STAMP_BY_ID, {"id": self._resolve_id(conn, id)}).first()
            else:
                row = conn.execute(_STAMP_NEWEST, {"fp": fingerprint}).first()
        return None if row is None else f"{row[0]}@{row[1]}"

    def delete_profile(self, id: str) -> str:
        """Remove a stored profile (its id or a unique prefix; PlanError if there is none); returns its id."""
        with self.transaction() as conn:
            real = self._resolve_id(conn, id)
            if real is not None:
                conn.execute(profiles_t.delete().where(profiles_t.c.id == real))
        if real is None:
            raise self._unknown(id)
        return real

    # ---- link fits
    def save_link_fit(self, fingerprint: str, links: dict) -> None:
        """Store a `profile links` fit (the cluster's ``calibration['links']``) for a topology fingerprint."""
        with self.transaction() as conn:
            conn.execute(link_fits_t.insert().values(fingerprint=fingerprint, links=links, created_at=_now()))

    def link_fit(self, fingerprint: str) -> dict | None:
        """The newest stored link fit of this topology fingerprint, or None."""
        q = (sa.select(link_fits_t.c.links).where(link_fits_t.c.fingerprint == fingerprint)
             .order_by(link_fits_t.c.created_at.desc(), link_fits_t.c.id.desc()).limit(1))
        with self.transaction() as conn:
            return conn.execute(q).scalar()

    # ---- tune runs and their checkpoints
    def start_run(self, key: str, meta: dict, busy: Callable[[dict], str | None] | None = None) -> tuple[int, bool]:
        """(run id, resumed?): the unfinished run with this key if there is one (its meta updated with ``meta``),
        else a new run. ``busy``: given the unfinished run's meta, why it may not be resumed (a live process still
        runs it), or None; a reason is a PlanError, decided in the transaction that would take the run over."""
        now = _now()
        with self.transaction() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _lock_key("run:" + key)})
            row = conn.execute(sa.select(runs_t.c.id, runs_t.c.meta).where(runs_t.c.key == key, runs_t.c.status ==
                               "running").order_by(runs_t.c.id.desc()).limit(1)).first()
            if row is not None:
                held = busy(row.meta or {}) if busy else None
                if held:
                    raise PlanError("tune", held, "wait for that tune to end, or stop it: a stopped tune resumes here")
                conn.execute(runs_t.update().where(runs_t.c.id == row.id).values(updated_at=now,
                                                                                 meta={**(row.meta or {}), **meta}))
                return row.id, True
            rid = conn.execute(runs_t.insert().values(key=key, status="running", meta=meta, created_at=now,
                                                      updated_at=now)).inserted_primary_key[0]
            return int(rid), False

    def finish_run(self, run_id: int, status: str = "done") -> None:
        """Mark a run finished (``done``, ``failed``, ...): a later start_run with its key starts afresh."""
        if status == "running":
            raise PlanError("status", "a finished run cannot be 'running'", "pass done, failed or stopped")
        with self.transaction() as conn:
            n = conn.execute(runs_t.update().where(runs_t.c.id == run_id).values(status=status, updated_at=_now())).rowcount
        if not n:
            raise PlanError("run", f"no tune run {run_id} in store {self.shown}", "pass a run id from start_run")

    def run(self, run_id: int) -> dict | None:
        """One run's row: id, key, status, meta, created_at, updated_at (None if unknown)."""
        with self.transaction() as conn:
            row = conn.execute(sa.select(runs_t).where(runs_t.c.id == run_id)).mappings().first()
        return None if row is None else dict(row)

    def runs(self, key: str | None = None) -> list[dict]:
        """Tune runs, newest first, optionally only those of one key."""
        q = sa.select(runs_t).order_by(runs_t.c.id.desc())
        if key is not None:
            q = q.where(runs_t.c.key == key)
        with self.transaction() as conn:
            return [dict(r) for r in conn.execute(q).mappings()]

    def record_step(self, run_id: int, name: str, status: str, payload: dict) -> None:
        """Insert or replace one checkpoint of a run (its own transaction)."""
        row = {"run_id": run_id, "name": name, "status": status, "payload": payload, "updated_at": _now()}
        with self.transaction() as conn:
            dialect = conn.dialect.name
            if dialect in ("sqlite", "postgresql"):
                ins = (sa_sqlite.insert if dialect == "sqlite" else sa_pg.insert)(steps_t)
                conn.execute(ins.values(**row).on_conflict_do_update(
                    index_elements=["run_id", "name"],
                    set_={"status": status, "payload": ins.excluded.payload, "updated_at": row["updated_at"]}))
            elif not conn.execute(steps_t.update().where(steps_t.c.run_id == run_id, steps_t.c.name == name)
                                  .values(status=status, payload=payload, updated_at=row["updated_at"])).rowcount:
                conn.execute(steps_t.insert().values(**row))
            conn.execute(runs_t.update().where(runs_t.c.id == run_id).values(updated_at=row["updated_at"]))

    def steps(self, run_id: int) -> dict[str, tuple[str, dict]]:
        """A run's checkpoints: step name -> (status, payload), in the order they were first recorded."""
        q = sa.select(steps_t.c.name, steps_t.c.status, steps_t.c.payload).where(steps_t.c.run_id == run_id).order_by(steps_t.c.id)
        with self.transaction() as conn:
            return {name: (status, payload) for name, status, payload in conn.execute(q)}


def run_key(fingerprint: str, stack: dict, model: Any, workload: Any, options: dict) -> str:
    """A tune's key: sha256 of fingerprint, stack, model, workload and options (pydantic models dumped)."""
    import json  # noqa: PLC0415

    dump = lambda x: x.model_dump(mode="json") if hasattr(x, "model_dump") else x  # noqa: E731
    text = json.dumps([fingerprint, stack, dump(model), dump(workload), options], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _check_storable(profile: Profile) -> None:
    """A Profile the store can keep as given (check_columns), not created in the future (check_created), with no
    impossible figures (check_plausible); else PlanError naming the field."""
    of_type("profile", profile, Profile, "a Profile (sp_plan.Profile.load(file))")
    check_columns(profile)
    check_created(profile)
    check_plausible(profile)


def content_id(profile: Profile) -> str:
    """An id-less profile's id: 12 hex digits of the sha256 of its document, so the same file uploaded again replaces
    its row instead of adding a copy (a ``created_at`` it carries is part of it; one the store stamps is not)."""
    import json  # noqa: PLC0415

    text = json.dumps(profile.model_dump(mode="json", exclude={"id"}), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
