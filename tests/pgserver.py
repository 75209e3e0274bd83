"""A throwaway PostgreSQL server for the store tests (``postgres_url`` fixture).

Finds initdb/pg_ctl (/usr/lib/postgresql/*/bin, else PATH), inits a cluster in a fresh /tmp
directory on a free port (as the ``postgres`` user, else ``nobody``, when running as root: the server
refuses root), starts it, creates a database and yields its SQLAlchemy URL; stops and removes it at
the end. Without the binaries or psycopg the tests skip, unless SP_PLAN_REQUIRE_POSTGRES=1 (CI), which
makes that a failure.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest


def _missing(reason: str):
    if os.environ.get("SP_PLAN_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"{reason} (SP_PLAN_REQUIRE_POSTGRES=1: the PostgreSQL tests must run)")
    pytest.skip(f"{reason}; install the Debian package `postgresql` and psycopg[binary] to run the PostgreSQL tests")


def find_bindir() -> Path | None:
    """The directory holding initdb and pg_ctl, newest major version first."""
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(Path(d).parent.name)
                  if Path(d).parent.name.isdigit() else 0, reverse=True)
    for d in dirs:
        if (Path(d) / "initdb").exists() and (Path(d) / "pg_ctl").exists():
            return Path(d)
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb and shutil.which("pg_ctl") else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(run, bindir: Path, root: Path, data: Path, log: Path, tries: int = 5) -> int:
    """Start the server on a free port; another process may take the port between the probe and the bind, so a
    bind failure retries on a new one."""
    for _ in range(tries):
        port = _free_port()
        opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
        r = run(bindir / "pg_ctl", "-D", data, "-o", opts, "-l", log, "-w", "-t", "60", "start")
        if not r.returncode:
            return port
        text = log.read_text() if log.exists() else ""
        if "could not bind" not in text:
            break
        log.unlink(missing_ok=True)
    shutil.rmtree(root, ignore_errors=True)
    pytest.fail(f"pg_ctl start failed: {r.stderr or r.stdout} {text}")


def _as_user(user: str | None, argv: list[str]) -> list[str]:
    if user is None:
        return argv
    if shutil.which("runuser"):
        return ["runuser", "-u", user, "--", *argv]
    return ["su", "-s", "/bin/sh", user, "-c", " ".join(f"'{a}'" for a in argv)]


@pytest.fixture(scope="session")
def postgres_url():
    """SQLAlchemy URL of a fresh database on a throwaway PostgreSQL server."""
    bindir = find_bindir()
    if bindir is None:
        _missing("PostgreSQL server binaries (initdb, pg_ctl) not found")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _missing("psycopg is not installed")
    user = None
    if os.geteuid() == 0:
        for name in ("postgres", "nobody"):
            try:
                pw = pwd.getpwnam(name)
                user = name
                break
            except KeyError:
                continue
        if user is None:
            _missing("running as root and no postgres/nobody user to run the server as")
    root = Path(tempfile.mkdtemp(prefix="sp-plan-pg-", dir="/tmp"))
    if user is not None:
        os.chown(root, pw.pw_uid, pw.pw_gid)
    data, log = root / "data", root / "server.log"
    run = lambda *argv: subprocess.run(_as_user(user, [str(a) for a in argv]), capture_output=True, text=True,  # noqa: E731
                                       timeout=120)
    r = run(bindir / "initdb", "-D", data, "-U", "sp", "--auth=trust", "-E", "UTF8", "--no-sync")
    if r.returncode:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"initdb failed: {r.stderr or r.stdout}")
    port = _start(run, bindir, root, data, log)
    try:
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={port} user=sp dbname=postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE spplan")
        yield f"postgresql+psycopg://sp@127.0.0.1:{port}/spplan"
    finally:
        run(bindir / "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop")
        shutil.rmtree(root, ignore_errors=True)


def fresh_database(base_url: str, prefix: str = "t") -> str:
    """The URL of a new, empty database on the throwaway server of ``base_url`` (``postgres_url``)."""
    import time

    import sqlalchemy as sa

    server = base_url.rsplit("/", 1)[0]
    name = f"{prefix}{os.getpid()}_{time.monotonic_ns()}"
    eng = sa.create_engine(server + "/postgres", isolation_level="AUTOCOMMIT")
    with eng.connect() as c:
        c.execute(sa.text(f"CREATE DATABASE {name}"))
    eng.dispose()
    return server + "/" + name
