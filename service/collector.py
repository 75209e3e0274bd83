"""The garbage-collector and exit policy of a process that owns them (the CLI, the service's search processes); the
library (planner/) leaves the host process's collector and exit alone."""
from __future__ import annotations

import atexit
import gc
import os
import sys
import threading
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for a block, as it was after: around the pipeline call. The search's caches
    hold ~10^5 acyclic objects that each full collection would walk again (measured: 40 % of a 1,024-GPU batch-16
    search); on the way out they are promoted to the oldest generation (``gc.freeze`` then ``gc.unfreeze``), where a
    young collection would have moved them after walking them all once more."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.freeze()
            gc.unfreeze()
            gc.enable()


def exit_without_teardown(code: int) -> None:
    """End a process whose command is done with ``code``, without the interpreter's teardown: the exit handlers run
    (``atexit``: multiprocessing's, logging's, temporary files', coverage's) and the standard streams are flushed, then
    the process ends (``os._exit``). The teardown would free every object the command made, one by one: 0.01-0.02 s
    after a plan at 1,024 or 131,072 GPUs (its full collection, 0.2-0.4 s at 131,072, is what the freeze spares).
    Returns (the caller then exits as usual) where a non-daemon thread still runs, which the interpreter would wait
    for, or where a stream cannot be flushed, whose error the interpreter reports."""
    if any(t is not threading.main_thread() and not t.daemon for t in threading.enumerate()):
        return
    gc.freeze()  # what the handlers allocate is collected; what the command made is not walked again
    atexit._run_exitfuncs()  # the one way to run them without the teardown that follows them
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed pipe or stream: the interpreter's exit reports it
        return
    os._exit(code)
