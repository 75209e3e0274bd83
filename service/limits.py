"""A request body is read whole before the app sees it, and answered before it is parsed: 413 over the size limit
(its Content-Length, or counted as it streams in chunks), 422 for a JSON string holding a lone UTF-16 surrogate."""
from __future__ import annotations

import json
import re

from sp_plan.planner.errors import PlanError

#: where the body read is kept in the request's scope (service/errors.py reads it there)
BODY_KEY = "sp_plan.body"

#: a UTF-16 surrogate in a UTF-8 JSON body: a \uD800-\uDFFF escape, or its three bytes (ED A0-BF xx), which Python's
#: json decodes too (surrogatepass); a match is parsed to tell a lone one from a pair
SURROGATE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
SURROGATE = re.compile("[\ud800-\udfff]")


class TooLarge(PlanError):
    """A body over --max-body: 413."""

    def __init__(self, limit: int):
        super().__init__("body", f"the request body is over the limit of {limit:,} bytes",
                         "send a smaller body (the service's --max-body)")


def printable(text: str) -> str:
    """``text`` with its surrogates written as \\udXXX escapes (an error body is encoded as UTF-8)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def surrogate_path(doc) -> str | None:
    """The field (``a.b[2]``) of the first string, or object key, in a parsed JSON document that holds a lone
    surrogate ("" for the document itself); None if there is none. Iterative: a body may nest thousands deep."""
    stack = [("", doc)]
    while stack:
        path, x = stack.pop()
        if isinstance(x, str):
            if SURROGATE.search(x):
                return path
        elif isinstance(x, dict):
            for k, v in x.items():
                here = f"{path}.{k}" if path else k
                if SURROGATE.search(k):
                    return printable(here)
                stack.append((here, v))
        elif isinstance(x, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(x))
    return None


def lone_surrogate(body: bytes) -> PlanError | None:
    """The error for a JSON body holding a string that is not Unicode text (a lone surrogate, which no UTF-8 store,
    hash or answer can encode), naming its field; None for any other body (one that is not JSON: the app names it)."""
    utf8 = b"\x00" not in body[:4]  # json's own test: UTF-16 and UTF-32 bodies put a NUL in their first 4 bytes
    if utf8 and not SURROGATE_BYTES.search(body):
        return None
    try:
        path = surrogate_path(json.loads(body))
    except (ValueError, RecursionError):
        return None
    if path is None:
        return None
    return PlanError(path or "body", "holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not a Unicode character",
                     "send Unicode text: a \\ud800-\\udbff escape only followed by its \\udc00-\\udfff pair")


class BodyLimit:
    """ASGI middleware: 413 (``on_error(TooLarge)``) for bodies over ``max_bytes``, ``on_error`` of a PlanError
    (422) for a lone surrogate; any other body is passed on to the app as it came."""

    def __init__(self, app, max_bytes: int, on_error):
        self.app, self.max_bytes, self.on_error = app, max_bytes, on_error

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            return await self.on_error(TooLarge(self.max_bytes))(scope, receive, send)
        messages = await self.read(receive)
        if messages is None:
            return await self.on_error(TooLarge(self.max_bytes))(scope, receive, send)
        body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")
        scope[BODY_KEY] = body  # the error handlers name a field where it sits in the body (service/errors.py)
        bad = lone_surrogate(body)
        if bad is not None:
            return await self.on_error(bad)(scope, receive, send)

        async def replayed():
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replayed, send)

    async def read(self, receive) -> list[dict] | None:
        """The request's messages up to its last body chunk (or a disconnect); None once over ``max_bytes``. Here,
        not inside the app's receive: the app's body reader turns any error raised there into its own 400."""
        messages, seen = [], 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                return messages
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                return None
            if not message.get("more_body", False):
                return messages
