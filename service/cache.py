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
    new computation (whose failure is raised to every waiter and not cached)."""

    def __init__(self, size: int = 1024):
        self.done = LRU(size)
        self.inflight: dict[str, asyncio.Future] = {}

    async def get(self, key: str, compute: Callable[[], Awaitable[Any]]) -> tuple[Any, str]:
        """(value, how): how is 'memory', 'coalesced' or whatever ``compute`` says (it returns (value, how))."""
        if key in self.done:
            return self.done.get(key), "memory"
        if key in self.inflight:
            return await asyncio.shield(self.inflight[key]), "coalesced"
        fut = asyncio.get_running_loop().create_future()
        self.inflight[key] = fut
        try:
            value, how = await compute()
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()  # retrieved: no "never retrieved" warning when nobody else waited
            raise
        else:
            fut.set_result(value)
            self.done.put(key, value)
            return value, how
        finally:
            del self.inflight[key]

    def put(self, key: str, value: Any) -> None:
        self.done[key] = value
        self.done.move_to_end(key)
        while len(self.done) > self.size:
            self.done.popitem(last=False)
