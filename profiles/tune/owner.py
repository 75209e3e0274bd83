"""Which process runs a tune: recorded in its run's meta, so that a second tune of the same key on this host does not
take over a run a live process still writes (both would measure into one run's checkpoints)."""
from __future__ import annotations

import os
import socket


def owner() -> dict:
    """This process, as a run's meta records it."""
    return {"host": socket.gethostname(), "pid": os.getpid()}


def running_elsewhere(meta: dict) -> str | None:
    """Why an unfinished run (its ``meta``) may not be resumed here: another live process on this host runs it; None
    where its process is gone, is this one, or ran on another host (whose processes this one cannot see)."""
    o = meta.get("owner") or {}
    pid = o.get("pid")
    if o.get("host") != socket.gethostname() or not isinstance(pid, int) or pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # alive, another user's
        pass
    return f"a tune of this cluster, model and flags is running in process {pid} on this host"
