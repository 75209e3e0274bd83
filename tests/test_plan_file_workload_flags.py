"""A plan file's workload under `estimate`'s flags: a flag replaces the field it names (--no-causal makes a causal
plan's workload full attention), and a field no flag names keeps the plan's value (an inference plan stays
inference without --inference)."""
from __future__ import annotations

from typer.testing import CliRunner

from sp_plan.cli.app import app
from sp_plan.cli.workload import plan_workload
from sp_plan.pipeline import EstimateResponse
from sp_plan.planner import Plan
from sp_plan.planner.model import Workload
from sp_plan.profiles import load_model

runner = CliRunner()


def plan_file(tmp_path, workload: Workload):
    """A hand-written 8-rank plan of llama3-8b with ``workload``, saved as a plan file."""
    path = tmp_path / "plan.yaml"
    Plan(algorithm="usp", degrees={"ulysses": 4, "ring": 2}, order=["ulysses", "ring"], token_layout="zigzag",
         model=load_model("llama3-8b"), workload=workload).save(path)
    return path


def estimated_workload(path, *flags: str) -> Workload:
    """The workload `sp-plan estimate PATH --cluster dgx-h100 --no-profile FLAGS --json` priced."""
    r = runner.invoke(app, ["estimate", str(path), "--cluster", "dgx-h100", "--no-profile", *flags, "--json"])
    assert r.exit_code == 0, r.output
    return EstimateResponse.model_validate_json(r.stdout).workload


def test_no_causal_makes_a_causal_plan_files_workload_full_attention(tmp_path):
    """--no-causal on a causal plan file prices full (bidirectional) attention."""
    causal = Workload(seq_len=65536, causal=True)
    assert plan_workload(causal, None, None, False, False).causal is False
    assert estimated_workload(plan_file(tmp_path, causal), "--no-causal").causal is False


def test_an_inference_plan_file_stays_inference_without_the_flag(tmp_path):
    """A plan file of an inference workload is priced as inference without --inference."""
    inference = Workload(seq_len=65536, training=False)
    assert plan_workload(inference, None, None, None, False).training is False
    assert estimated_workload(plan_file(tmp_path, inference)).training is False
