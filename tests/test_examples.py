"""Each script of examples/ runs as the guides show it, on CPU, and does what its guide says: the guides link these
scripts, so a change of the CLI, the client or the service that breaks one fails here rather than in a reader's hands.
(examples/train_hf_llama.py has its own test, tests/test_hf_example.py.)"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from sp_plan.planner import Plan
from sp_plan.profiles.store import Store

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run(script: str, workdir: Path, timeout: float) -> str:
    """Run ``examples/script`` with ``workdir`` as its argument, as a user would (this Python's sp-plan and torchrun
    first on PATH, a default store of its own); its stdout and stderr together, after asserting it exited 0."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "SP_PLAN_STORE": f"sqlite:///{workdir / 'default-store.db'}", "OMP_NUM_THREADS": "1", "COLUMNS": "160"}
    cmd = ([sys.executable] if script.endswith(".py") else ["bash"]) + [str(EXAMPLES / script), str(workdir)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    out = run.stdout + run.stderr
    assert run.returncode == 0, f"{script} exited {run.returncode}:\n{out[-4000:]}"
    return out


def test_plan_and_show_writes_the_winner_and_shows_it(tmp_path):
    out = _run("plan_and_show.sh", tmp_path, timeout=240)
    plan = Plan.load(tmp_path / "plan.yaml")
    assert plan.world_size == 16 and plan.predicted.step_time_s > 0
    assert "ranked layouts (fastest first)" in out and "wrote plan.yaml" in out
    # `sp-plan show` prints the file's layout first, then its rank groups
    shown = out.split("wrote plan.yaml", 1)[1]
    assert f"{plan.summary()}  (world 16" in shown and "groups" in shown and "rank lists" in shown


def test_export_writes_every_framework_or_its_nearest(tmp_path):
    out = _run("export_plan.sh", tmp_path, timeout=300)
    plan = Plan.load(tmp_path / "plan.yaml")
    assert plan.algorithm == "usp"  # the plan the script's comments describe
    assert "--cp-comm-type a2a+p2p" in (tmp_path / "megatron.args").read_text()
    ast.parse((tmp_path / "yunchang.py").read_text())
    ast.parse((tmp_path / "accelerate_setup.py").read_text())
    assert "--parallelism.context_parallel_degree" in (tmp_path / "torchtitan.args").read_text()
    assert json.loads((tmp_path / "deepspeed.json").read_text())["sequence_parallel_size"] == 16
    assert "--ulysses_degree" in (tmp_path / "xdit.args").read_text()
    # the three targets without USP each said which plan they took instead
    for target in ("torchtitan", "deepspeed", "accelerate"):
        assert f"exporting the nearest plan: {target} has no" in out


def test_serve_and_query_plans_over_http_and_stops_the_service(tmp_path):
    out = _run("serve_and_query.py", tmp_path, timeout=240)
    plan = Plan.load(tmp_path / "plan.yaml")
    assert f"  1. {plan.summary()}" in out and "estimate of " in out
    assert '"POST /v1/plan HTTP/1.1" 200' in out and '"POST /v1/estimate HTTP/1.1" 200' in out
    assert "Finished server process" in out  # stopped as Ctrl-C stops it, not killed
    assert "leaked semaphore" not in out


def test_tune_on_cpu_ranks_stores_a_profile_that_plan_uses(tmp_path):
    out = _run("tune_cpu_ranks.sh", tmp_path, timeout=420)
    (profile,) = Store(f"sqlite:///{tmp_path / 'store.db'}").list_profiles()
    assert len(profile.candidates) == 2 and all(c.status == "ok" for c in profile.candidates)
    assert profile.params.attention_fwd is not None and profile.params.comm  # kernels and links were fitted
    best = Plan.load(tmp_path / "plan.yaml")
    assert best.world_size == 2 and best.measured.profile == profile.id
    assert f"using profile {profile.id}" in out  # the plan after the tune priced with it
    assert not (tmp_path / "default-store.db").exists()  # the script kept to its own store
