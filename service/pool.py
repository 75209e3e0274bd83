"""The process pool the service's searches and reports run in, off the event loop, and the jobs it runs."""
from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Any, Callable

from sp_plan.planner.equivalent import group
from sp_plan.planner.errors import PlanError, Unavailable
from sp_plan.planner.profile import Profile
from sp_plan.service.collector import collector_paused
from sp_plan.pipeline import PlanRequest, PlanResponse, build_cluster, report_plans, search

#: a PlanError as it crosses the process boundary: its class and fields (a PlanError does not pickle by itself)
ErrorFields = tuple[type, str, str, str]


def die_with_parent(parent: int) -> None:
    """Pool initializer: end this worker when the server that started it is gone (a SIGKILLed server cannot shut
    its pool down, and an orphaned worker would wait on its queue forever)."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="sp-plan-parent-watch", daemon=True).start()


def freeze_heap() -> None:
    """Collect once, then freeze what survives (gc.freeze): the ~10^5 objects of the imported planner, torch, FastAPI
    and SQLAlchemy are never traversed again, so a full collection no longer stalls every request in flight (0.05-0.3 s
    measured with benchmarks/bench_serve.py's cached workload)."""
    gc.collect()
    gc.freeze()


def rebuilt(fields: ErrorFields) -> PlanError:
    """The PlanError a pool process raised, of the same class (so the same HTTP status) and fields."""
    cls, field, problem, fix = fields
    e = cls.__new__(cls)
    PlanError.__init__(e, field, problem, fix)
    return e


def search_job(req: PlanRequest, inputs, storage: str | None, study: str | None):
    """In a pool process: ("ok", the search's PlanResponse, seconds) or ("error", ErrorFields, seconds); the pool
    process owns its garbage collector, paused around the search (``collector_paused``)."""
    t0 = time.perf_counter()
    try:
        with collector_paused():
            res = search(req, inputs, storage=storage, study=study)
        return "ok", res, time.perf_counter() - t0
    except PlanError as e:
        return "error", (type(e), e.field, e.problem, e.fix), time.perf_counter() - t0


def report_job(req: PlanRequest, res: PlanResponse, profile: Profile | None) -> str:
    """In a pool process: the HTML report (integrations/report.py, matplotlib) of a computed plan, as `plan --report`
    writes it: the top plans and the best of every other variant, about the winner."""
    # matplotlib only in the pool process that renders a report
    from sp_plan.integrations.report import render_report  # noqa: PLC0415

    rows, chosen, ranked = report_plans([r.plan for r in group(res.plans)], res.families)
    return render_report(rows, build_cluster(req, None, files=False), profile=profile, chosen=chosen,
                         notes=[res.profile_line], ranked=ranked)


def warm_job() -> None:
    """Import the planner in a pool process before the first request needs it."""
    import sp_plan.planner.bayes  # noqa: F401,PLC0415
    import sp_plan.planner.search  # noqa: F401,PLC0415


class SearchPool:
    """``processes`` spawned processes that follow their server; one that dies takes the pool with it, and the
    next job gets a fresh pool while the job in flight is answered 503 (Unavailable)."""

    def __init__(self, processes: int):
        self.processes = processes
        self.executor = self._start()

    def _start(self) -> ProcessPoolExecutor:
        """A fresh pool of spawned processes, each watching this server (die_with_parent)."""
        return ProcessPoolExecutor(self.processes, mp_context=get_context("spawn"), initializer=die_with_parent,
                                   initargs=(os.getpid(),))

    async def run(self, what: str, fix: str, fn: Callable[..., Any], *args) -> Any:
        """``fn(*args)`` in a pool process; Unavailable(``what``) if that process died (killed, out of memory)."""
        loop, executor = asyncio.get_running_loop(), self.executor
        try:
            return await loop.run_in_executor(executor, fn, *args)
        except BrokenProcessPool:
            if self.executor is executor:  # every job of the broken pool lands here: the first replaces it, once
                self.executor = self._start()
            raise Unavailable(what, f"the {what} process died", fix) from None

    async def warm(self) -> None:
        """Start every process and import the planner in it."""
        await asyncio.gather(*(self.run("search", "retry", warm_job) for _ in range(self.processes)))

    def close(self, grace_s: float = 2.0) -> None:
        """Stop the pool without waiting for the jobs in flight: queued ones are cancelled, idle processes exit as
        told, and those still running one after ``grace_s`` are ended (a search may run minutes; the executor's own
        exit would wait for it, and a stopping server would not stop). Idle processes are not ended:
        one ended would leave its queue's semaphores for the resource tracker to report as leaked."""
        running = list((getattr(self.executor, "_processes", None) or {}).values())
        self.executor.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + grace_s
        for proc in running:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.terminate()
                proc.join(1.0)
