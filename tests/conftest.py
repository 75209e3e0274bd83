import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

# commands that store something (`profile links`, `profile import`) never write the user's own store in tests; each
# test process has its own (pytest-xdist's workers inherit the controller's environment, and would share one)
import tempfile  # noqa: E402

if os.environ.get("SP_PLAN_STORE") in (None, os.environ.get("SP_PLAN_TEST_STORE")):
    os.environ["SP_PLAN_STORE"] = os.environ["SP_PLAN_TEST_STORE"] = \
        f"sqlite:///{tempfile.mkdtemp(prefix='sp-plan-test-store-')}/store.db"

# ---- Hypothesis: a derandomized, fixed-budget profile for CI ("ci", the default) and a deeper one for local
# runs (HYPOTHESIS_PROFILE=dev); the terminal summary says how many generated cases each property ran.
import collections  # noqa: E402
import functools  # noqa: E402

from hypothesis import HealthCheck, settings  # noqa: E402

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile("ci", max_examples=40, derandomize=True, deadline=None, database=None,
                          suppress_health_check=_SLOW_OK, print_blob=True)
settings.register_profile("dev", max_examples=600, deadline=None, suppress_health_check=_SLOW_OK)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

_CASES: collections.Counter = collections.Counter()


def pytest_collection_modifyitems(items):
    """Count every generated case a property runs (Hypothesis's documented ``inner_test`` hook)."""
    for item in items:
        h = getattr(getattr(item, "obj", None), "hypothesis", None)
        if h is None or getattr(h.inner_test, "_sp_counted", False):
            continue
        inner, key = h.inner_test, f"{item.module.__name__.split('.')[-1]}::{item.originalname}"

        @functools.wraps(inner)
        def counted(*a, _inner=inner, _key=key, **kw):
            _CASES[_key] += 1
            return _inner(*a, **kw)

        counted._sp_counted = True
        h.inner_test = counted


#: a string parameter longer than this appears in a test's id by its start and length (markers.json and -k read ids)
LONGEST_ID_PART = 100


def pytest_make_parametrize_id(config, val, argname):
    """A long string parameter (a 10,000-character id) as its first characters and its length, not all of it."""
    if isinstance(val, str) and len(val) > LONGEST_ID_PART:
        return f"{val[:8]}...({len(val)} characters)".encode("unicode_escape").decode()
    return None


def pytest_terminal_summary(terminalreporter):
    if _CASES:
        terminalreporter.write_sep("-", f"hypothesis: generated cases per property (profile {os.environ.get('HYPOTHESIS_PROFILE', 'ci')})")
        for key, n in sorted(_CASES.items()):
            terminalreporter.write_line(f"{n:6d}  {key}")


pytest_plugins = ["markers"]  # tests/markers.py: slow, multiprocess, postgres, browser, netns

import importlib.util  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def script():
    """Load a script of the repository (``benchmarks/bench_tune.py``, ...) as a module, once per path."""
    loaded: dict = {}

    def load(relpath: str):
        if relpath not in loaded:
            spec = importlib.util.spec_from_file_location(Path(relpath).stem, ROOT / relpath)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            loaded[relpath] = mod
        return loaded[relpath]

    return load
