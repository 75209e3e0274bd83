"""A plan's layout refused by the field that is wrong: degrees an algorithm cannot run, a placement or team on an
algorithm without one, a balanced layout without documents, a layout ulysses cannot attend, more ranks than any
cluster, bounds of zero_stage and micro_batch_size, and a plan file's model that is neither a name nor fields."""
from __future__ import annotations

import pytest

from sp_plan.planner import Plan, PlanError
from sp_plan.planner.model import Workload
from sp_plan.planner.plan import MAX_WORLD
from sp_plan.profiles.plans import load_plan


@pytest.mark.parametrize("kw,field", [
    ({"algorithm": "ring", "degrees": {"ring": 2, "ulysses": 2}}, "degrees.ulysses"),
    ({"algorithm": "ulysses", "degrees": {"ring": 2, "ulysses": 2}}, "degrees.ring"),
    ({"algorithm": "ring", "degrees": {"ring": 4, "team": 2}}, "degrees.team"),
    ({"algorithm": "tokenring_ring", "degrees": {"ring": 4, "team": 2}, "placement": "p2p_intra"}, "placement"),
    ({"algorithm": "ring", "degrees": {"ring": 2}, "kv_chunks": 2}, "kv_chunks"),
    ({"algorithm": "ulysses", "degrees": {"ulysses": 2}, "token_layout": "zigzag"}, "token_layout"),
    ({"algorithm": "ring", "degrees": {"ring": 2}, "token_layout": "balanced",
      "workload": Workload(seq_len=8192)}, "token_layout"),
    ({"algorithm": "ring", "degrees": {"ring": MAX_WORLD + 1}}, "degrees"),
])
def test_a_layout_is_refused_by_the_field_that_is_wrong(kw, field):
    with pytest.raises(PlanError) as e:
        Plan(**kw)
    assert e.value.field == field


def test_usp_takes_ulysses_and_ring_and_max_world_ranks_is_a_plan():
    assert Plan(algorithm="usp", degrees={"ulysses": 2, "ring": 2}).sp == 4
    assert Plan(algorithm="ring", degrees={"ring": MAX_WORLD}).world_size == MAX_WORLD


@pytest.mark.parametrize("kw", [{"zero_stage": 4}, {"zero_stage": -1}, {"micro_batch_size": 0}])
def test_zero_stage_and_micro_batch_size_outside_their_range_are_refused(tmp_path, kw):
    path = tmp_path / "plan.json"
    path.write_text('{"algorithm": "ring", "degrees": {"ring": 2}, "%s": %d}' % next(iter(kw.items())))
    with pytest.raises(PlanError) as e:
        load_plan(path)
    assert e.value.field == f"plan.{next(iter(kw))}"


@pytest.mark.parametrize("model", ["7", "[llama3-8b]"])
def test_a_model_that_is_neither_a_name_nor_fields_is_refused_naming_both_forms(tmp_path, model):
    path = tmp_path / "plan.yaml"
    path.write_text(f"algorithm: ring\ndegrees: {{ring: 2}}\nmodel: {model}\n")
    with pytest.raises(PlanError, match="neither a preset's name nor a model") as e:
        load_plan(path)
    assert e.value.field == "plan.model"
