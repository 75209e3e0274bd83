"""What sp-plan's YAML/JSON reader refuses and how it reads numbers: a key given twice, an alias bomb, nesting past
MAX_DEPTH (both loaders at the same depth), a sealed file cut short; ``5e-6`` written without a dot is a float,
and a string that looks like one is written quoted so that it reads back as a string."""
from __future__ import annotations

import pytest
import yaml

from sp_plan.planner import PlanError
from sp_plan.planner import yamlio


@pytest.mark.parametrize("name,text", [("dup.yaml", "a: 1\na: 2\n"), ("dup.json", '{"a": 1, "a": 2}')])
def test_a_key_given_twice_is_refused(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(PlanError, match="duplicate key 'a'"):
        yamlio.read_data(path, "plan")


def test_aliases_that_expand_past_max_nodes_are_refused(tmp_path):
    # 10 values, each level repeats the one below 10 times: 10**7 values once expanded, from ~400 bytes
    lines = ["a0: &a0 [" + ", ".join(["1"] * 10) + "]"]
    for i in range(1, 7):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(PlanError, match="expands to more than"):
        yamlio.read_data(path, "plan")


def nested(levels: int) -> str:
    return "[" * levels + "1" + "]" * levels


def test_both_loaders_read_max_depth_nodes_and_refuse_one_more():
    """MAX_DEPTH nodes deep (MAX_DEPTH - 1 lists around a scalar) reads; one list more is refused, alike by the
    libyaml path (``yaml_load``) and the Python loader."""
    ok, deep = nested(yamlio.MAX_DEPTH - 1), nested(yamlio.MAX_DEPTH)
    assert yamlio.yaml_load(ok) == yaml.load(ok, Loader=yamlio._Loader)  # noqa: S506 - a SafeLoader subclass
    for load in (yamlio.yaml_load, lambda t: yaml.load(t, Loader=yamlio._Loader)):  # noqa: S506
        with pytest.raises(yaml.YAMLError, match="nesting deeper than"):
            load(deep)


def test_scientific_notation_without_a_dot_reads_as_a_float_and_a_lookalike_string_stays_a_string():
    assert yamlio.yaml_load("a: 5e-6\nb: -3e-2\nc: 1e9\n") == {"a": 5e-6, "b": -0.03, "c": 1e9}
    data = {"latency": "5e-6", "id": "123e4567"}
    assert yamlio.yaml_load(yamlio.yaml_dump(data)) == data


def test_a_sealed_file_cut_short_on_a_line_end_is_refused(tmp_path):
    path = tmp_path / "sealed.yaml"
    yamlio.dump_data({"params": {"a": 1}, "b": 2}, path, sealed=True)
    assert yamlio.read_data(path, "profile") == {"params": {"a": 1}, "b": 2}
    text = path.read_text()
    path.write_text(text[:text.rindex("b: 2")])  # still a YAML mapping, one field short
    with pytest.raises(PlanError, match="does not match the sha256"):
        yamlio.read_data(path, "profile")
