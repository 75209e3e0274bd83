"""Fuzzing the model boundary: model files and --seq-len strings."""
from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from fuzzing import budget, dump, mutated, outcome, text_mutated, write
from sp_plan.planner.errors import PlanError
from sp_plan.planner.model import ModelSpec, Workload, parse_seq_len
from sp_plan.planner.search import grid_search
from sp_plan.profiles import load_model, preset_cluster

CPU = preset_cluster("cpu-local", 1)


@st.composite
def model_docs(draw) -> dict:
    """A small valid model: heads a multiple of kv_heads, hidden a multiple of heads (or head_dim given)."""
    kv = draw(st.integers(1, 4))
    heads = kv * draw(st.integers(1, 4))
    doc = {"name": draw(st.text(min_size=1, max_size=12)), "layers": draw(st.integers(1, 4)),
           "hidden": heads * draw(st.integers(1, 16)) * 4, "heads": heads, "kv_heads": kv,
           "gated_mlp": draw(st.booleans()), "vocab": draw(st.integers(0, 5000)),
           "dtype": draw(st.sampled_from(["bf16", "fp16", "fp32"]))}
    if draw(st.booleans()):
        doc["ffn_hidden"] = draw(st.integers(1, 2048))
    if draw(st.booleans()):
        doc["head_dim"] = draw(st.integers(1, 128))
    return doc


def _plan(m: ModelSpec):
    return grid_search(CPU, m, Workload(seq_len=512, batch=CPU.world_size), keep=1)


@budget(0.5)
@given(model_docs(), st.sampled_from([".yaml", ".json"]))
def test_valid_model_round_trips_and_plans(doc, suffix):
    with tempfile.TemporaryDirectory() as d:
        m = load_model(str(write(Path(d), f"m{suffix}", dump(doc, suffix))))
        again = load_model(str(write(Path(d), f"again{suffix}", dump(m.model_dump(mode="json"), suffix))))
    assert again == m and m.heads % m.kv_heads == 0
    assert _plan(m).ranked


@given(model_docs().flatmap(mutated), st.sampled_from([".yaml", ".json"]))
def test_mutated_model_file_is_a_plan_error_or_plans(doc, suffix):
    with tempfile.TemporaryDirectory() as d:
        got = outcome(lambda: load_model(str(write(Path(d), f"m{suffix}", dump(doc, suffix)))))
    if isinstance(got, ModelSpec):  # still valid: it must price (or say no layout fits), never crash
        outcome(lambda: _plan(got))


@given(model_docs().map(lambda doc: dump(doc, ".yaml")).flatmap(text_mutated))
def test_damaged_model_file_is_a_plan_error_or_loads(data):
    with tempfile.TemporaryDirectory() as d:
        assert isinstance(outcome(lambda: load_model(str(write(Path(d), "m.yaml", data)))), (ModelSpec, PlanError))


@given(st.integers(1, 2**40), st.sampled_from(["", "k", "K", "m", "M", "g"]), st.sampled_from(["", " ", "\t"]))
def test_valid_seq_len_strings_parse(n, unit, pad):
    mult = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}[unit.lower()]
    if n * mult > 2**40:
        n = max(1, 2**40 // mult)
    assert parse_seq_len(f"{pad}{n}{unit}{pad}") == n * mult


@example("9" * 400)
@example("1e9")
@example("0.5k")
@example("-1")
@example("99999999999999999999g")
@example("١٢٣")  # Arabic-Indic digits
@example("nan")
@given(st.one_of(st.text(max_size=30), st.from_regex(r"\s*[0-9.]{1,30}\s*[kKmMgGx]?\s*", fullmatch=True)))
def test_any_seq_len_text_is_a_length_or_a_plan_error(text):
    got = outcome(lambda: parse_seq_len(text))
    if isinstance(got, PlanError):
        assert got.field == "seq_len"
    else:
        assert isinstance(got, int) and 0 < got <= 2**40
        assert Workload(seq_len=text).seq_len == got
