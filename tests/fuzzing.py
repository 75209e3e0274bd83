"""Shared Hypothesis strategies and checks for the fuzz suites (tests/test_fuzz_*.py).

The property every boundary must keep: a valid input loads and round-trips; anything else raises
sp-plan's own PlanError naming the field and the fix (one line), never another exception.
"""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any, Callable

import yaml
from hypothesis import settings
from hypothesis import strategies as st

from sp_plan.planner.errors import PlanError


def budget(fraction: float) -> settings:
    """The active profile's example budget scaled for an expensive property (at least 2 cases)."""
    return settings(max_examples=max(2, round(settings().max_examples * fraction)))


def check_plan_error(e: PlanError) -> None:
    """The project's error: a field, a problem and a fix, on one line."""
    assert e.field and e.problem and e.fix, repr(e)
    assert "\n" not in str(e), f"multi-line error: {e!r}"


def outcome(fn: Callable[[], Any]) -> Any:
    """fn()'s value, or the PlanError it raised (checked); any other exception fails the property."""
    try:
        return fn()
    except PlanError as e:
        check_plan_error(e)
        return e


# ---- values a mutation puts where a field was
ODD_SCALARS = st.sampled_from([None, True, False, 0, -1, -(10**30), 10**30, 1.5, -0.0, 1e308, -1e308,
                               math.nan, math.inf, -math.inf, "", "x", "名前-ü", "\x00\x01", "1e9", "nan", "-5",
                               "128k", " ", "a" * 5000])
ODD_VALUES = st.one_of(ODD_SCALARS, st.just([]), st.just({}), st.just([1, "a", None]), st.just({"x": {"y": []}}),
                       st.text(max_size=20), st.integers(), st.floats())
KEYS = st.one_of(st.sampled_from(["extra", "schema_version", "name", "ünïcode", "", " ", "0", "null"]),
                 st.text(min_size=1, max_size=12))


def paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (tuple of keys/indices) into a JSON-like document, the root included."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += paths(v, prefix + (i,))
    return out


def _parent(doc: Any, path: tuple):
    for k in path[:-1]:
        doc = doc[k]
    return doc


@st.composite
def mutated(draw, doc: dict, rounds: int = 3) -> dict:
    """``doc`` with 1..``rounds`` mutations: a key dropped, an extra key, a value replaced by a wrong-typed,
    out-of-range, NaN/inf, unicode or huge one, a list emptied or doubled."""
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, rounds))):
        ps = paths(doc)
        p = draw(st.sampled_from(ps))
        how = draw(st.sampled_from(["drop", "extra", "replace", "replace", "empty", "double"]))
        if not p:  # the root: add a key or replace the whole document
            if how == "replace":
                return copy.deepcopy(draw(st.one_of(ODD_VALUES, st.just(doc))))
            if isinstance(doc, dict):
                doc[draw(KEYS)] = copy.deepcopy(draw(ODD_VALUES))
            continue
        parent, key = _parent(doc, p), p[-1]
        value = parent[key]
        if how == "drop":
            del parent[key]
        elif how == "extra" and isinstance(value, dict):
            value[draw(KEYS)] = copy.deepcopy(draw(ODD_VALUES))
        elif how == "empty" and isinstance(value, (list, dict)):
            parent[key] = type(value)()
        elif how == "double" and isinstance(value, list):
            parent[key] = value + copy.deepcopy(value)
        else:
            parent[key] = copy.deepcopy(draw(ODD_VALUES))
    return doc


def dump(doc: Any, suffix: str) -> str:
    """A document as sp-plan's file text (YAML, or JSON for .json; NaN/inf as JSON's NaN/Infinity)."""
    if suffix == ".json":
        return json.dumps(doc, indent=1)
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


@st.composite
def text_mutated(draw, text: str) -> bytes:
    """The bytes of a file, damaged: truncated, a key line duplicated, binary noise, a huge line, or deep nesting."""
    data = text.encode()
    how = draw(st.sampled_from(["truncate", "duplicate", "binary", "splice", "huge", "nest", "empty", "alias_bomb"]))
    if how == "truncate":
        return data[:draw(st.integers(0, max(0, len(data) - 1)))]
    if how == "duplicate":
        lines = text.splitlines(keepends=True)
        tops = [ln for ln in lines if ln[:1].isalpha()] or lines or ["a: 1\n"]
        return (text + draw(st.sampled_from(tops))).encode()
    if how == "binary":
        return draw(st.binary(min_size=1, max_size=200))
    if how == "splice":
        at = draw(st.integers(0, len(data)))
        return data[:at] + draw(st.binary(min_size=1, max_size=30)) + data[at:]
    if how == "huge":
        return data + b"\nhuge: " + b"9" * draw(st.sampled_from([400, 5000, 200_000])) + b"\n"
    if how == "nest":
        n = draw(st.sampled_from([50, 50, 2000]))
        return b"x: " + b"[" * n + b"]" * n + b"\n"
    if how == "alias_bomb":
        lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
        lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
        return ("\n".join(lines) + "\n").encode()
    return b""


def write(tmp: Path, name: str, data: bytes | str) -> Path:
    p = tmp / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode())  # test input, not an sp-plan output
    return p
