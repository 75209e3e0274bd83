"""service/cache.py: identical concurrent computations run once; failures and cancelled callers (in-process asyncio)."""
from __future__ import annotations

import asyncio

import pytest

from sp_plan.service.cache import LRU, Coalescer


def test_concurrent_gets_compute_once_then_serve_from_memory():
    async def main():
        co, calls, gate = Coalescer(), [], asyncio.Event()

        async def compute():
            calls.append(1)
            await gate.wait()
            return "answer", "computed"

        waiters = [asyncio.ensure_future(co.get("k", compute)) for _ in range(5)]
        await asyncio.sleep(0)
        gate.set()
        got = await asyncio.gather(*waiters)
        assert len(calls) == 1 and sorted(h for _, h in got) == ["coalesced"] * 4 + ["computed"]
        assert {v for v, _ in got} == {"answer"} and await co.get("k", compute) == ("answer", "memory")
        assert not co.inflight

    asyncio.run(main())


def test_a_failure_reaches_every_waiter_and_is_not_cached():
    async def main():
        co, gate = Coalescer(), asyncio.Event()

        async def broken():
            await gate.wait()
            raise ValueError("no")

        waiters = [asyncio.ensure_future(co.get("k", broken)) for _ in range(3)]
        await asyncio.sleep(0)
        gate.set()
        results = await asyncio.gather(*waiters, return_exceptions=True)
        assert all(isinstance(r, ValueError) for r in results) and "k" not in co.done and not co.inflight

        async def fine():
            return 1, "computed"

        assert await co.get("k", fine) == (1, "computed")

    asyncio.run(main())


def test_a_cancelled_first_caller_does_not_cancel_the_others():
    async def main():
        co, gate = Coalescer(), asyncio.Event()

        async def compute():
            await gate.wait()
            return "answer", "computed"

        first = asyncio.ensure_future(co.get("k", compute))
        await asyncio.sleep(0)
        second = asyncio.ensure_future(co.get("k", compute))
        await asyncio.sleep(0)
        first.cancel()
        gate.set()
        assert await second == ("answer", "coalesced")
        with pytest.raises(asyncio.CancelledError):
            await first
        assert co.done.get("k") == "answer"

    asyncio.run(main())


def test_lru_keeps_the_most_recently_used():
    lru = LRU(2)
    lru.put("a", 1), lru.put("b", 2)
    assert lru.get("a") == 1
    lru.put("c", 3)
    assert set(lru) == {"a", "c"} and lru.get("b") is None
