"""Searches over forked worker processes (``forked_map``): the grid, whose degrees choices are split into shares
(``planner.partition``), one searched here and one in each worker, the rankings merged; the sensitivity's
re-rankings, dealt to the workers in turn.

Forked, a worker starts with the parent's imports and caches already in memory (no interpreter start, no imports:
a few milliseconds), and it returns only its results. The library's own calls search in one process
(``jobs=1``): forking is the host process's decision, as its garbage collector is."""
from __future__ import annotations

import functools
import mmap
import multiprocessing
import os
import pickle
import signal
import time
from typing import Any, Callable, TypeVar

from sp_plan.planner.cluster import Cluster
from sp_plan.planner.model import ModelSpec, Workload
from sp_plan.planner.params import Params
from sp_plan.planner.exchange import Exchange, empty
from sp_plan.planner.partition import merged, shares, variant_key_list
from sp_plan.planner.search import SearchResult, Space, grid_search, predict_ahead

T = TypeVar("T")
R = TypeVar("R")

#: a share smaller than this many degrees choices is searched in the process that holds it: a fork and a ranking's
#: pickle cost more than the search of a small space
MIN_SHARE = 16
#: at most this many processes: the shares of a large space stop shrinking in time well before it
MAX_JOBS = 8
#: a worker not done this many times the parent's own share's time (plus ``WAIT_EXTRA_S``) after the parent is
#: taken for stuck, and its share is searched in the parent: shares of whole ring degrees can differ several-fold
#: in time, a stuck worker is rare, and waiting too little would search a share twice
WAIT_FACTOR = 10.0
WAIT_EXTRA_S = 10.0


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity mask
        return os.cpu_count() or 1


def auto_jobs() -> int:
    """The processes a grid search of a command runs in by default: the usable cores, at most ``MAX_JOBS``."""
    return max(1, min(usable_cores(), MAX_JOBS))


def can_fork() -> bool:
    """Whether this process may fork workers: the platform forks, and this is no daemonic process (multiprocessing
    allows those no children)."""
    return "fork" in multiprocessing.get_all_start_methods() and not multiprocessing.current_process().daemon


def grid_jobs(space: Space, jobs: int) -> int:
    """How many shares a search of ``space`` is cut into: ``jobs``, fewer where a share would hold under
    ``MIN_SHARE`` degrees choices on average or where the space has fewer ring degrees (``partition.shares``), 1
    where this process cannot fork (``can_fork``)."""
    if jobs <= 1 or not can_fork():
        return 1
    choices = list(space.degrees())
    return max(1, min(jobs, len(choices) // MIN_SHARE, len({d.ring for d in choices})))


def forked_grid_search(cluster: Cluster, model: ModelSpec, workload: Workload, space: Space | None, jobs: int,
                       progress: Callable[[int, int], None] | None = None, keep: int | None = 5,
                       params: Params | None = None, distinct: bool = False, ahead: bool = False) -> SearchResult:
    """``grid_search`` with the same ranked rows, searched in up to ``jobs`` processes (``grid_jobs``); the progress
    is this process's share's. ``ahead``: each share also predicts the layouts the rankings' finishing may ask of it
    (``search.predict_ahead``), the shares' predictions made side by side."""
    space = space or Space(cluster.world_size, model, workload)
    n = grid_jobs(space, jobs)
    search = functools.partial(grid_search, cluster, model, workload, keep=keep, params=params, distinct=distinct)
    if n == 1:
        return search(space, progress=progress)
    parts, keys = shares(space, n), variant_key_list(space)
    exchange = Exchange(keys, shared_floats(empty(keys)))

    def share_search(share: Space) -> SearchResult:
        res = search(share, progress=progress if share is parts[0] else None, exchange=exchange)
        if ahead:
            res.predicted = predict_ahead(res, workload, keep, exchange)
        return res

    results = forked_map(share_search, parts, n, portable=_ranking)
    return merged([results[0], *(SearchResult(*r[:4], None, predicted=r[4]) for r in results[1:])])


def shared_floats(values: list[float]) -> memoryview:
    """``values`` in an anonymous shared mapping, as floats: a forked worker reads and writes the same pages (what
    ``multiprocessing``'s RawArray gives, without its shared-ctypes heap)."""
    buf = memoryview(mmap.mmap(-1, 8 * len(values))).cast("d")
    for i, x in enumerate(values):
        buf[i] = x
    return buf


def rerankings(jobs: int) -> Callable[[Callable, list], list]:
    """The sensitivity's way of running its re-rankings (``planner.sensitivity``'s ``each``): over ``jobs``
    processes."""
    return functools.partial(forked_map, jobs=jobs)


def _ranking(res: SearchResult) -> tuple:
    """What a worker's share sends back: its ranking, counts and predictions made ahead (its estimator stays in the
    worker)."""
    return res.ranked, res.evaluated, res.space, res.rejected, res.predicted


def forked_map(fn: Callable[[T], R], items: list[T], jobs: int, portable: Callable[[R], Any] = lambda r: r) -> list:
    """``[fn(x) for x in items]`` over up to ``jobs`` processes: the items dealt in turn to this process and to
    forked workers; a worker's results come back as ``portable(fn(x))`` (pickled), this process's whole. A worker
    that dies, sends nothing or is not done ``WAIT_FACTOR`` times this process's own time (+ ``WAIT_EXTRA_S``)
    after it has its items done here: a lost worker costs time, never a result."""
    n = max(1, min(jobs, len(items)))
    if n == 1 or not can_fork():
        return [fn(x) for x in items]
    dealt = [items[k::n] for k in range(n)]
    started = [_started(fn, portable, chunk) for chunk in dealt[1:]]
    t0 = time.perf_counter()
    try:
        mine = [fn(x) for x in dealt[0]]
    except BaseException:  # an error or an interrupt here: the workers' results are not wanted
        for worker, _ in started:
            worker.kill()
        raise
    patience = WAIT_FACTOR * (time.perf_counter() - t0) + WAIT_EXTRA_S
    out: list = [None] * len(items)
    out[0::n] = mine
    for k, ((worker, reader), chunk) in enumerate(zip(started, dealt[1:]), start=1):
        out[k::n] = _received(worker, reader, patience, lambda c=chunk: [portable(fn(x)) for x in c])
    return out


def _started(fn: Callable, portable: Callable, chunk: list) -> tuple:
    """A forked worker running ``fn`` over ``chunk``, and the end of the pipe its results come back on."""
    ctx = multiprocessing.get_context("fork")
    reader, writer = ctx.Pipe(duplex=False)
    worker = ctx.Process(target=_work, args=(writer, fn, portable, chunk), daemon=True)
    worker.start()
    writer.close()
    return worker, reader


def _work(writer, fn: Callable, portable: Callable, chunk: list) -> None:
    """In a worker: ``portable(fn(x))`` of each item, pickled to the parent. An interrupt is the parent's to handle:
    the worker is a daemon, ended when the parent exits."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    results = [portable(fn(x)) for x in chunk]
    writer.send_bytes(pickle.dumps(results, pickle.HIGHEST_PROTOCOL))
    writer.close()


def _received(worker, reader, patience: float, again: Callable[[], list]) -> list:
    """A worker's results; where it died, sent nothing or is not done within ``patience`` seconds, ``again()``
    here."""
    try:
        if not reader.poll(patience):
            raise TimeoutError
        results = pickle.loads(reader.recv_bytes())
    except (EOFError, OSError, pickle.UnpicklingError):  # TimeoutError is an OSError
        worker.kill()
        worker.join()
        return again()
    finally:
        reader.close()
    worker.join()
    return results
