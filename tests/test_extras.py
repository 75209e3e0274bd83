"""The core install plans on its own, and a command whose extra is missing exits 2 naming the pip install."""
from __future__ import annotations

import subprocess
import sys

import pytest

#: the top-level modules the extras bring (pyproject's optional-dependencies)
EXTRA_MODULES = ("fastapi", "uvicorn", "httpx", "prometheus_client", "matplotlib", "pyarrow", "psycopg",
                 "transformers", "accelerate", "megatron", "deepspeed", "yunchang")

#: runs the CLI in a process where the extras' modules cannot be imported, as in a core-only install
BLOCKED_CLI = """
import importlib.abc, sys
BLOCK = set(sys.argv[1].split(","))
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCK:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Blocker())
sys.argv = ["sp-plan"] + sys.argv[2:]
from sp_plan.cli.app import main
main()
"""


def cli_without_extras(*args: str, tmp_path) -> subprocess.CompletedProcess:
    """`sp-plan ARGS` with every extra's module missing."""
    return subprocess.run([sys.executable, "-c", BLOCKED_CLI, ",".join(EXTRA_MODULES), *args], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)


def test_the_core_alone_plans_estimates_and_shows(tmp_path):
    plan = tmp_path / "p.yaml"
    r = cli_without_extras("plan", "--cluster", "dgx-h100", "--nodes", "1", "--model", "llama3-8b", "--seq-len",
                           "32k", "--no-profile", "-o", str(plan), tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    for cmd in (("estimate", str(plan), "--cluster", "dgx-h100", "--no-profile"), ("show", str(plan))):
        r = cli_without_extras(*cmd, tmp_path=tmp_path)
        assert r.returncode == 0, (cmd, r.stderr)


@pytest.mark.parametrize("args, extra", [
    (("serve", "--port", "1"), "service"),
    (("report", "--cluster", "dgx-h100", "--nodes", "1", "--model", "llama3-8b", "--seq-len", "32k",
      "--no-profile", "-o", "r.html"), "report"),
])
def test_a_command_without_its_extra_exits_2_naming_it(tmp_path, args, extra):
    r = cli_without_extras(*args, tmp_path=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"pip install 'sp-plan[{extra}]'" in lines[0]


def test_a_missing_extra_is_an_import_error_and_a_plan_error():
    from sp_plan.planner.errors import MissingExtra, PlanError, require_extra

    with pytest.raises(MissingExtra) as e:
        require_extra("sp_plan_no_such_module", "report", "the figures")
    assert isinstance(e.value, ImportError) and isinstance(e.value, PlanError)
    assert e.value.field == "the figures" and "sp-plan[report]" in e.value.fix
