"""What a process needs before it starts ranks of its own: a free port for their store, and c10d's flight recorder
off so that forked children do not inherit its mutex locked (tune's per-candidate worlds, the round probe)."""
from __future__ import annotations

import os
import pickle
import socket


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
