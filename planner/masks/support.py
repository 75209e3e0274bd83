"""Which algorithms honour document masks and sliding windows, and the refusal of the others."""
from __future__ import annotations

from ..errors import PlanError
from ..model import Workload


#: the algorithms that honour packed documents and sliding windows (runtime/attention.py MASKED); the others refuse
MASKED_ALGORITHMS = ("ring", "ulysses", "usp", "allgather")


def has_mask(work: Workload | None) -> bool:
    """Whether the workload's attention is more than one causal or bidirectional document: documents or a window."""
    return work is not None and (work.documents is not None or work.mask_window is not None)


def refuse_masks(algorithm: str, work: Workload | None) -> None:
    """A PlanError for an algorithm outside MASKED_ALGORITHMS on a workload with documents or a window."""
    if not has_mask(work) or algorithm in MASKED_ALGORITHMS:
        return
    field = "workload.documents" if work.documents is not None else "workload.window"
    raise PlanError(field, f"{algorithm} does not honour packed documents or sliding windows",
                    f"use algorithm {', '.join(MASKED_ALGORITHMS[:-1])} or {MASKED_ALGORITHMS[-1]}, which do")
