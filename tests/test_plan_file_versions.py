"""A plan file's schema_version: version 1 and a file without one load; a newer, an unwritten (below 1) or a
non-integer version is refused as ``plan.schema_version`` before any other field is read."""
from __future__ import annotations

import pytest

from sp_plan.planner import Plan, PlanError
from sp_plan.profiles.plans import load_plan

RING = "algorithm: ring\ndegrees: {ring: 2}\n"


def write(tmp_path, head: str):
    path = tmp_path / "plan.yaml"
    path.write_text(head + RING)
    return path


@pytest.mark.parametrize("head", ["", "schema_version: 1\n"])
def test_a_version_1_file_and_one_without_a_version_load(tmp_path, head):
    path = write(tmp_path, head)
    assert load_plan(path).degrees["ring"] == 2
    assert Plan.load(path).schema_version == 1


@pytest.mark.parametrize("version,words", [
    ("2", "newer than this sp-plan"),
    ("0", "never written by sp-plan"),
    ("-1", "never written by sp-plan"),
    ("true", "whole number"),
    ("'1'", "whole number"),
    ("1.0", "whole number"),
])
def test_a_version_sp_plan_never_wrote_is_refused_by_its_field(tmp_path, version, words):
    path = write(tmp_path, f"schema_version: {version}\n")
    for read in (load_plan, Plan.load):
        with pytest.raises(PlanError, match=words) as e:
            read(path)
        assert e.value.field == "plan.schema_version"


def test_a_newer_file_is_refused_before_its_model_name_is_looked_up(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text("schema_version: 2\n" + RING + "model: a-model-a-newer-sp-plan-knows\n")
    with pytest.raises(PlanError) as e:
        load_plan(path)
    assert e.value.field == "plan.schema_version"
