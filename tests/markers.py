"""Test markers from what each test does: ``multiprocess`` (starts a process), ``postgres`` (uses the throwaway
PostgreSQL server), ``browser`` (opens Chromium), ``netns`` (network namespaces), and ``slow`` (any of those, or
over SLOW_S seconds). ``pytest -m "not slow"`` is the contributor's inner loop.

The marks live in tests/markers.json, written by a whole run with ``pytest --record-markers``: the run watches
every process a test starts (subprocess, multiprocessing, torch's spawn) and its duration. Without the option the
recorded marks are applied, and a test that starts a process without its mark is reported in the summary, so the
file is refreshed when a test changes what it does.
"""
from __future__ import annotations

import json
import multiprocessing.process
import subprocess
import time
from pathlib import Path

import pytest

MARKERS_FILE = Path(__file__).with_name("markers.json")
#: a test over this many seconds is slow even if it starts nothing
SLOW_S = 1.0
KINDS = ("multiprocess", "postgres", "browser", "netns")

_seen: dict[str, set[str]] = {}
_current: list[str] = []
_unmarked: set[str] = set()


def _kinds_of(argv) -> set[str]:
    """The marks a started command line earns: always multiprocess, and the tool it runs."""
    text = " ".join(map(str, argv)) if isinstance(argv, (list, tuple)) else str(argv)
    kinds = {"multiprocess"}
    if "chromium" in text:
        kinds.add("browser")
    if "netns" in text:
        kinds.add("netns")
    if "postgres" in text or "initdb" in text or "pg_ctl" in text:
        kinds.add("postgres")
    return kinds


def _note(kinds: set[str]) -> None:
    """Record what the running test started."""
    if _current:
        _seen.setdefault(_current[0], set()).update(kinds)


def _watch() -> None:
    """Wrap the two ways a test starts a process: subprocess.Popen and multiprocessing's Process.start."""
    popen_init, start = subprocess.Popen.__init__, multiprocessing.process.BaseProcess.start

    def init(self, args, *a, **kw):
        _note(_kinds_of(args))
        popen_init(self, args, *a, **kw)

    def started(self):
        _note({"multiprocess"})
        start(self)

    subprocess.Popen.__init__ = init
    multiprocessing.process.BaseProcess.start = started


def load_marks() -> dict[str, list[str]]:
    """node id -> recorded marks (empty before the first recording)."""
    return json.loads(MARKERS_FILE.read_text()) if MARKERS_FILE.exists() else {}


def pytest_addoption(parser):
    parser.addoption("--record-markers", action="store_true",
                     help="watch what each test starts and how long it takes; rewrite tests/markers.json")


def pytest_configure(config):
    for kind, what in (("slow", "starts a process, server, database or browser, or takes over a second"),
                       ("multiprocess", "starts a process"), ("postgres", "uses a PostgreSQL server"),
                       ("browser", "opens a headless browser"), ("netns", "uses network namespaces")):
        config.addinivalue_line("markers", f"{kind}: {what}")
    _watch()


def pytest_collection_modifyitems(config, items):
    """Apply the recorded marks (a new test has none until the next recording; the summary names one that starts a
    process)."""
    marks = load_marks()
    for item in items:
        for kind in marks.get(item.nodeid, ()):
            item.add_marker(getattr(pytest.mark, kind))


#: fixtures that start a server for the test (in their setup, which may fall on another test of the session)
FIXTURE_KINDS = {"postgres_url": {"multiprocess", "postgres"}, "chromium": {"multiprocess", "browser"}}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Watch one test from its setup to its teardown: what it starts, and how long it takes."""
    _current[:] = [item.nodeid]
    for name in set(getattr(item, "fixturenames", ())) & set(FIXTURE_KINDS):
        _note(FIXTURE_KINDS[name])
    t0 = time.perf_counter()
    yield
    if time.perf_counter() - t0 > SLOW_S:
        _seen.setdefault(item.nodeid, set()).add("slow")
    started = _seen.get(item.nodeid, set()) & set(KINDS)
    if started and item.get_closest_marker("multiprocess") is None:
        _unmarked.add(item.nodeid)
    _current.clear()


def pytest_sessionfinish(session):
    """With --record-markers: every test that ran gets its marks (any kind implies slow)."""
    if not session.config.getoption("--record-markers"):
        return
    marks = {k: v for k, v in load_marks().items() if "::" in k}
    for node in (i.nodeid for i in session.items):
        kinds = _seen.get(node, set())
        marks[node] = sorted(kinds | ({"slow"} if kinds else set()))
    rows = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(marks.items()) if v]
    MARKERS_FILE.write_text("{\n" + ",\n".join(rows) + "\n}\n")


def pytest_terminal_summary(terminalreporter, config):
    if _unmarked and not config.getoption("--record-markers"):
        terminalreporter.write_sep("-", f"{len(_unmarked)} tests started a process without the multiprocess mark "
                                        "(refresh with: pytest --record-markers)")
        for node in sorted(_unmarked)[:20]:
            terminalreporter.write_line(node)
