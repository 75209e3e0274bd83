"""Test markers from what each test does: ``multiprocess`` (starts a process), ``postgres`` (uses the throwaway
PostgreSQL server), ``browser`` (opens Chromium), ``netns`` (network namespaces), and ``slow`` (any of those, or
over SLOW_S seconds of CPU, or WAIT_S of waiting). ``pytest -m "not slow"`` is the contributor's inner loop.

The marks live in tests/markers.json (and the slow tests' wall seconds, which order them, in tests/durations.json),
written by a run with ``pytest --record-markers`` (a whole run, or some files:
the marks of the tests that did not run are kept): the run watches
every process a test starts (subprocess, multiprocessing, torch's spawn) and its duration. What a fixture's setup
starts or spends counts for every test that uses the fixture, not only for the first one, which happened to set
it up. Without the option the recorded marks are applied, and a test that starts a process without its mark is
reported in the summary, so the file is refreshed when a test changes what it does.

A mark written in the test itself counts as well (any kind implies ``slow``): tests that read a world their module
starts once and caches say so with ``@shared_world(name)``, so that every one of them is slow (not just the first)
and, under pytest-xdist's ``--dist loadgroup``, they share one worker and the world starts once. Namespace tests
share one group: they create and delete the same namespaces.
"""
from __future__ import annotations

import re

import json
import multiprocessing.process
import subprocess
import time
from pathlib import Path

import pytest

MARKERS_FILE = Path(__file__).with_name("markers.json")
#: the slow tests' wall seconds in the recording, which orders them longest first under pytest-xdist
DURATIONS_FILE = Path(__file__).with_name("durations.json")
#: a test that computes for over this many CPU seconds is slow even if it starts nothing (CPU, not wall-clock
#: time, so that a recording on a busy machine marks what a quiet one would)
SLOW_S = 1.0
#: a test that waits this long (wall-clock) is slow whatever its CPU time
WAIT_S = 5.0
KINDS = ("multiprocess", "postgres", "browser", "netns")
NETNS = re.compile(r"(^|[\s/])ip (netns|-n) ")

_seen: dict[str, set[str]] = {}
_current: list[str] = []
#: what each shared fixture's setup started, and "slow" if it took long: keyed by (base node id, fixture name, param)
_fixtures: dict[tuple[str, str], set[str]] = {}
_setting_up: list[tuple[str, str]] = []
_unmarked: set[str] = set()
_wall: dict[str, float] = {}


def _kinds_of(argv) -> set[str]:
    """The marks a started command line earns: always multiprocess, and the tool it runs."""
    text = " ".join(map(str, argv)) if isinstance(argv, (list, tuple)) else str(argv)
    kinds = {"multiprocess"}
    if "chromium" in text:
        kinds.add("browser")
    if NETNS.search(text):  # `ip netns ...` or `ip -n NS ...`; not a path that merely names one
        kinds.add("netns")
    if "postgres" in text or "initdb" in text or "pg_ctl" in text:
        kinds.add("postgres")
    return kinds


def _note(kinds: set[str]) -> None:
    """Record what the running test started, and the fixture being set up if any."""
    if _current:
        _seen.setdefault(_current[0], set()).update(kinds)
    for key in _setting_up:
        _fixtures.setdefault(key, set()).update(kinds)


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


def _clock() -> tuple[float, float]:
    """Wall-clock and this process's CPU time (all its threads)."""
    return time.perf_counter(), time.process_time()


def _took_long(since: tuple[float, float]) -> bool:
    """Over SLOW_S of CPU or WAIT_S of waiting since ``since``."""
    wall, cpu = (now - then for now, then in zip(_clock(), since))
    return cpu > SLOW_S or wall > WAIT_S


def load_marks() -> dict[str, list[str]]:
    """node id -> recorded marks (empty before the first recording)."""
    return json.loads(MARKERS_FILE.read_text()) if MARKERS_FILE.exists() else {}


def load_durations() -> dict[str, float]:
    """node id -> the wall seconds a recording took (its slow tests only; empty before the first recording)."""
    return json.loads(DURATIONS_FILE.read_text()) if DURATIONS_FILE.exists() else {}


def pytest_addoption(parser):
    parser.addoption("--record-markers", action="store_true",
                     help="watch what each test starts and how long it takes; rewrite tests/markers.json")


def pytest_configure(config):
    if config.getoption("--record-markers") and getattr(config.option, "numprocesses", None):
        raise pytest.UsageError("--record-markers watches one process: run it without -n")
    for kind, what in (("slow", "starts a process, server, database or browser, or computes over a second (or waits over five)"),
                       ("multiprocess", "starts a process"), ("postgres", "uses a PostgreSQL server"),
                       ("browser", "opens a headless browser"), ("netns", "uses network namespaces")):
        config.addinivalue_line("markers", f"{kind}: {what}")
    _watch()


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads xdist_group and appends the group to the node id
def pytest_collection_modifyitems(config, items):
    """Apply the recorded marks (a new test has none until the next recording; the summary names one that starts a
    process); a kind written in the test implies slow; namespace tests share one xdist group."""
    marks = load_marks()
    for item in items:
        for kind in marks.get(item.nodeid, ()):
            item.add_marker(getattr(pytest.mark, kind))
        if any(item.get_closest_marker(kind) for kind in KINDS) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("netns") and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group("netns"))
    _longest_first(items, load_durations())


def _group(item) -> str | None:
    """The item's xdist group, if any."""
    mark = item.get_closest_marker("xdist_group")
    return (mark.args[0] if mark.args else mark.kwargs.get("name")) if mark else None


def _longest_first(items, took: dict[str, float]) -> None:
    """Slow tests first, the longest recorded first, an xdist group as one unit of its tests' total (the rest keep
    their order). pytest-xdist hands out a quarter of the run round-robin at its start and the rest as workers
    free up, so a run that ends on its longest tests or groups leaves one worker idle while the other works
    through its last minutes of tunes; ending on fast ones, both finish together. A group's tests keep their
    order among themselves: they share a server or a world, and some read what an earlier one left there."""
    total: dict[str, float] = {}
    for item in items:
        if (g := _group(item)) is not None:
            total[g] = total.get(g, 0.0) + took.get(item.nodeid, 0.0)
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None,
                                 -(total[g] if (g := _group(item)) is not None else took.get(item.nodeid, 0.0))))


#: fixtures that start a server for the test (in their setup, which may fall on another test of the session)
FIXTURE_KINDS = {"postgres_url": {"multiprocess", "postgres"}, "chromium": {"multiprocess", "browser"}}


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """Watch a shared fixture's setup (module, session...): what it starts and how long it takes count for every
    test that uses it. A function's fixtures count for their test already."""
    if fixturedef.scope == "function":
        yield
        return
    key = (fixturedef.baseid, fixturedef.argname, getattr(request, "param_index", 0))
    _setting_up.append(key)
    t0 = _clock()
    try:
        yield
    finally:
        _setting_up.remove(key)
        if _took_long(t0):
            _fixtures.setdefault(key, set()).add("slow")


def _fixture_kinds(item) -> set[str]:
    """What the fixtures ``item`` uses started or spent, wherever they were set up."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    params = item.callspec.indices if hasattr(item, "callspec") else {}
    return set().union(*(_fixtures.get((d.baseid, d.argname, params.get(d.argname, 0)), set()) for ds in defs for d in ds))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Watch one test from its setup to its teardown: what it starts, and how long it takes."""
    _current[:] = [item.nodeid]
    for name in set(getattr(item, "fixturenames", ())) & set(FIXTURE_KINDS):
        _note(FIXTURE_KINDS[name])
    t0 = _clock()
    yield
    _wall[item.nodeid] = _clock()[0] - t0[0]
    if _took_long(t0):
        _seen.setdefault(item.nodeid, set()).add("slow")
    started = _seen.get(item.nodeid, set()) & set(KINDS)
    if started and item.get_closest_marker("multiprocess") is None:
        _unmarked.add(item.nodeid)
    _current.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """The last test's teardown also ends the session's fixtures (stopping PostgreSQL): that is not the test's doing."""
    if nextitem is None:
        _current.clear()
    yield


def pytest_sessionfinish(session):
    """With --record-markers: every test that ran gets its marks (any kind implies slow)."""
    if not session.config.getoption("--record-markers"):
        return
    marks = {k: v for k, v in load_marks().items() if "::" in k}
    for item in session.items:
        kinds = _seen.get(item.nodeid, set()) | _fixture_kinds(item)
        marks[item.nodeid] = sorted(kinds | ({"slow"} if kinds else set()))
    rows = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(marks.items()) if v]
    MARKERS_FILE.write_text("{\n" + ",\n".join(rows) + "\n}\n")
    took = {k: v for k, v in load_durations().items() if k in marks and "slow" in marks[k]}
    took.update({k: round(_wall[k], 1) for k in _wall if "slow" in marks.get(k, ())})
    DURATIONS_FILE.write_text(json.dumps(dict(sorted(took.items())), indent=0) + "\n")


def pytest_terminal_summary(terminalreporter, config):
    if _unmarked and not config.getoption("--record-markers"):
        terminalreporter.write_sep("-", f"{len(_unmarked)} tests started a process without the multiprocess mark "
                                        "(refresh with: pytest --record-markers)")
        for node in sorted(_unmarked)[:20]:
            terminalreporter.write_line(node)


def shared_world(name: str):
    """Mark a test whose cases read gloo worlds that its module starts once and caches: multiprocess on every case
    (not only on the one that happens to start the world), and one xdist group, so that under pytest-xdist the
    cases share a worker and each world starts once."""
    def mark(test):
        return pytest.mark.xdist_group(name)(pytest.mark.multiprocess(test))
    return mark
