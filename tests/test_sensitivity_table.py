"""`plan --sensitivity`'s table: a long new winner wraps, and every scenario's figures keep their place."""
import io
from types import SimpleNamespace

from rich.console import Console

from sp_plan.cli.report import sensitivity_table
from sp_plan.planner.sensitivity import Scenario, Sensitivity

LONG = "tokenring_ring tp8 ulysses4 ring128 team64 dp8 pp2 zigzag tp<ulysses<ring<dp<pp zero3 ckpt:attention_boundary mbs2"


def plan(summary: str, step_s: float) -> SimpleNamespace:
    """What the table reads of a Plan: its summary and predicted step."""
    return SimpleNamespace(summary=lambda: summary, predicted=SimpleNamespace(step_time_s=step_s))


def test_a_long_new_winner_wraps_and_the_figures_stay_whole():
    """At a log's 160 columns, a scenario whose winner's layout is long still prints the old winner's step and loss
    in full (the layout wraps), on the scenario's first line."""
    scenarios = [Scenario(f"ib x{k}", f"ib bandwidth {k} (inter-node links)", plan(f"{LONG} v{k}", 250.0), 262.5, 259.0)
                 for k in ("halved", "doubled")]
    scenarios.append(Scenario("eff", "compute efficiency at 80%", plan("ring ring8", 300.0), 300.0, 259.0))
    con = Console(file=io.StringIO(), width=160)
    con.print(sensitivity_table(Sensitivity(plan("ring ring8", 259.0), scenarios)))
    lines = con.file.getvalue().splitlines()
    for s in scenarios[:2]:
        first = next(ln for ln in lines if s.what in ln)
        assert "262.500 s (+1.4%)" in first and "5.0%" in first, first
    assert "holds" in next(ln for ln in lines if "compute efficiency" in ln)
    assert max(map(len, lines)) <= 160
