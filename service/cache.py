"""Plan results by request key: a bounded in-memory cache, and identical concurrent requests computed once."""
from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any, Awaitable, Callable


class LRU(OrderedDict):
    """A dict that keeps the ``size`` most recently used entries."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def get(self, key, default=None):
        if key not in self:
            return default
        self.move_to_end(key)
        return self[key]

    def put(self, key, value) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


class Coalescer:
    """``get(key, compute)``: a cached value, the result of the computation of ``key`` already in flight, or a
    new computation. The computation runs as its own task: a caller that goes away (a cancelled request) does
    not cancel it for the others; a failure is raised to every waiter and not cached."""

    def __init__(self, size: int = 1024):
        self.done = LRU(size)
        self.inflight: dict[str, asyncio.Task] = {}

    async def get(self, key: str, compute: Callable[[], Awaitable[tuple[Any, str]]]) -> tuple[Any, str]:
        """(value, how): how is 'memory', 'coalesced' or what ``compute`` says (it returns (value, how))."""
        if key in self.done:
            return self.done.get(key), "memory"
        task = self.inflight.get(key)
        if task is not None:
            value, _ = await asyncio.shield(task)
            return value, "coalesced"
        task = asyncio.ensure_future(compute())
        self.inflight[key] = task
        task.add_done_callback(lambda t: self._finished(key, t))
        return await asyncio.shield(task)

    def _finished(self, key: str, task: asyncio.Task) -> None:
        self.inflight.pop(key, None)
        if not task.cancelled() and task.exception() is None:  # exception(): retrieved, so never "unretrieved"
            self.done.put(key, task.result()[0])
