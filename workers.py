"""The grid search over forked worker processes: a command that owns its process splits the degrees choices into
shares (``planner.partition``), searches one share itself and one in each forked worker, and merges the rankings.

Forked, a worker starts with the parent's imports and caches already in memory (no interpreter start, no imports:
a few milliseconds), and it returns only its ranking. The library's own calls search in one process
(``jobs=1``): forking is the host process's decision, as its garbage collector is."""
from __future__ import annotations

import functools
import multiprocessing
import os
import pickle
import signal
import time
from typing import Callable

from sp_plan.planner.cluster import Cluster
from sp_plan.planner.model import ModelSpec, Workload
from sp_plan.planner.params import Params
from sp_plan.planner.partition import Share, merged, shares
from sp_plan.planner.search import SearchResult, Space, grid_search

#: a share smaller than this many degrees choices is searched in the process that holds it: a fork and a ranking's
#: pickle cost more than the search of a small space
MIN_SHARE = 16
#: at most this many processes: the shares of a large space stop shrinking in time well before it
MAX_JOBS = 8
#: a worker not done this many times the parent's own share's time (plus ``WAIT_EXTRA_S``) after the parent is
#: taken for stuck, and its share is searched in the parent: the shares' times differ by tens of percent, not 4x
WAIT_FACTOR = 4.0
WAIT_EXTRA_S = 5.0


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity mask
        return os.cpu_count() or 1


def auto_jobs() -> int:
    """The processes a grid search of a command runs in by default: the usable cores, at most ``MAX_JOBS``."""
    return max(1, min(usable_cores(), MAX_JOBS))


def grid_jobs(space: Space, jobs: int) -> int:
    """How many shares a search of ``space`` is cut into: ``jobs``, fewer where a share would hold under
    ``MIN_SHARE`` degrees choices, 1 where the platform cannot fork or this process may not have children (a
    daemonic process: multiprocessing refuses them)."""
    if jobs <= 1 or "fork" not in multiprocessing.get_all_start_methods() or multiprocessing.current_process().daemon:
        return 1
    return max(1, min(jobs, sum(1 for _ in space.degrees()) // MIN_SHARE))


def forked_grid_search(cluster: Cluster, model: ModelSpec, workload: Workload, space: Space | None, jobs: int,
                       progress: Callable[[int, int], None] | None = None, keep: int | None = 5,
                       params: Params | None = None, distinct: bool = False) -> SearchResult:
    """``grid_search`` with the same ranked rows, searched in up to ``jobs`` processes (``grid_jobs``); the progress
    is this process's share's."""
    space = space or Space(cluster.world_size, model, workload)
    n = grid_jobs(space, jobs)
    search = functools.partial(grid_search, cluster, model, workload, keep=keep, params=params, distinct=distinct)
    if n == 1:
        return search(space, progress=progress)
    parts = shares(space, n)
    started = [_started(search, share) for share in parts[1:]]
    t0 = time.perf_counter()
    try:
        mine = search(parts[0], progress=progress)
    except BaseException:  # an error or an interrupt here: the workers' shares are not wanted
        for worker, _ in started:
            worker.kill()
        raise
    patience = WAIT_FACTOR * (time.perf_counter() - t0) + WAIT_EXTRA_S
    return merged([mine, *(_received(worker, reader, patience, lambda s=share: search(s))
                           for (worker, reader), share in zip(started, parts[1:]))])


def _started(search: Callable[..., SearchResult], share: Share) -> tuple:
    """A forked worker searching ``share``, and the end of the pipe its ranking comes back on."""
    ctx = multiprocessing.get_context("fork")
    reader, writer = ctx.Pipe(duplex=False)
    worker = ctx.Process(target=_search_share, args=(writer, search, share), daemon=True)
    worker.start()
    writer.close()
    return worker, reader


def _search_share(writer, search: Callable[..., SearchResult], share: Share) -> None:
    """In a worker: its share's ranking and counts, pickled to the parent (the estimator stays here). An interrupt
    is the parent's to handle: the worker is a daemon, ended when the parent exits."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    res = search(share)
    writer.send_bytes(pickle.dumps((res.ranked, res.evaluated, res.space, res.rejected), pickle.HIGHEST_PROTOCOL))
    writer.close()


def _received(worker, reader, patience: float, again: Callable[[], SearchResult]) -> SearchResult:
    """A worker's share as a SearchResult (without its estimator). A worker that died, sent nothing or is not done
    ``patience`` seconds after this process finished its own share has its share searched here (``again``): a lost
    worker costs time, never the result."""
    try:
        if not reader.poll(patience):
            raise TimeoutError
        ranked, evaluated, size, rejected = pickle.loads(reader.recv_bytes())
    except (EOFError, OSError, pickle.UnpicklingError):  # TimeoutError is an OSError
        worker.kill()
        worker.join()
        return again()
    finally:
        reader.close()
    worker.join()
    return SearchResult(ranked, evaluated, size, rejected, None)
