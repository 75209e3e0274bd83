"""Fuzzing the plan-file boundary: plans sp-plan wrote, plans written by hand, damaged and newer ones."""
from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st
from typer.testing import CliRunner

from fuzzing import budget, dump, mutated, outcome, text_mutated, write
from sp_plan.cli.app import app
from sp_plan.planner.errors import PlanError
from sp_plan.planner.estimate import Estimator
from sp_plan.planner.model import Workload
from sp_plan.planner.plan import ALGORITHMS, PLAN_SCHEMA_VERSION, Plan
from sp_plan.planner.search import finish, grid_search
from sp_plan.profiles import load_model, preset_cluster

TINY = load_model("tiny-gpt")
RUN = CliRunner()


@functools.cache
def _written_plans() -> list[dict]:
    """Plans as `sp-plan plan -o` writes them (groups, model, workload, predictions) on a few clusters."""
    docs = []
    for name, nodes in (("cpu-local", 1), ("dgx-h100", 1), ("a10-4-pcie", 2)):
        c = preset_cluster(name, nodes)
        w = Workload(seq_len=4096, batch=2)
        for p in finish(grid_search(c, TINY, w, keep=3), c, TINY, w, 3):
            docs.append(p.model_dump(mode="json", exclude_none=True))
    return docs


# searched when a property first draws one, not when the module is collected (every run, even one that
# deselects these properties, would pay for the searches)
WRITTEN = st.deferred(lambda: st.sampled_from(_written_plans()))


@st.composite
def hand_plans(draw) -> dict:
    """A hand-written plan: algorithm, degrees (powers of two), maybe an order and a token layout."""
    a = draw(st.sampled_from(ALGORITHMS))
    deg = {n: draw(st.sampled_from([1, 1, 2, 4])) for n in ("tp", "ulysses", "ring", "dp", "pp")}
    if a == "ring":
        deg["ulysses"] = 1
    if a == "ulysses":
        deg["ring"] = 1
    if a in ("wallfacer", "tokenring_ring"):
        deg["team"] = draw(st.sampled_from([1, 2]))
    doc = {"algorithm": a, "degrees": deg,
           "token_layout": "contiguous" if a == "ulysses" else draw(st.sampled_from(["contiguous", "zigzag", "striped"])),
           "zero_stage": draw(st.integers(0, 3)), "checkpointing": draw(st.sampled_from(["none", "full", "attention_boundary"]))}
    if draw(st.booleans()):
        doc["order"] = draw(st.permutations(["tp", "ulysses", "ring", "dp", "pp"]))
    return doc


def show(path: Path):
    return RUN.invoke(app, ["show", str(path)])


def _clean_exit(r) -> None:
    """Exit 0, or exit 2 with one 'error:' line; never a traceback."""
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert r.exit_code in (0, 2), (r.exit_code, r.output)
    if r.exit_code == 2:
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), r.output


@given(WRITTEN, st.sampled_from([".yaml", ".json"]))
def test_written_plans_round_trip_and_show(doc, suffix):
    with tempfile.TemporaryDirectory() as d:
        path = write(Path(d), f"p{suffix}", dump(doc, suffix))
        p = Plan.load(path)
        p.save(path)
        assert Plan.load(path) == p and p.model_dump(mode="json", exclude_none=True) == doc
        r = show(path)
    assert r.exit_code == 0 and p.summary() in r.output


@budget(0.5)
@given(hand_plans())
def test_valid_hand_plans_round_trip_and_price(doc):
    p = outcome(lambda: Plan(**doc))
    assume(isinstance(p, Plan))
    with tempfile.TemporaryDirectory() as d:
        p.save(Path(d) / "p.yaml")
        assert Plan.load(Path(d) / "p.yaml") == p
        assert show(Path(d) / "p.yaml").exit_code == 0
    c = preset_cluster("cpu-local", 1, devices_per_node=p.world_size)
    pred = outcome(lambda: Estimator(c, TINY, Workload(seq_len=2 * 1024 * p.world_size, batch=p.degrees["dp"]))(p))
    if not isinstance(pred, PlanError):  # a layout the model cannot take (heads, layers) is a clear error
        assert 0 < pred.step_time_s < float("inf") and pred.tokens_per_s > 0


@example({"algorithm": "wallfacer", "degrees": {"team": 2}}, ".yaml")  # found by the dev profile
@example({"algorithm": "ring", "degrees": {"ring": 2}, "groups": {"ring": []}}, ".yaml")
@example({"algorithm": "ring", "degrees": {"ring": 2}, "groups": {"ring": [[0, 1], [5]]}}, ".json")
@example({"algorithm": "ring", "degrees": {"ring": 2, "dp": 10**12}}, ".yaml")
@given(st.one_of(WRITTEN, hand_plans()).flatmap(mutated), st.sampled_from([".yaml", ".json"]))
def test_mutated_plan_file_is_a_plan_error_or_shows(doc, suffix):
    with tempfile.TemporaryDirectory() as d:
        path = write(Path(d), f"p{suffix}", dump(doc, suffix))
        got = outcome(lambda: Plan.load(path))
        r = show(path)
        _clean_exit(r)
        assert (r.exit_code == 0) == isinstance(got, Plan)
        if isinstance(got, Plan):
            got.save(path)
            assert Plan.load(path) == got


@given(WRITTEN.map(lambda doc: dump(doc, ".yaml")).flatmap(text_mutated), st.sampled_from([".yaml", ".json"]))
def test_damaged_plan_file_is_a_plan_error_or_loads(data, suffix):
    with tempfile.TemporaryDirectory() as d:
        path = write(Path(d), f"p{suffix}", data)
        got = outcome(lambda: Plan.load(path))
        assert isinstance(got, (Plan, PlanError))
        _clean_exit(show(path))


@given(WRITTEN, st.integers(PLAN_SCHEMA_VERSION + 1, 10**9))
def test_newer_plan_is_refused_naming_both_versions(doc, version):
    with tempfile.TemporaryDirectory() as d:
        path = write(Path(d), "p.yaml", dump({**doc, "schema_version": version, "field_from_the_future": 1}, ".yaml"))
        e = outcome(lambda: Plan.load(path))
        r = show(path)
    assert isinstance(e, PlanError) and e.field == "plan.schema_version"
    assert f"schema_version {version}" in e.problem and f"({PLAN_SCHEMA_VERSION})" in e.problem
    assert r.exit_code == 2 and "newer than this sp-plan" in r.output


@pytest.mark.parametrize("value", ["true", '"4"', "4.5"])
def test_a_degree_that_is_no_whole_count_is_refused(tmp_path, value):
    """``ring: true`` or ``ring: "4"`` is a typo, not 1 or 4: a degree is an integer, as the tool writes it."""
    (tmp_path / "p.yaml").write_text(f"algorithm: ring\ndegrees: {{ring: {value}}}\n")
    with pytest.raises(PlanError) as e:
        Plan.load(tmp_path / "p.yaml")
    assert e.value.field == "plan.degrees.ring"
