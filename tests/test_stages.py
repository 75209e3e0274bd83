"""Uneven pipeline stages: the plan field, the balancer, and the estimator pricing the busiest and largest stage."""
from __future__ import annotations

import pytest

from sp_plan.planner import Plan, PlanError
from sp_plan.planner.estimate import Estimator
from sp_plan.planner.model import Workload
from sp_plan.planner.stages import balanced_stage_layers, stage_times
from sp_plan.profiles import load_cluster, load_model

LLAMA3_405B = load_model("llama3-405b")


def test_llama3_405b_on_16_stages_balances_as_published():
    """126 layers on 16 stages: one layer fewer on the first and the last (Llama 3 §3.3.2), with or without the
    128k sequence's attention in the layers' cost."""
    published = (7,) + (8,) * 14 + (7,)
    assert balanced_stage_layers(LLAMA3_405B, 16) == published
    assert balanced_stage_layers(LLAMA3_405B, 16, Workload(seq_len=131072, batch=128)) == published


@pytest.mark.parametrize("model,pp", [("llama3-8b", 3), ("llama3-8b", 4), ("llama3-70b", 3), ("llama3-70b", 8),
                                      ("llama3-405b", 5), ("tiny-llama", 8)])
def test_balanced_stages_hold_every_layer_and_no_split_has_a_less_busy_stage(model, pp):
    m = load_model(model)
    s = balanced_stage_layers(m, pp)
    assert len(s) == pp and sum(s) == m.layers and min(s) >= 1
    best = max(stage_times(s, m))
    for i in range(pp):  # moving one layer anywhere never lowers the busiest stage
        for j in range(pp):
            if i != j and s[i] > 1:
                moved = list(s)
                moved[i] -= 1
                moved[j] += 1
                assert max(stage_times(moved, m)) >= best * (1 - 1e-12)


def test_a_large_lm_head_takes_layers_off_the_last_stage():
    """llama3-8b's head (2 x 128256 x 4096 FLOPs a token) outweighs two of its layers: the last stage holds fewer."""
    s = balanced_stage_layers(load_model("llama3-8b"), 4)
    assert s[-1] <= min(s[:-1]) - 2


def test_more_stages_than_layers_is_refused():
    with pytest.raises(PlanError, match="degrees.pp.*pp 9 needs at least one layer a stage"):
        balanced_stage_layers(load_model("tiny-llama"), 9)


@pytest.mark.parametrize("layers,why", [([2, 2, 2], "3 stages listed for pp 4"),
                                        ([3, 3, 2, 0], "at least one layer"),
                                        ([2, 2, 2, 3], "hold 9 layers, the model has 8")])
def test_stage_layers_that_do_not_fit_pp_or_the_model_are_refused_naming_the_field(layers, why):
    with pytest.raises(PlanError, match=f"stage_layers: .*{why}"):
        Plan(algorithm="ring", degrees={"pp": 4, "ring": 2}, stage_layers=layers, model=load_model("tiny-llama"))


def test_stage_layers_round_trip_through_the_plan_file_and_old_files_still_load(tmp_path):
    p = Plan(algorithm="allgather", degrees={"pp": 4, "ring": 2}, stage_layers=[1, 3, 3, 1])
    p.save(tmp_path / "p.yaml")
    assert "stage_layers" in (tmp_path / "p.yaml").read_text() and Plan.load(tmp_path / "p.yaml") == p
    assert "stages:1,3x2,1" in p.summary()
    even = Plan(algorithm="ring", degrees={"pp": 4, "ring": 2})
    even.save(tmp_path / "even.yaml")
    assert "stage_layers" not in (tmp_path / "even.yaml").read_text()
    assert Plan.load(tmp_path / "even.yaml").stage_layers is None


def _estimator(model="tiny-llama", batch=8):
    return Estimator(load_cluster("dgx-h100", 1), load_model(model), Workload(seq_len=4096, batch=batch))


def _plan(stages=None, pp=4):
    return Plan(algorithm="ring", degrees={"pp": pp, "ring": 8 // pp}, stage_layers=stages)


def test_pp_that_does_not_divide_the_layers_needs_stage_layers_and_the_error_offers_a_balanced_split():
    est = Estimator(load_cluster("dgx-h100", 1), load_model("llama3-405b"), Workload(seq_len=4096, batch=8))
    with pytest.raises(PlanError, match=r"degrees.pp: pp 8 does not divide the 126 layers; give stage_layers "
                                        r"\(balanced: \[\d+(, \d+){7}\]\)"):
        est(Plan(algorithm="ring", degrees={"pp": 8}))
    s = balanced_stage_layers(est.model, 8, est.work)
    assert est(Plan(algorithm="ring", degrees={"pp": 8}, stage_layers=list(s))).step_time_s > 0


def test_an_even_list_prices_exactly_as_no_list():
    est = _estimator()
    assert est(_plan([2, 2, 2, 2])) == est(_plan())
    from sp_plan.planner.stages import resolve_stage_layers

    assert resolve_stage_layers(est.model, 4, [2, 2, 2, 2]) is None  # the same layout: a plan file records no list
    assert resolve_stage_layers(est.model, 4, [1, 3, 2, 2]) == (1, 3, 2, 2)


def _stage(pred, pp=4):
    """Seconds of one pipeline stage: the bubble row is (pp - 1) stages."""
    return next(b.seconds for b in pred.breakdown if b.name == "pipeline bubble") / (pp - 1)


def test_the_pipeline_runs_at_its_busiest_stage():
    """stage = max(most layers before the last x layer, last's layers x layer + head) + sends: moving layers between
    the stages before the last changes nothing while their maximum stays; a layer moved onto the last costs a layer."""
    est = _estimator()
    even = est(_plan())
    m = est.work.batch  # micro-batches: batch 8 over dp 1, one sequence each
    row = {b.name: b.seconds for b in even.breakdown}
    head, sends = row["lm head"] / m, (row["pp send activations"] + row["pp send gradients"]) / m
    layer = _stage(est(_plan([1, 2, 2, 3]))) - _stage(even)  # the last stage holds the head in both
    assert layer > 0 and _stage(even) == pytest.approx(2 * layer + head + sends)
    light_last = _stage(est(_plan([3, 2, 2, 1])))
    assert light_last == pytest.approx(max(3 * layer, layer + head) + sends)
    assert _stage(est(_plan([2, 3, 2, 1]))) == pytest.approx(light_last)
    assert _stage(est(_plan([2, 2, 3, 1]))) == pytest.approx(light_last)


def test_memory_is_the_largest_stages():
    est = _estimator()
    even, heavy = est(_plan()), est(_plan([1, 1, 1, 5]))
    assert heavy.memory["activations"] == pytest.approx(even.memory["activations"] * 5 / 2)
    assert heavy.memory["weights"] > even.memory["weights"]


def test_the_first_stage_holds_the_embedding_and_the_last_the_lm_head():
    """Weights of the most loaded stage (Megatron): its blocks, the embedding on the first, the LM head on the last,
    neither on a middle one."""
    from sp_plan.planner.schedules import shard_params

    m = load_model("tiny-llama")
    layer, emb = m.layer_params(), m.vocab * m.hidden
    assert shard_params(m, 1, 2, (5, 3)) == 5 * layer + emb
    assert shard_params(m, 1, 2, (3, 5)) == 5 * layer + emb
    assert shard_params(m, 2, 3, (1, 6, 1)) == 6 * layer / 2  # the middle stage: blocks alone, over tp
    assert shard_params(m, 1, 3, (3, 2, 3)) == 3 * layer + emb


def test_the_breakdown_of_a_tie_between_a_middle_and_the_last_stage_is_the_last_with_its_head():
    """(1, 3, 1, 3): the second stage holds as many layers as the last, which also runs the LM head, so the last is
    the busiest; its rows (the head among them) add up to the step."""
    pred = _estimator()(_plan([1, 3, 1, 3]))
    names = [b.name for b in pred.breakdown]
    assert "lm head" in names
    assert sum(b.exposed_seconds for b in pred.breakdown) == pytest.approx(pred.step_time_s, rel=1e-9)


def test_a_balanced_split_beats_the_even_one_where_the_head_is_large():
    """llama3-8b on 4 stages: the even split's last stage carries 8 layers and the head; the balanced one less."""
    est = _estimator("llama3-8b", batch=16)
    even = est(Plan(algorithm="ring", degrees={"pp": 4, "ring": 2}))
    bal = est(Plan(algorithm="ring", degrees={"pp": 4, "ring": 2},
                   stage_layers=list(balanced_stage_layers(est.model, 4, est.work))))
    assert bal.step_time_s < even.step_time_s


def _cli(*args):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "sp_plan.cli.app", *args], capture_output=True, text=True, timeout=120)


def test_sp_plan_estimate_reads_stage_layers_from_the_plan_file(tmp_path):
    m = load_model("llama3-405b")
    work = Workload(seq_len=8192, batch=16)
    base = dict(algorithm="ring", degrees={"pp": 8}, model=m, workload=work)
    Plan(**base, stage_layers=[15, 16, 16, 16, 16, 16, 16, 15]).save(tmp_path / "uneven.yaml")
    r = _cli("estimate", str(tmp_path / "uneven.yaml"), "--cluster", "dgx-h100", "--no-profile")
    assert r.returncode == 0, r.stderr
    assert "stages:15,16x6,15" in r.stdout and "pipeline bubble" in r.stdout
    Plan(**base).save(tmp_path / "even.yaml")
    r = _cli("estimate", str(tmp_path / "even.yaml"), "--cluster", "dgx-h100", "--no-profile")
    assert r.returncode == 2 and "pp 8 does not divide the 126 layers; give stage_layers" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_candidate_without_stages_whose_pp_divides_no_layers_is_priced_balanced():
    """The search's candidates carry no stage list: where pp divides no layers the estimator balances them, and
    prices them as the plan that writes that split."""
    from sp_plan.planner.candidate import Candidate

    est = Estimator(load_cluster("dgx-h100", 1), LLAMA3_405B, Workload(seq_len=4096, batch=8))
    cand = Candidate("ring", pp=8, order=("pp",))
    split = est.stages_of(cand)
    assert split == balanced_stage_layers(LLAMA3_405B, 8, est.work) and sum(split) == 126
    plan = Plan(algorithm="ring", degrees={"pp": 8}, stage_layers=list(split))
    assert est.predict(cand).step_time_s == est(plan).step_time_s
    assert est.with_stages(cand).to_plan().stage_layers == list(split)  # what the search's winners write
    even = Candidate("ring", pp=2, order=("pp",))
    assert est.with_stages(even) is even and even.to_plan().stage_layers is None


def test_the_estimator_checks_stage_layers_against_the_model_a_plan_does_not_name():
    est = _estimator()
    with pytest.raises(PlanError, match="stage_layers: the stages hold 9 layers, the model has 8"):
        est(_plan([3, 2, 2, 2]))
