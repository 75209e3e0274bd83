"""The garbage-collector policy of a process that owns its collector (the CLI, the service's search processes); the
library (planner/) leaves the host process's collector alone."""
from __future__ import annotations

import gc
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


def skip_final_collection() -> None:
    """A process about to exit: move every object out of the collector's reach (``gc.freeze``), so the interpreter's
    last full collection does not walk what the command made (0.2-0.4 s after a 131,072-GPU plan)."""
    gc.freeze()
