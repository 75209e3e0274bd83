"""Run a function on a small local torch.distributed world (gloo, forked processes) with a deadline.

Used by the tests, the benchmarks and ``sp-plan`` itself for CPU worlds. Children are forked
from a parent that already imported torch, so a world of 8 starts in well under a second. A
child that raises, dies or hangs ends the whole world with an error inside ``timeout``.
"""
from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import pickle
import socket
import tempfile
import time
import traceback
from typing import Any, Callable


class WorldError(RuntimeError):
    """A rank of a spawned world failed, died or did not finish in time."""


def free_port(addr: str = "127.0.0.1") -> int:
    """A TCP port free on ``addr`` now (a store binds it a moment later); any interface if ``addr`` is not this host's."""
    for host in (addr, ""):
        try:
            with socket.socket() as s:
                s.bind((host, 0))
                return s.getsockname()[1]
        except OSError:
            continue
    raise OSError("no free TCP port")


def fork_safe_c10d() -> None:
    """Turn c10d's flight recorder off (``TORCH_FR_BUFFER_SIZE=0``, unless set) before this process's first group.

    Every gloo collective takes the recorder's mutex, on the caller's thread and again on gloo's worker thread
    when it retires; a child forked while a worker thread holds it inherits it locked, and the child's first
    process group waits on it for ever (``FlightRecorder::record_pg_ranks``). Tune forks a child world per
    candidate right after a collective (the port's broadcast), so its ranks must not record.
    """
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "0")


def flight_recorder_on() -> bool:
    """Whether this process's c10d flight recorder records (then forking a child that builds groups can hang)."""
    from torch._C._distributed_c10d import _dump_fr_trace

    return bool(pickle.loads(_dump_fr_trace()).get("pg_config"))


def _linger(dist) -> None:
    """Stay until every rank is done: gloo connects a new group's members pairwise, and a rank that exits
    while a peer still connects to it fails that peer ("connectFullMesh ... Connection closed by peer")."""
    if dist.is_initialized():
        dist.barrier()


def _child(fn, rank, world, init_file, timeout, args, kwargs, conn):
    import torch
    import torch.distributed as dist

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


def run_world(fn: Callable[..., Any], world: int, *args, timeout: float = 60.0,
              collective_timeout: float | None = None, **kwargs) -> list[Any]:
    """Run ``fn(rank, world, *args, **kwargs)`` on ``world`` forked gloo ranks; return their results.

    Raises WorldError naming the failing rank(s) if any rank raises, dies, or the world is not
    done within ``timeout`` seconds (collectives also time out at ``timeout``, or at ``collective_timeout``).
    """
    fork_safe_c10d()  # for groups this process makes later, which forked worlds would inherit
    ctx = mp.get_context("fork")
    tmp = tempfile.mkdtemp(prefix="sp_plan_world_")
    init_file = os.path.join(tmp, "init")
    pipes, procs = [], []
    for rank in range(world):
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child, args=(fn, rank, world, init_file, collective_timeout or timeout, args, kwargs,
                                             child), daemon=True)
        p.start()
        child.close()
        pipes.append(parent)
        procs.append(p)
    results: list[Any] = [None] * world
    errors: list[str] = []
    done = [False] * world
    deadline = time.monotonic() + timeout + 5.0
    try:
        while not all(done):
            if time.monotonic() > deadline:
                late = [r for r in range(world) if not done[r]]
                raise WorldError(f"world of {world} timed out after {timeout:.0f}s; ranks {late} did not finish"
                                 + ("\n" + "\n".join(errors) if errors else ""))
            for r in range(world):
                if done[r]:
                    continue
                if pipes[r].poll(0.01):
                    try:
                        status, payload = pipes[r].recv()
                    except EOFError:
                        status, payload = "error", f"rank {r}: died without a result"
                    done[r] = True
                    if status == "ok":
                        results[r] = pickle.loads(payload)
                    else:
                        errors.append(payload)
                elif not procs[r].is_alive() and not pipes[r].poll(0):
                    done[r] = True
                    errors.append(f"rank {r}: died with exit code {procs[r].exitcode}")
            if errors:
                # one failure dooms the world: stop waiting for peers blocked on it
                break
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(timeout=5)
        try:
            for f in os.listdir(tmp):
                os.unlink(os.path.join(tmp, f))
            os.rmdir(tmp)
        except OSError:
            pass
    if errors:
        raise WorldError(f"world of {world} failed:\n" + "\n".join(errors))
    return results
