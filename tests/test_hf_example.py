"""examples/train_hf_llama.py under torchrun with 4 gloo ranks: per-step losses, and --check against one process."""
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import transformers  # noqa: F401 - the `test` extra installs it; the example needs it

from sp_plan.planner import Plan
from sp_plan.runtime.spawn import free_port

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_hf_llama.py"


def _example():
    spec = importlib.util.spec_from_file_location("train_hf_llama", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_example_trains_under_torchrun_and_checks(tmp_path):
    plan = Plan(algorithm="usp", degrees={"ulysses": 2, "ring": 2}, order=["ulysses", "ring"], token_layout="zigzag")
    plan.save(tmp_path / "plan.yaml")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-port", str(free_port()),
           str(EXAMPLE), str(tmp_path / "plan.yaml"), "--steps", "2", "--seq-len", "64", "--check"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert "plan: usp ulysses2 ring2 zigzag ulysses<ring zero0 on 4 ranks (gloo)" in out
    steps = re.findall(r"^step (\d)/2  loss (\S+)  grad-norm (\S+)", out, re.M)
    assert [s[0] for s in steps] == ["1", "2"]
    checks = re.findall(r"^check step \d: loss (\S+) vs (\S+) .* grad-norm (\S+) vs (\S+) .* ok$", out, re.M)
    assert len(checks) == 2
    for loss, ref, gn, gref in checks:
        assert abs(float(loss) - float(ref)) <= 2e-6 * float(ref) + 1e-6  # the printed 6 decimals agree
        assert abs(float(gn) - float(gref)) <= 2e-6 * float(gref) + 1e-6
    assert "check passed" in out


def test_example_search_picks_the_fastest_plan_it_can_run():
    mod = _example()
    plan = mod.search(mod.parse_args(["--seq-len", "128"]))
    assert plan.degrees["tp"] == 1 and plan.degrees["pp"] == 1 and plan.world_size == 4
    assert plan.cluster == "cpu-local" and plan.model.name == "tiny-llama"
    from sp_plan.planner.model import Workload
    from sp_plan.planner.search import plan as ranked
    from sp_plan.profiles import load_cluster, load_model

    every = ranked(load_cluster("cpu-local"), load_model("tiny-llama"), Workload(seq_len=128), top_k=50, profile=False)
    first = next(p for p in every if p.degrees["tp"] == 1 and p.degrees["pp"] == 1 and p.algorithm != "metp")
    assert plan.summary() == first.summary()


def test_example_without_torchrun_says_how_to_launch():
    run = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "launch with torchrun" in run.stderr
