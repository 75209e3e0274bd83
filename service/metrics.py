"""Prometheus metrics of one service instance (its own registry: no process-global state)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


@dataclass
class Metrics:
    """Requests and latency by endpoint, search time, cache hits and misses, store errors."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self):
        r = self.registry
        self.requests = Counter("sp_plan_requests", "HTTP requests", ["method", "endpoint", "status"], registry=r)
        self.latency = Histogram("sp_plan_request_seconds", "HTTP request latency", ["method", "endpoint"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.search = Histogram("sp_plan_search_seconds", "search time in the process pool", ["kind"],
                                buckets=LATENCY_BUCKETS, registry=r)
        self.cache = Counter("sp_plan_plan_cache", "plan requests by how they were answered: memory, store "
                             "(a plan computed before), coalesced (joined a search in flight), computed", ["result"],
                             registry=r)
        self.store_errors = Counter("sp_plan_store_errors", "store operations that failed", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class Counted:
    """ASGI middleware: requests by method, route and status, and their latency, into the app's Metrics."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0, status = time.perf_counter(), [500]

        async def seen(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, seen)
        finally:
            m = scope["app"].state.svc.metrics
            endpoint = getattr(scope.get("route"), "path", "unmatched")
            m.requests.labels(scope["method"], endpoint, str(status[0])).inc()
            m.latency.labels(scope["method"], endpoint).observe(time.perf_counter() - t0)
