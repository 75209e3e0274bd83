"""The parts a step's schedule is built and priced from, and what each depends on (the Estimator's cache keys)."""
from __future__ import annotations

from .algorithms import ALGORITHMS
from .schedules import Shape, head_steps, layer_schedule, pipeline_p2p

#: schedule parts whose phases run on tp and pp only: the same for every algorithm and token layout
RING_FREE_PARTS = ("fwd-linear", "bwd-linear", "head", "pp")


def schedule_key(part: str, c: Shape) -> tuple:
    """What a schedule part depends on: never dp, pp only for the stage sends; the attention parts on the
    (algorithm, ring, team, placement, token layout) shape and the volumes (tp, ulysses, mbs), the others
    on the volumes alone (a rank's tokens: ulysses x ring, not how it splits; and, for the linear parts, whether the
    algorithm runs Megatron TP-sp); made once per shape and part (``Shape.keys``)."""
    key = c.keys.get(part)
    if key is None:
        key = c.keys[part] = _schedule_key(part, c)
    return key


def _schedule_key(part: str, c: Shape) -> tuple:
    """``schedule_key``, made."""
    if part in RING_FREE_PARTS:
        tp_sp = ALGORITHMS[c.algorithm].tp_sp if part != "head" and part != "pp" else True
        return (part, tp_sp, c.sp, c.tp, c.mbs, c.pp if part == "pp" else 1)
    return (part, c.algorithm, c.ulysses, c.ring, c.team, c.placement, c.token_layout, c.tp, c.mbs, c.kv_chunks)


SCHEDULE_PARTS = {  # "fwd" and "bwd" (layer_schedule) are their linear part + attention_steps
    "fwd-linear": lambda c, train: layer_schedule(c, backward=False, attention=False),
    "bwd-linear": lambda c, train: layer_schedule(c, backward=True, attention=False),
    "head": head_steps,
    "pp": pipeline_p2p,
}
