"""The layers hold: the planner opens no file and reads no environment, `sp_plan.plan(..., profile=False)` opens no
store, `profile=None` still finds the cluster's stored profile, and the import contract (lint-imports) is kept."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
#: a store no one can create: its directory does not exist under a read-only root
UNWRITABLE = "sqlite:////proc/sp-plan-nowhere/store.db"

#: in a fresh process with $SP_PLAN_STORE at an unwritable path: the planner's modules imported and the inputs loaded,
#: then an audit hook records every file opened (other than a module's code) and a watched os.environ every variable
#: read, around CALL
WATCH = """import importlib, json, os, pkgutil, sys
import sp_plan.planner
for mod in pkgutil.iter_modules(sp_plan.planner.__path__):  # their imports (numpy, pydantic) read what they read
    importlib.import_module(f"sp_plan.planner.{mod.name}")
from sp_plan.planner.model import Workload
from sp_plan.profiles import load_cluster, load_model
from sp_plan.profiles.kernels import default_params
c, m, w = load_cluster("dgx-h100", 2), load_model("llama3-8b"), Workload(seq_len="128k")
params = default_params(c)
opened, read = [], []
CODE = (".py", ".pyc", ".so", ".pth")
def hook(event, args):
    if event == "open" and isinstance(args[0], str) and not args[0].endswith(CODE):
        opened.append(args[0])
    elif event in ("sqlite3.connect", "socket.connect", "subprocess.Popen"):
        opened.append(event)
class Watched(dict):
    def __getitem__(self, k):
        read.append(k)
        return super().__getitem__(k)
    def get(self, k, default=None):
        read.append(k)
        return super().get(k, default)
    def __contains__(self, k):
        read.append(k)
        return super().__contains__(k)
sys.addaudithook(hook)
os.environ = Watched(os.environ)
CALL
os.environ = dict(os.environ)
print("RESULT=" + json.dumps({"opened": opened, "read": read, "sqlalchemy": "sqlalchemy" in sys.modules,
                              "summary": out[0].summary() if isinstance(out, list) else out.step_time_s}))
"""


def watched(call: str, env: dict | None = None) -> dict:
    """What CALL (which sets ``out``) opened and read, run as described at WATCH."""
    r = subprocess.run([sys.executable, "-c", WATCH.replace("CALL", call)], capture_output=True, text=True,
                       timeout=600, env={**_env(), "SP_PLAN_STORE": UNWRITABLE, **(env or {})})
    assert r.returncode == 0, r.stderr
    return json.loads(next(x for x in r.stdout.splitlines() if x.startswith("RESULT=")).removeprefix("RESULT="))


def _env() -> dict:
    import os

    return dict(os.environ)


def test_the_planner_opens_no_file_and_reads_no_environment():
    got = watched("import sp_plan.planner as planner\n"
                  "out = planner.plan(c, m, w, top_k=3, params=params)\n"
                  "pred = planner.Estimator(c, m, w, params=params)(out[0])\n"
                  "assert pred == out[0].predicted")
    assert got["opened"] == [] and got["read"] == [] and not got["sqlalchemy"], got
    assert got["summary"]  # it did plan


def test_plan_without_a_profile_opens_no_store():
    got = watched("import sp_plan\n"
                  "out = sp_plan.plan(c, m, w, top_k=3, profile=False)\n"
                  "pred = sp_plan.estimate(out[0], c, m, w, profile=False)")
    assert not got["sqlalchemy"] and "sqlite3.connect" not in got["opened"], got
    assert not [p for p in got["opened"] if "sp-plan-nowhere" in p or p.endswith(".db")], got["opened"]
    assert "SP_PLAN_STORE" not in got["read"]


def test_plan_with_the_default_profile_looks_in_the_store_the_environment_names(tmp_path):
    """profile=None: the cluster's newest stored profile, in $SP_PLAN_STORE (first one that is not there, which the
    line says and nothing makes)."""
    import sp_plan
    from sp_plan.planner.model import Workload
    from sp_plan.planner.params import Params
    from sp_plan.planner.profile import Profile
    from sp_plan.profiles import load_cluster, load_model
    from sp_plan.profiles.store import Store

    c, m, w = load_cluster("dgx-h100", 2), load_model("llama3-8b"), Workload(seq_len="32k")
    mp = pytest.MonkeyPatch()
    try:
        mp.setenv("SP_PLAN_STORE", UNWRITABLE)
        from sp_plan.profiles.resolve import resolve_params  # noqa: PLC0415

        assert "no store at sqlite:////proc/sp-plan-nowhere/store.db" in resolve_params(c)[1]
        assert sp_plan.plan(c, m, w, top_k=1)[0].profile is None
        url = f"sqlite:///{tmp_path / 'store.db'}"
        store = Store(url)
        pid = store.save_profile(Profile(cluster_fingerprint=c.topology_fingerprint(), created_at="2026-11-23",
                                         params=Params(round_overhead_s=5e-3)))
        store.close()
        mp.setenv("SP_PLAN_STORE", url)
        assert sp_plan.plan(c, m, w, top_k=1)[0].profile == pid
    finally:
        mp.undo()


def test_the_import_contract_holds():
    """pyproject's [tool.importlinter]: adapters, pipeline, profiles (store and discovery), runtime, planner."""
    assert shutil.which("lint-imports"), "import-linter is missing: pip install -e '.[test]'"
    r = subprocess.run(["lint-imports"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
