"""What a saved plan file holds and how a plan labels itself: defaults that mean a plain schedule (virtual_stages 1,
kv_chunks 1) are written absent, so the file reads in versions without those fields, no field is written null, a .JSON path is JSON, the file's mode follows the umask;
the summary, degree text and world check name the dimensions above 1."""
from __future__ import annotations

import json
import os

import pytest

from sp_plan.planner import Plan, PlanError
from sp_plan.planner import yamlio
from sp_plan.planner.plan import Prediction, order_text


def saved_text(plan: Plan, tmp_path, name: str = "plan.yaml") -> str:
    path = tmp_path / name
    plan.save(path)
    return path.read_text()


@pytest.mark.parametrize("kw", [{"virtual_stages": 1, "degrees": {"ring": 2, "pp": 2}},
                                {"kv_chunks": 1, "algorithm": "allgather"}])
def test_a_plain_schedules_defaults_are_left_out_of_the_file(tmp_path, kw):
    plan = Plan(**{"algorithm": "ring", "degrees": {"ring": 2}, **kw})
    text = saved_text(plan, tmp_path)
    assert "virtual_stages" not in text and "kv_chunks" not in text
    assert plan == Plan.load(tmp_path / "plan.yaml")


def test_no_field_is_written_null(tmp_path):
    text = saved_text(Plan(algorithm="ring", degrees={"ring": 2}), tmp_path)
    assert "null" not in text and "placement" not in text and "model" not in text


def test_a_json_suffix_in_any_case_writes_json(tmp_path):
    text = saved_text(Plan(algorithm="ring", degrees={"ring": 2}), tmp_path, "plan.JSON")
    assert json.loads(text)["degrees"]["ring"] == 2


def test_a_written_file_has_the_mode_the_umask_gives(tmp_path):
    old = os.umask(0o022)
    try:
        path = tmp_path / "plan.yaml"
        yamlio.atomic_write(path, "a: 1\n")
        assert os.stat(path).st_mode & 0o777 == 0o644  # 0o666 & ~0o022, as open() would make it
    finally:
        os.umask(old)


def prediction(peak: float, capacity: float | None = None) -> Prediction:
    extra = {} if capacity is None else {"memory_capacity_bytes": capacity}
    return Prediction(step_time_s=1.0, tokens_per_s=1.0, mfu=0.5, peak_memory_bytes=peak, **extra)


def test_a_prediction_fits_up_to_its_capacity_and_always_without_one():
    assert prediction(80e9, 80e9).fits and not prediction(80e9 + 1, 80e9).fits
    assert prediction(80e9).fits


def test_labels_name_only_the_dimensions_above_1():
    plan = Plan(algorithm="usp", degrees={"ulysses": 4, "ring": 2, "tp": 2})
    assert sorted(plan.degree_text().split(" x ")) == ["ring=2", "tp=2", "ulysses=4"]
    assert plan.sp == 4 * 2  # ulysses x ring: tp splits heads, not the sequence
    assert order_text(["tp", "ring", "dp"], {"tp": 1, "ring": 4, "dp": 2}) == "ring<dp"


def test_the_summary_shows_the_token_layout_except_for_ulysses_and_a_micro_batch_above_1():
    assert Plan(algorithm="ulysses", degrees={"ulysses": 4}).summary().split() == [
        "ulysses", "ulysses4", "ulysses", "zero0"]
    assert Plan(algorithm="ring", degrees={"ring": 2}, micro_batch_size=2).summary().split()[-1] == "mbs2"


@pytest.mark.parametrize("world", [2, 8])
def test_a_world_of_another_size_is_refused_either_way(world):
    plan = Plan(algorithm="ring", degrees={"ring": 4})
    plan.check_world(4)
    with pytest.raises(PlanError, match=f"the plan needs 4 ranks \\(ring=4\\), the world has {world}") as e:
        plan.check_world(world)
    assert e.value.field == "world_size"


def test_a_plan_without_an_order_nests_tp_innermost_then_ulysses_ring_dp_pp():
    plan = Plan(algorithm="usp", degrees={"dp": 2, "ring": 2, "ulysses": 2, "tp": 2})
    assert plan.order == ["tp", "ulysses", "ring", "dp"]
    # innermost first: rank = t + 2 u + 4 r + 8 d, so a tp group is two consecutive ranks
    assert [0, 1] in plan.with_groups().groups["tp"]
