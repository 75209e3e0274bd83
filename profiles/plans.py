"""Plan files as a user writes them: the preset names a file may use resolved to the definitions the planner takes.

A plan file may name a model preset (``model: llama3-8b``) and a document-length distribution
(``workload: {documents: magi-short}``), as ``--model NAME`` and ``--documents NAME`` do on the command line and a
request to the service does inline. The planner's models take definitions and open no preset (planner/model.py);
this loader, beside the presets it reads, turns the names into them before the Plan is validated. Only names: a
path in a plan file would be read relative to wherever the command runs, so a file's model or lengths are written
into the plan (`sp-plan plan -o` writes them).
"""
from __future__ import annotations

from pathlib import Path

from sp_plan.planner.errors import PlanError
from sp_plan.planner.model import ModelSpec
from sp_plan.planner.plan import PLAN_SCHEMA_VERSION, Plan
from sp_plan.planner.yamlio import check_schema_version, model_from_data, read_data
from sp_plan.profiles import load_model, model_presets


#: what a plan file's ``model`` may be, as the fix of a refusal says it
MODEL_FORMS = "or the model's fields as a mapping (name, layers, hidden, heads, ...: as `sp-plan plan -o` writes them)"


def named_model(name: str) -> ModelSpec:
    """A plan file's ``model`` given as a preset's name: the preset (profiles/models/NAME.yaml)."""
    if name not in model_presets():
        raise PlanError("plan.model", f"{name!r} is no model preset", f"write one of {model_presets()}, {MODEL_FORMS}")
    return load_model(name, files=False)  # the preset, never a file of that name where the command runs


def resolve_names(data: dict) -> dict:
    """A plan file's mapping with its named model and named documents replaced by their definitions."""
    out = dict(data)
    m = out.get("model")
    if isinstance(m, str):
        out["model"] = named_model(m)
    elif m is not None and not isinstance(m, dict):
        raise PlanError("plan.model", f"{m!r} is neither a preset's name nor a model",
                        f"write a preset's name ({', '.join(model_presets()[:3])}, ...) {MODEL_FORMS}")
    w = out.get("workload")
    if isinstance(w, dict) and isinstance(w.get("documents"), str):
        # numpy and the documents table: only a file that names a distribution reads them
        from sp_plan.profiles.documents import named_documents  # noqa: PLC0415

        out["workload"] = {**w, "documents": named_documents(w["documents"])}
    return out


def load_plan(path: str | Path) -> Plan:
    """A plan file as the CLI reads it: ``Plan.load`` with a model preset's name and a distribution's name
    resolved (``resolve_names``); a file newer than this sp-plan is refused before any name is read."""
    data = read_data(path, "plan")
    check_schema_version(data, PLAN_SCHEMA_VERSION, "plan")  # its names may mean something else
    return model_from_data(Plan, resolve_names(data), "plan", str(path))
