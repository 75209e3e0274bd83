"""Equivalent candidates: same predicted cost, one parameter different, one row; --top K stays K distinct rows."""
import re
import subprocess
import sys
from types import SimpleNamespace

from sp_plan.planner import Plan, Workload
from sp_plan.planner.candidate import Candidate
from sp_plan.planner.equivalent import differing, distinct_prefix, group, top_rows
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


def test_top_k_means_k_distinct_rows_from_one_ranking():
    """Rows merging equivalent layouts still number --top: the plans of the first K distinct step times are
    finished once, from the one ranking (a search that keeps K distinct times ranks them all exactly)."""
    cands = [(2.478, Candidate(**TR, team=t)) for t in (2, 4, 8)] + \
            [(3.0 + i, Candidate("ring", ring=16, order=("ring",), token_layout="zigzag", zero_stage=z))
             for i, z in enumerate((0, 1, 2, 3))]
    finished = []

    def finish(r, n):
        finished.append(n)
        return [priced(c, t) for t, c in r.ranked[:n]]

    rows = top_rows(SimpleNamespace(ranked=cands), finish, 3)
    assert [r.label().split()[0] for r in rows] == ["tokenring_ring", "ring", "ring"] and len(rows) == 3
    assert finished == [5] and rows[0].alternatives and distinct_prefix(cands, 3) == 5
    assert distinct_prefix([(1.0, None), (1.0 + 1e-12, None), (2.0, None)], 1) == 2  # equal to rounding: one time


def test_grid_search_keeping_distinct_times_ranks_every_equivalent_of_the_top_rows():
    """``distinct``: the K fastest distinct step times, each with all its equivalent layouts, in one pass."""
    from sp_plan.planner.search import grid_search
    from sp_plan.profiles import load_cluster, load_model
    from sp_plan.profiles.kernels import default_params

    c, m, w = load_cluster("dgx-h100", 2), load_model("llama3-8b"), Workload(seq_len=131072)
    full = grid_search(c, m, w, keep=None, params=default_params(c))
    res = grid_search(c, m, w, keep=8, distinct=True, params=default_params(c))
    n = distinct_prefix(full.ranked, 8)
    assert [(round(t, 12), x) for t, x in res.ranked[:n]] == [(round(t, 12), x) for t, x in full.ranked[:n]]
    assert n > 8  # the presets' model prices two mesh orders alike: more layouts than rows


def test_plan_command_shows_equivalent_layouts_as_one_row():
    """Under the presets' default model two mesh orders of tp2 x ulysses4 x ring2 cost the same."""
    r = subprocess.run([sys.executable, "-m", "sp_plan.cli.app", "plan", "--cluster", "dgx-h100", "--nodes", "2",
                        "--model", "llama3-8b", "--seq-len", "128k", "--top", "8"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    ranked = r.stdout.split("ranked layouts")[1].split("best layout of each")[0]
    layouts = []  # each row's layout cell, its wrapped lines joined
    for line in ranked.splitlines():
        cells = line.split("│")
        if len(cells) > 2 and cells[1].strip().isdigit():
            layouts.append(cells[2].strip())
        elif len(cells) > 2 and not cells[1].strip() and layouts:
            layouts[-1] += " " + cells[2].strip()
    assert len(layouts) == 8
    assert any(re.fullmatch(r"usp tp2 ulysses4 ring2 zigzag tp<ulysses<ring zero\d \(same: order ulysses<tp<ring\)", x)
               for x in layouts), layouts
    assert not any(x.startswith("usp tp2 ulysses4 ring2 zigzag ulysses<tp<ring") for x in layouts)  # no row of its own


def test_a_rankings_flat_list_holds_each_rows_plan_then_its_equivalents():
    from sp_plan.planner.equivalent import Row
    from sp_plan.planner.ranking import RankedPlans

    a, b, c = (SimpleNamespace(name=n) for n in "abc")
    ranked = RankedPlans([Row(a, [b], "team"), Row(c, [])])
    assert list(ranked) == [a, c] and ranked.flat() == [a, b, c] and ranked.equivalents(0) == [b]
