"""The core install plans on its own, and a command whose extra is missing exits 2 naming the pip install."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: the top-level modules the extras bring (pyproject's optional-dependencies)
EXTRA_MODULES = ("fastapi", "uvicorn", "httpx", "prometheus_client", "matplotlib", "pyarrow", "psycopg",
                 "transformers", "accelerate", "megatron", "deepspeed", "yunchang")

#: runs CLI commands (a JSON list of argument lists), one after another, through the console's command-line runner
#: (``run_line``) in one process where the extras' modules cannot be imported, as in a core-only install; prints each
#: one's exit status, stdout and stderr as JSON (the finder refuses every import of an extra, whichever command comes
#: first)
BLOCKED_CLI = """
import contextlib, importlib.abc, io, json, sys, traceback
BLOCK = set(sys.argv[1].split(","))
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCK:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Blocker())
from sp_plan.cli.app import run_line
results = []
for args in json.loads(sys.argv[2]):
    sys.argv, out, err, code = ["sp-plan", *args], io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = run_line()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        except BaseException:
            traceback.print_exc()
            code = 1
    results.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
print("RESULTS=" + json.dumps(results))
"""

PLAN = ("plan", "--cluster", "dgx-h100", "--nodes", "1", "--model", "llama3-8b", "--seq-len", "32k", "--no-profile",
        "-o", "p.yaml")
CORE = [PLAN, ("estimate", "p.yaml", "--cluster", "dgx-h100", "--no-profile"), ("show", "p.yaml")]
WITHOUT_EXTRA = {
    "service": ("serve", "--port", "1"),
    "report": ("report", "--cluster", "dgx-h100", "--nodes", "1", "--model", "llama3-8b", "--seq-len", "32k",
               "--no-profile", "-o", "r.html"),
}


@pytest.fixture(scope="module")
def without_extras(tmp_path_factory) -> dict[tuple[str, ...], dict]:
    """Each command of CORE and WITHOUT_EXTRA as `sp-plan` runs it with every extra's module missing: its exit
    status, stdout and stderr (one process for all, in a scratch directory)."""
    argvs = [*CORE, *WITHOUT_EXTRA.values()]
    r = subprocess.run([sys.executable, "-c", BLOCKED_CLI, ",".join(EXTRA_MODULES), json.dumps(argvs)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path_factory.mktemp("core-only"))
    assert r.returncode == 0 and "RESULTS=" in r.stdout, r.stdout[-2000:] + r.stderr[-3000:]
    return dict(zip(argvs, json.loads(r.stdout.split("RESULTS=", 1)[1])))


def test_the_core_alone_plans_estimates_and_shows(without_extras):
    for cmd in CORE:
        r = without_extras[cmd]
        assert r["code"] == 0, (cmd, r["stderr"])
    assert "ranked layouts" in without_extras[PLAN]["stdout"]


@pytest.mark.parametrize("extra", sorted(WITHOUT_EXTRA))
def test_a_command_without_its_extra_exits_2_naming_it(without_extras, extra):
    r = without_extras[WITHOUT_EXTRA[extra]]
    assert r["code"] == 2, r["stderr"]
    lines = [ln for ln in r["stderr"].splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r["stderr"], r["stderr"]
    assert f"pip install 'sp-plan[{extra}]'" in lines[0]


def test_a_missing_extra_is_an_import_error_and_a_plan_error():
    from sp_plan.planner.errors import MissingExtra, PlanError, require_extra

    with pytest.raises(MissingExtra) as e:
        require_extra("sp_plan_no_such_module", "report", "the figures")
    assert isinstance(e.value, ImportError) and isinstance(e.value, PlanError)
    assert e.value.field == "the figures" and "sp-plan[report]" in e.value.fix
