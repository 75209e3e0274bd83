"""Errors as HTTP answers: the status from the error's class, the body the same JSON for every error (the field,
the problem and the fix, and the CLI's one line in ``detail``)."""
from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from sp_plan.planner.errors import NotFound, PlanError, Unavailable
from sp_plan.service.auth import Forbidden, Unauthorized
from sp_plan.service.fields import as_sent, located, untagged
from sp_plan.service.limits import BODY_KEY, TooLarge

#: an error's HTTP status, by the nearest of its classes listed here; any other PlanError is bad input: 422
STATUS: dict[type, int] = {Unauthorized: 401, Forbidden: 403, NotFound: 404, TooLarge: 413, Unavailable: 503}
INVALID = 422
#: the parts of a pydantic error location that name a type or a validator, not a field
NOT_FIELDS = ("body", "str", "Cluster", "ModelSpec", "Workload", "Plan")

log = logging.getLogger("sp_plan.service")


class ErrorDetail(BaseModel):
    """What was wrong: the field (a request field, or "body", "request", "token", "server"), the problem, the fix."""

    field: str
    problem: str
    fix: str


class ErrorBody(BaseModel):
    """Every error's JSON body, whatever its status."""

    error: ErrorDetail
    detail: str = Field(description="the CLI's one line: FIELD: PROBLEM; FIX")


#: what each error status means (the OpenAPI document's description of it)
MEANING = {400: "the body is not UTF-8 JSON", 401: "no token where the service needs one",
           403: "a token the service does not know", 404: "no such preset, stored profile, computed plan or route",
           413: "the body is over the service's --max-body", 422: "a field's value is refused (the field is named)",
           500: "a bug: the request body helps to report it", 503: "the store or the search process is down"}


def error_responses(*statuses: int) -> dict:
    """The OpenAPI ``responses`` of a router: each status with the error body and what it means."""
    return {s: {"model": ErrorBody, "description": MEANING[s]} for s in statuses}


def status_of(e: PlanError) -> int:
    """The HTTP status of an error: that of the first of its classes (most derived first) in STATUS."""
    return next((STATUS[c] for c in type(e).__mro__ if c in STATUS), INVALID)


def error_response(e: PlanError, status: int | None = None) -> JSONResponse:
    """The JSON error body: the field, the problem and the fix (the CLI's one line in ``detail``)."""
    return JSONResponse({"error": {"field": e.field, "problem": e.problem, "fix": e.fix}, "detail": str(e)},
                        status_code=status or status_of(e))


def validation_error(exc: RequestValidationError, body: Any = None, json_sent: bool = True) -> PlanError:
    """pydantic's errors as one PlanError: the deepest location (the branch of a union the input was meant for),
    named as the user wrote it in ``body`` (the parsed request body, if any; ``json_sent``: its Content-Type says
    JSON)."""
    errs = exc.errors()
    e = max(errs, key=lambda x: len(x.get("loc", ()))) if errs else {"loc": ("body",), "msg": "invalid"}
    if e.get("type") == "json_invalid":
        return PlanError("body", f"not valid JSON ({e.get('msg', 'invalid')})", "send a JSON body as in /openapi.json")
    loc = untagged([str(x) for x in e.get("loc", ()) if x not in NOT_FIELDS and not str(x).startswith("function-")])
    if loc:
        return PlanError(".".join(as_sent(loc, body)), e.get("msg", "invalid"), "fix that field")
    fix = "send a JSON body as in /openapi.json"
    if not json_sent:
        fix = "send the JSON body with the header Content-Type: application/json"
    return PlanError("body", e.get("msg", "invalid"), fix)


def request_body(request: Request) -> Any:
    """The request's body as parsed JSON (None where there is none, or it is not JSON)."""
    raw = request.scope.get(BODY_KEY)
    if raw is None:
        raw = getattr(request, "_body", None)
    if not raw:
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def sent_json(request: Request) -> bool:
    """Whether the request's Content-Type says JSON (application/json or a +json type)."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


async def plan_error(request: Request, e: PlanError) -> JSONResponse:
    """A PlanError raised by a route or while its body is parsed: its status and body, a 4xx's field named where it
    sits in the request body (as pydantic's errors are)."""
    status = status_of(e)
    field = located(e.field, request_body(request)) if status < 500 else e.field  # a 5xx is the server's, not input
    return error_response(e if field == e.field else PlanError(field, e.problem, e.fix), status)


async def unexpected(request: Request, e: Exception) -> JSONResponse:
    """A bug, not bad input: still a JSON body (500), and logged with its traceback."""
    log.exception("unexpected error in %s %s", request.method, request.url.path)
    r = error_response(PlanError("server", f"unexpected {type(e).__name__}", "report it with the request body"), 500)
    # Starlette raises the error again after this answer and uvicorn then drops the connection: say so, or a
    # keep-alive client sends its next request down a closed socket
    r.headers["Connection"] = "close"
    return r


async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
    """A body or parameter pydantic refused: 422 naming the deepest field."""
    body = request_body(request)
    if body is None and isinstance(e.body, (dict, list)):
        body = e.body
    return error_response(validation_error(e, body, sent_json(request)), INVALID)


async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
    """Starlette's own errors (no route, a method not allowed, a body that is not UTF-8) in the same JSON body."""
    if e.status_code == 404:
        problem, fix = f"no route {request.method} {request.url.path}", "see /docs for the endpoints"
    elif e.status_code == 405:
        problem, fix = f"{request.method} is not allowed on {request.url.path}", "see /docs for the methods"
    else:
        problem, fix = str(e.detail), "send a UTF-8 JSON body (Content-Type: application/json)"
    return error_response(PlanError("request", problem, fix), e.status_code)


def install(app: FastAPI) -> None:
    """Answer every error of ``app`` with the JSON body above."""
    app.add_exception_handler(PlanError, plan_error)
    app.add_exception_handler(Exception, unexpected)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)
