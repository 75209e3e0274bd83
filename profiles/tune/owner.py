"""Which process runs a tune: recorded in its run's meta, so that a second tune of the same key on this host does not
take over a run a live process still writes (both would measure into one run's checkpoints)."""
from __future__ import annotations

import os
import socket


def owner() -> dict:
    """This process, as a run's meta records it: its host, pid, and where the system says so its start (clock ticks
    after boot) and the boot's id, so that a pid the system gave again to another process is not taken for it."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": started(os.getpid()), "boot": boot_id()}


def started(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks after boot (/proc/PID/stat's 22nd field); None where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])  # after the command's ")": fields 3, 4, ...
    except (OSError, ValueError, IndexError):
        return None


def boot_id() -> str | None:
    """This boot's id (a reboot or a new container gives pids again from the start); None where unknown."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


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
    if o.get("boot") and boot_id() and o["boot"] != boot_id():
        return None  # recorded before a reboot: that process is gone, whatever has its pid now
    if o.get("started") is not None and started(pid) not in (None, o["started"]):
        return None  # another process was given the pid
    return f"a tune of this cluster, model and flags is running in process {pid} on this host"
