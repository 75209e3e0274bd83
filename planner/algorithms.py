"""Registry of the attention algorithms the planner prices; it imports none of them.

Each algorithm gives the attention phases of one layer (a schedule), its transient buffers, the
variants it adds to the search for a choice of degrees (team sizes, placements, token layouts),
and its own constraints. Each lives in one module that registers itself here (planner/usp.py for
ring, ulysses and usp; wallfacer, tokenring, metp); the package imports them (planner/__init__.py), so
adding an algorithm is one new module and its line there.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from importlib import import_module
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # annotations only: the registry imports no schedule at run time
    from .schedules import Shape, Step


@dataclass(frozen=True)
class Variant:
    """What an algorithm adds to one choice of degrees: its name, team size, placement, token layouts."""

    algorithm: str
    team: int = 1
    placement: str | None = None
    layouts: tuple[str, ...] | None = None  # None: the space's default layouts for the degrees


@dataclass(frozen=True)
class Algorithm:
    name: str
    steps: Callable[[Shape, bool], list[Step]]
    buffers: Callable[[Shape, bool], float]
    variants: Callable[..., list[Variant]] = field(default=lambda d, model, work: [])
    check: Callable[..., None] | None = None  # (candidate, model, workload) -> raises PlanError
    tp_sp: bool = True  # the block's linear layers use Megatron TP-sp collectives over tp (METP: its own)
    activations: Callable[..., dict] | None = None  # (shape, checkpointing, training) -> bytes by kind
    batch_linear: bool = True  # every volume and FLOP count of its steps is linear in the micro-batch (METP's
    # weight slices are not): the planner builds them for one sequence and scales them (schedules.scaled)


ALGORITHMS: dict[str, Algorithm] = {}


def register(alg: Algorithm) -> Algorithm:
    ALGORITHMS[alg.name] = alg
    return alg


def algorithm_for(ulysses: int, ring: int) -> str:
    """The name of the USP family member for these degrees (structural rules live in Plan's validator)."""
    return "usp" if ulysses > 1 and ring > 1 else ("ulysses" if ulysses > 1 else "ring")


def variants(d, model, work) -> list[Variant]:
    """Every algorithm variant for degrees ``d``, built-ins first, in a stable order."""
    out = []
    for alg in ALGORITHMS.values():
        out += alg.variants(d, model, work)
    return out


def load_all() -> None:
    """Every algorithm registered (kept for callers): importing the package registers them all."""
    import_module(__package__)
