"""Where a field an error names sits in the request body the user sent: the error handlers name it so, as pydantic's
own errors are named (``plan.degrees``, ``workload.seq_len``, ``workload.documents.0``)."""
from __future__ import annotations

from typing import Any, get_args

from sp_plan.pipeline import EstimateRequest
from sp_plan.planner.model import Documents
from sp_plan.planner.plan import Plan
from sp_plan.planner.yamlio import child, key_path

#: the tags pydantic puts after ``documents`` in a location inside the documents union: each member's ``kind``
#: (lengths, lognormal, histogram); the user sent a list or an object, never the tag as a key
DOCUMENT_TAGS = frozenset(m.model_fields["kind"].default for m in get_args(get_args(Documents)[0]))
#: PlanError fields that name no place in the body (the body itself, the request, the token, the server): kept
NOT_BODY = frozenset({"body", "request", "token", "server", "Authorization"})
#: fields of an estimate's inline plan that the request does not also have at its top level: a PlanError naming one
#: the body does not hold is about ``plan.<field>``
PLAN_ONLY = frozenset(Plan.model_fields) - frozenset(EstimateRequest.model_fields)


def untagged(loc: list[str]) -> list[str]:
    """A pydantic location without the tag of the documents union (``workload.documents.histogram.weights.0``:
    ``workload.documents.weights.0``): a name of the model's branch, not a key the user sent."""
    return [x for i, x in enumerate(loc) if not (i and loc[i - 1] == "documents" and x in DOCUMENT_TAGS)]


def as_sent(parts: list[str], body: Any) -> list[str]:
    """A field of the request's models as the user wrote it in ``body``: documents sent as a list of lengths are
    the list (``documents.lengths.0``: ``documents.0``), and a pattern sent as ``window_pattern`` beside an integer
    window is that key (``window.pattern``: ``window_pattern``)."""
    out, x, i = [], body, 0
    while i < len(parts):
        key = parts[i]
        nxt = parts[i + 1] if i + 1 < len(parts) else None
        if (key == "window" and nxt == "pattern" and isinstance(x, dict) and "window_pattern" in x
                and not isinstance(x.get("window"), dict)):
            return out + ["window_pattern"] + parts[i + 2:]
        found, x = child(x, key)
        out.append(key)
        if not found:
            return out + parts[i + 1:]
        if key == "documents" and nxt == "lengths" and isinstance(x, list):
            i += 1  # the list is the lengths
        i += 1
    return out


def located(field: str, body: Any) -> str:
    """A PlanError's field as a path in the request body: itself where the body holds it, else where its key (or
    dotted keys) first sits in the body, shallowest first (``degrees``: ``plan.degrees``; ``seq_len``:
    ``workload.seq_len``, the request's own before its plan's); a field of an estimate's plan the body does not hold
    is ``plan.<field>``. Fields that name no place in a body (``body``, ``token``, ...) are kept."""
    if field in NOT_BODY or not field or not isinstance(body, dict):
        return field
    parts = as_sent(field.split("."), body)
    where = key_path(body, parts)
    if where is not None:
        return where
    if parts[0] in PLAN_ONLY and isinstance(body.get("plan"), dict):
        return ".".join(["plan"] + parts)
    return field
