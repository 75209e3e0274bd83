"""Layouts read head to head (profiles/tune/head_to_head.py) and bench_tune's judgement by those readings."""
import json
import shutil
from pathlib import Path

import pytest

from sp_plan.planner import ModelSpec, Plan, Workload
from sp_plan.profiles.tune.head_to_head import head_to_head, regret, relative, round_order
from harness.worlds import run_world

MODEL = ModelSpec(name="tiny", layers=3, hidden=64, heads=4, kv_heads=2, vocab=128, dtype="fp32", gated_mlp=True)
WORK = Workload(seq_len=128)
KEPT = Path(__file__).resolve().parent.parent / "benchmarks" / "truths" / "local4" / "local4"


def test_rounds_alternate_the_order():
    assert [round_order(3, k) for k in range(4)] == [[0, 1, 2], [2, 1, 0], [0, 1, 2], [2, 1, 0]]
    # over two rounds every plan's mean position is the same
    assert {i: round_order(5, 0).index(i) + round_order(5, 1).index(i) for i in range(5)} == dict.fromkeys(range(5), 4)


def test_relative_cancels_each_rounds_speed():
    base = [1.0, 1.1, 0.9]
    speed = [1.0, 1.5, 0.8, 2.0]  # the host's speed round by round
    steps = [[b * s for s in speed] for b in base]
    rel = relative(steps)
    for b, r in zip(base, rel):
        assert r == pytest.approx([b / 1.0] * 4)  # the round's median step is plan 0's
    # a plan missing from a round is left out of it; a round with one plan read says nothing
    gaps = relative([[1.0, 2.0, None], [2.0, None, 4.0]])
    assert gaps == [[pytest.approx(2 / 3)], [pytest.approx(4 / 3)]]


def test_regret_is_over_the_fastest():
    assert regret({"a": 1.0, "b": 1.05, "c": 0.98}, "b") == pytest.approx(1.05 / 0.98 - 1)
    assert regret({"a": 1.0, "b": 1.05}, "a") == 0.0


def _duel(rank, world, plans):
    return head_to_head(plans, MODEL, WORK, rounds=3, warmup=1)


def test_head_to_head_reads_every_plan_every_round_the_same_on_every_rank():
    plans = [Plan(algorithm="ring", degrees={"ring": 2}, token_layout="zigzag"),
             Plan(algorithm="ulysses", degrees={"ulysses": 2}),
             Plan(algorithm="ring", degrees={"ring": 2}, zero_stage=3, checkpointing="full")]
    res = run_world(_duel, 2, plans, timeout=120)
    assert res[0] == res[1]  # the max over ranks, gathered: every rank returns the same readings
    assert len(res[0]) == 3 and all(len(s) == 3 and all(x > 0 for x in s) for s in res[0])


def _pipeline(rank, world, plans):
    from sp_plan.profiles.tune import candidate

    parts = []
    real = candidate.composed_step
    candidate_step = lambda *a: (parts.append(a), real(*a))[1]  # noqa: E731
    import sp_plan.profiles.tune.head_to_head as h2h

    h2h.composed_step = candidate_step
    try:
        steps = head_to_head(plans, MODEL, WORK, rounds=2, warmup=0)
    finally:
        h2h.composed_step = real
    return steps, parts


def test_a_pipeline_is_composed_from_one_stage_round_by_round():
    plans = [Plan(algorithm="ring", degrees={"ring": 2, "pp": 2}), Plan(algorithm="ulysses", degrees={"ulysses": 4})]
    steps, parts = run_world(_pipeline, 4, plans, timeout=120)[0]
    assert len(steps) == 2 and all(len(s) == 2 and all(x > 0 for x in s) for s in steps)
    pipe = [a for a in parts if a[1] == 2]
    flat = [a for a in parts if a[1] == 1]
    assert len(pipe) == len(flat) == 2  # one composed step of each plan a round
    assert all(m >= 1 and sends > 0 and sync_s >= 0 for m, _, _, sends, _, sync_s in pipe)  # sends timed
    assert all(sends == 0.0 and sync_s == 0.0 for *_, sends, _, sync_s in flat)  # the sync inside the steps


def test_composed_step_is_1f1b():
    from sp_plan.profiles.tune.candidate import composed_step

    assert composed_step(4, 1, 0.5, 9.0, 0.1) == pytest.approx(4 * 0.5 + 0.1)  # no pipeline: no sends
    assert composed_step(4, 2, 0.5, 0.2, 0.1) == pytest.approx((4 + 2 - 1) * (0.5 + 0.2) + 0.1)
    # the gradients' sync once a step, not once a micro-batch
    assert composed_step(4, 2, 0.5, 0.2, 0.1, 0.3) == pytest.approx((4 + 2 - 1) * (0.5 + 0.2) + 0.3 + 0.1)


# ---------------------------------------------------------------- bench_tune's judgement

@pytest.fixture(scope="module")
def bt(script):
    return script("benchmarks/bench_tune.py")


def test_head_to_head_times_pool_the_launches(bt):
    names = ["a", "b", "c"]
    launches = [[[1.0, 2.0], [1.1, 2.2], [0.9, 1.8]],  # launch 1: b 10 % slower, c 10 % faster than a
                [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.2, 1.2, 1.2]]]  # launch 2: c 20 % slower
    h = bt.head_to_head_times({"layouts": names, "launches": launches})
    assert h["rounds"] == 5
    assert h["launches"][0] == pytest.approx({"a": 1.0, "b": 1.1, "c": 0.9})
    assert h["launches"][1] == pytest.approx({"a": 1.0, "b": 1.0, "c": 1.2})
    # pooled over the 5 rounds: c's paired readings 0.9, 0.9, 1.2, 1.2, 1.2
    assert h["pooled"] == pytest.approx({"a": 1.0, "b": 1.0, "c": 1.2})


def test_each_partys_pick_is_judged_by_the_head_to_head_readings(bt, tmp_path):
    from sp_plan.planner.cluster import Cluster

    truth = bt.read_json(KEPT, "truth-A.json")
    profile = bt.kept_profile(KEPT)
    cluster = Cluster.load(KEPT / "cluster.yaml")
    who = bt.picks(cluster, truth, profile)
    assert set(who) == {"model", "calibrated", "plan", "tune"}
    fits = {t["summary"] for t in truth if t["status"] == "ok"}
    assert all(v in fits for v in who.values())
    assert who["tune"] == min((c for c in profile.candidates if c.status == "ok"), key=lambda c: c.measured_s).summary
    names = list(dict.fromkeys([who["tune"], who["model"], "x"]))
    slow = {who["tune"]: 1.2, who["model"]: 1.0, "x": 0.96}
    readings = {"layouts": names, "launches": [[[slow[n]] * 4 for n in names]]}
    j = bt.judge_head_to_head(cluster, truth, profile, readings)
    assert j["best"] == "x"
    assert j["regret"]["tune"] == pytest.approx(slow[who["tune"]] / 0.96 - 1)
    assert j["regret"]["model"] == pytest.approx(slow[who["model"]] / 0.96 - 1)
    if who["calibrated"] not in names:
        assert j["regret"]["calibrated"] is None  # not read: said, not guessed

    # --rescore finds the readings kept beside the truth
    folder = tmp_path / "kept"
    bt.copy_kept(KEPT, folder / "local4")
    (folder / "local4" / bt.H2H).write_text(json.dumps(readings))
    res = bt.rescore(folder, "blocked")[0]
    assert res["head_to_head"]["regret"]["tune"] == pytest.approx(j["regret"]["tune"])


def test_decisive_layouts_hold_the_truths_fastest_and_every_pick(bt, tmp_path):
    from sp_plan.planner.cluster import Cluster

    shutil.copytree(KEPT, tmp_path / "w")
    truth = bt.read_json(KEPT, "truth-A.json")
    names = bt.decisive(tmp_path / "w", truth, 2, "fastest", pick=True)
    ok = sorted((t for t in truth if t["status"] == "ok"), key=lambda t: min(t["detail"]["readings_s"]))
    assert {t["summary"] for t in ok[:2]} <= set(names)
    who = bt.picks(Cluster.load(KEPT / "cluster.yaml"), truth, bt.kept_profile(KEPT))
    assert set(who.values()) <= set(names) and len(names) == len(set(names))


def test_head_to_head_needs_a_kept_truth_and_a_new_folder(tmp_path):
    import subprocess
    import sys

    bench = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_tune.py"
    r = subprocess.run([sys.executable, str(bench), "--worlds", "local4", "--head-to-head", "2"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--head-to-head K needs --truth DIR" in r.stderr and "Traceback" not in r.stderr
