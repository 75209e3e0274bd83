"""The service's search pool and the report it renders there: a pool whose process died is replaced, so only the
job in flight is lost; the report page ranks the same rows as `sp-plan plan --report` for the same request."""
from __future__ import annotations

import asyncio
import os
import signal

import pytest

import sp_plan.integrations.report as html_report
from sp_plan.pipeline import PlanRequest, report_plans, run_plan
from sp_plan.planner.equivalent import group
from sp_plan.planner.errors import Unavailable
from sp_plan.service.pool import SearchPool, report_job

REQUEST = dict(cluster="dgx-h100", model="llama3-8b", workload={"seq_len": "128k"}, use_profile=False, top=5,
               families=True)


async def lose_a_process(pool: SearchPool) -> tuple[int, Unavailable]:
    """Kill the pool's process from inside a job: that process's id, and what the job in flight answered."""
    pid = await pool.run("search", "retry", os.getpid)
    with pytest.raises(Unavailable) as lost:
        await pool.run("search", "retry", os.kill, pid, signal.SIGKILL)
    return pid, lost.value


async def after_a_lost_process() -> tuple[int, Unavailable, int]:
    """The killed process, the in-flight job's error, and the process that answers the next job."""
    pool = SearchPool(1)
    try:
        pid, error = await lose_a_process(pool)
        return pid, error, await pool.run("search", "retry", os.getpid)
    finally:
        pool.close()


@pytest.mark.multiprocess
def test_a_search_process_that_died_is_replaced_for_the_next_job():
    """After the search process is killed mid-job, that job answers 503 and the next one is answered by a new process."""
    killed, error, answered_by = asyncio.run(after_a_lost_process())
    assert (error.field, error.problem) == ("search", "the search process died")
    assert answered_by != killed


async def two_jobs_lost(pool: SearchPool) -> list:
    """Kill the pool's one process while a second job waits for it: what each job answered."""
    pid = await pool.run("search", "retry", os.getpid)
    return await asyncio.gather(pool.run("search", "retry", os.kill, pid, signal.SIGKILL),
                                pool.run("search", "retry", sum, [1, 2]), return_exceptions=True)


@pytest.mark.multiprocess
def test_the_jobs_of_a_broken_pool_replace_it_once(monkeypatch):
    """Every job of the pool whose process died answers 503, and the pool is replaced once, not once a job (a
    replacement dropped unclosed would keep its process past the server's close)."""
    started = []
    real = SearchPool._start
    monkeypatch.setattr(SearchPool, "_start", lambda self: started.append(1) or real(self))
    pool = SearchPool(1)
    try:
        answers = asyncio.run(two_jobs_lost(pool))
    finally:
        pool.close()
    assert all(isinstance(a, Unavailable) for a in answers), answers
    assert len(started) == 2  # the first pool and one replacement


def rendered_rows(monkeypatch, req: PlanRequest, res) -> tuple[list[str], int, int]:
    """The rows (as summaries), chosen index and ranked count that report_job hands the HTML renderer."""
    seen = {}

    def render(plans, cluster, profile=None, chosen=0, notes=None, ranked=None, **_):
        seen.update(rows=[p.summary() for p in plans], chosen=chosen, ranked=ranked)
        return "<html></html>"

    monkeypatch.setattr(html_report, "render_report", render)
    report_job(req, res, None)
    return seen["rows"], seen["chosen"], seen["ranked"]


def test_the_report_page_ranks_the_rows_plan_report_ranks(monkeypatch):
    """The service's report page groups equivalent layouts as `plan --report` does: its ranked rows are the top asked."""
    req = PlanRequest(**REQUEST)
    res = run_plan(req)
    rows, chosen, ranked = report_plans([r.plan for r in group(res.plans)], res.families)
    assert rendered_rows(monkeypatch, req, res) == ([p.summary() for p in rows], chosen, ranked)
    assert ranked == req.top and len(res.plans) > req.top  # some of the top plans are equivalent alternatives
