"""Run a function on a small local torch.distributed world (gloo, forked processes) with a deadline.

The tests and the benchmarks run their CPU worlds through it. Children are forked from a parent that already
imported torch and what torch and the runtime import lazily on a rank's first backward or attention call
(``preload``), so no rank pays those imports again and a world of 8 starts in well under a second. A child that
raises, dies or hangs ends the whole world with an error inside ``timeout``.
"""
from __future__ import annotations

import datetime
import functools
import importlib
import multiprocessing as mp
import os
import pickle
import shutil
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

from sp_plan.runtime.spawn import fork_safe_c10d

from .cpu_share import make_caps, remove_caps


#: modules a rank would otherwise import on its own after the fork: autograd's backward imports torch's symbolic
#: shapes (sympy, about a second of CPU per process) and the attention entry point loads every runtime variant
#: torch._dynamo: DDP's constructor imports it (with FSDP and DTensor, seconds a rank), and tunes build DDP stacks
LAZY_IMPORTS = ("torch.fx.experimental.symbolic_shapes", "torch.distributed.distributed_c10d", "torch._dynamo")


@functools.cache
def preload() -> None:
    """Import, once in the parent, what every forked rank would otherwise import for itself."""
    for name in LAZY_IMPORTS:
        importlib.import_module(name)
    from sp_plan.runtime.variants import load_all

    load_all()


class WorldError(RuntimeError):
    """A rank of a spawned world failed, died or did not finish in time."""


def _linger(dist) -> None:
    """Stay until every rank is done: gloo connects a new group's members pairwise, and a rank that exits
    while a peer still connects to it fails that peer ("connectFullMesh ... Connection closed by peer")."""
    if dist.is_initialized():
        dist.barrier()


def _child(fn, rank, world, init_file, timeout, args, kwargs, conn, caps=None):
    """One rank: join its CPU cgroup if capped, join the file-initialised gloo group, run ``fn`` and send its
    pickled result (or the error)."""
    import torch
    import torch.distributed as dist

    if caps is not None:
        caps.join(rank)  # before gloo starts its threads, though cgroup.procs moves them all
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    fork_safe_c10d()
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout))
        out = fn(rank, world, *args, **kwargs)
        conn.send(("ok", pickle.dumps(out)))
        _linger(dist)
    except BaseException as e:  # noqa: BLE001 - report anything to the parent
        conn.send(("error", f"rank {rank}: {type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        conn.close()
        # Skip destroy_process_group: peers may be gone; the process exits anyway.
        os._exit(0)


def _start(fn, world, init_file, timeout, args, kwargs, caps=None) -> tuple[list, list]:
    """Fork the ``world`` ranks; their result pipes and processes."""
    ctx = mp.get_context("fork")
    pipes, procs = [], []
    for rank in range(world):
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child, args=(fn, rank, world, init_file, timeout, args, kwargs, child, caps),
                        daemon=True)
        p.start()
        child.close()
        pipes.append(parent)
        procs.append(p)
    return pipes, procs


def _poll(r: int, pipe, proc, results: list, errors: list) -> bool:
    """Whether rank ``r`` is done now: its result or error read, or its death noted."""
    if pipe.poll(0.01):
        try:
            status, payload = pipe.recv()
        except EOFError:
            status, payload = "error", f"rank {r}: died without a result"
        if status == "ok":
            results[r] = pickle.loads(payload)
        else:
            errors.append(payload)
        return True
    if not proc.is_alive() and not pipe.poll(0):
        errors.append(f"rank {r}: died with exit code {proc.exitcode}")
        return True
    return False


def _collect(pipes, procs, world: int, timeout: float) -> tuple[list, list]:
    """Every rank's result, or the errors: the first failure dooms the world (peers block on it), so stop there."""
    results: list[Any] = [None] * world
    errors: list[str] = []
    done = [False] * world
    deadline = time.monotonic() + timeout + 5.0
    while not all(done) and not errors:
        if time.monotonic() > deadline:
            late = [r for r in range(world) if not done[r]]
            raise WorldError(f"world of {world} timed out after {timeout:.0f}s; ranks {late} did not finish")
        for r in range(world):
            if not done[r]:
                done[r] = _poll(r, pipes[r], procs[r], results, errors)
    return results, errors


def _reap(procs, tmp: str) -> None:
    """Kill what still runs, wait for it, and remove the world's rendezvous folder."""
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(timeout=5)
    shutil.rmtree(tmp, ignore_errors=True)


def run_world(fn: Callable[..., Any], world: int, *args, timeout: float = 60.0,
              collective_timeout: float | None = None, rank_cpu: float | None = None, **kwargs) -> list[Any]:
    """Run ``fn(rank, world, *args, **kwargs)`` on ``world`` forked gloo ranks; return their results.

    Raises WorldError naming the failing rank(s) if any rank raises, dies, or the world is not
    done within ``timeout`` seconds (collectives also time out at ``timeout``, or at ``collective_timeout``).
    ``rank_cpu`` caps each rank at that share of one core (``cpu_share``; CpuShareError where no cgroup can be made).
    """
    fork_safe_c10d()  # for groups this process makes later, which forked worlds would inherit
    preload()
    caps = make_caps(world, rank_cpu) if rank_cpu else None
    tmp = tempfile.mkdtemp(prefix="sp_plan_world_")
    pipes, procs = _start(fn, world, os.path.join(tmp, "init"), collective_timeout or timeout, args, kwargs, caps)
    try:
        results, errors = _collect(pipes, procs, world, timeout)
    finally:
        _reap(procs, tmp)
        left = remove_caps(caps) if caps else []
    if left:
        print(f"warning: cgroups left behind: {', '.join(left)}", file=sys.stderr)
    if errors:
        raise WorldError(f"world of {world} failed:\n" + "\n".join(errors))
    return results
