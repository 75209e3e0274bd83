"""A request body over the size limit is answered 413 before it is parsed (Content-Length, or counted as it streams)."""
from __future__ import annotations

from sp_plan.planner.errors import PlanError


class TooLarge(PlanError):
    """A body over --max-body: 413."""

    def __init__(self, limit: int):
        super().__init__("body", f"the request body is over the limit of {limit:,} bytes",
                         "send a smaller body (the service's --max-body)")


class BodyLimit:
    """ASGI middleware: 413 (``on_error(TooLarge)``) for bodies over ``max_bytes``."""

    def __init__(self, app, max_bytes: int, on_error):
        self.app, self.max_bytes, self.on_error = app, max_bytes, on_error

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            return await self.on_error(TooLarge(self.max_bytes))(scope, receive, send)
        seen, started = 0, False

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise TooLarge(self.max_bytes)
            return message

        async def tracked(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except TooLarge as e:
            if started:
                raise
            await self.on_error(e)(scope, receive, send)
