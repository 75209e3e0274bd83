"""Equivalent candidates: same predicted cost, one parameter different, one row; --top K stays K distinct rows."""
import subprocess
import sys
from types import SimpleNamespace

from sp_plan.planner import Plan
from sp_plan.planner.candidate import Candidate
from sp_plan.planner.equivalent import differing, exact_prefix, group, top_rows
from sp_plan.planner.plan import Prediction


def priced(c: Candidate, step: float, mem: float = 50e9) -> Plan:
    return c.to_plan(predicted=Prediction(step_time_s=step, tokens_per_s=1.0, mfu=0.5, peak_memory_bytes=mem))


TR = dict(algorithm="tokenring_ring", ring=16, order=("ring",), token_layout="zigzag", zero_stage=2)


def test_teams_at_one_cost_share_a_row_naming_the_alternatives():
    plans = [priced(Candidate(**TR, team=t), 2.478) for t in (2, 4, 8)]
    rows = group(plans)
    assert len(rows) == 1 and rows[0].parameter == "team"
    assert rows[0].label() == "tokenring_ring ring16 team2 zigzag ring zero2 (same: team 4, 8)"


def test_a_different_cost_memory_or_two_parameters_keep_their_own_rows():
    a = priced(Candidate(**TR, team=2), 2.478)
    slower = priced(Candidate(**TR, team=4), 2.478 * (1 + 1e-6))
    more_mem = priced(Candidate(**TR, team=8), 2.478, mem=60e9)
    two = priced(Candidate(**{**TR, "zero_stage": 3}, team=4), 2.478)  # team and ZeRO differ
    assert differing(a, two) == ["zero_stage", "team"]
    assert [len(r.alternatives) for r in group([a, slower, more_mem, two])] == [0, 0, 0, 0]


def test_alternatives_of_a_row_differ_in_the_same_parameter():
    base = Candidate("usp", ulysses=4, ring=4, order=("ulysses", "ring"), token_layout="zigzag")
    plans = [priced(base, 1.0), priced(Candidate(**{**base.__dict__, "token_layout": "striped"}), 1.0),
             priced(Candidate(**{**base.__dict__, "order": ("ring", "ulysses")}), 1.0)]
    rows = group(plans)
    assert len(rows) == 2 and rows[0].parameter == "token_layout" and rows[0].alternatives == [plans[1]]
    assert "(same: order ring<ulysses)" in group([plans[0], plans[2]])[0].label()


def test_top_k_means_k_distinct_rows_and_the_search_keeps_more_when_rows_merge():
    # ranked: three equivalent teams first, then distinct layouts; a search keeping `keep` exact entries
    cands = [(2.478, Candidate(**TR, team=t)) for t in (2, 4, 8)] + \
            [(3.0 + i, Candidate("ring", ring=16, order=("ring",), token_layout="zigzag", zero_stage=z))
             for i, z in enumerate((0, 1, 2, 3))]
    keeps = []

    def search(keep):
        keeps.append(keep)
        return SimpleNamespace(ranked=cands[:keep + 1])  # a best-first search returns a little beyond keep

    res, rows = top_rows(search, lambda r, n: [priced(c, t) for t, c in r.ranked[:n]], 3)
    assert [r.label().split()[0] for r in rows] == ["tokenring_ring", "ring", "ring"] and len(rows) == 3
    assert keeps == [3, 6] and rows[0].alternatives and exact_prefix(cands, 3) == 3


def test_plan_command_shows_equivalent_layouts_as_one_row():
    """Under the presets' default model two mesh orders of tp2 x ulysses4 x ring2 cost the same."""
    r = subprocess.run([sys.executable, "-m", "sp_plan.cli.app", "plan", "--cluster", "dgx-h100", "--nodes", "2",
                        "--model", "llama3-8b", "--seq-len", "128k", "--top", "3"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "usp tp2 ulysses4 ring2 zigzag tp<ulysses<ring zero1 (same: order ulysses<tp<ring)" in r.stdout
    assert "usp tp2 ulysses4 ring2 zigzag ulysses<tp<ring" not in r.stdout  # no row of its own
    ranked = r.stdout.split("ranked layouts")[1].split("best layout of each")[0]
    assert sum(1 for l in ranked.splitlines() if l.startswith("│")) == 3
