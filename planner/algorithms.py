"""Registry of the attention algorithms the planner prices; it imports none of them.

Each algorithm gives the attention phases of one layer (a schedule), its transient buffers, the
variants it adds to the search for a choice of degrees (team sizes, placements, token layouts),
and its own constraints. Each lives in one module that registers itself here (planner/usp.py for
ring, ulysses and usp; wallfacer, tokenring, metp, allgather); the package lists them (planner/__init__.py's
ALGORITHM_MODULES) and the registry imports them on its first read, so adding an algorithm is one new
module and its name there, and importing the planner to read a preset loads no schedule.
"""
from __future__ import annotations

import threading
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
    # (degrees, model, workload) -> the variants of the degrees' tp x ulysses x ring split; the search asks once per
    # split, at dp and pp 1
    variants: Callable[..., list[Variant]] = field(default=lambda d, model, work: [])
    check: Callable[..., None] | None = None  # (candidate, model, workload) -> raises PlanError
    tp_sp: bool = True  # the block's linear layers use Megatron TP-sp collectives over tp (METP: its own)
    activations: Callable[..., dict] | None = None  # (shape, checkpointing, training) -> bytes by kind
    batch_linear: bool = True  # every volume and FLOP count of its steps is linear in the micro-batch (METP's
    # weight slices are not): the planner builds them for one sequence and scales them (schedules.scaled)


_LOAD_LOCK = threading.RLock()


class Algorithms(dict):
    """name -> Algorithm, every built-in one loaded: a plain dict to read (the search reads it ~10^5 times)."""

    def load(self) -> "Algorithms":
        return self

    def add(self, alg: Algorithm) -> None:
        """Register ``alg`` in its place: the built-in algorithms in the package's order (a module's own in its
        order), then any registered later, whichever module was imported first."""
        dict.__setitem__(self.load(), alg.name, alg)
        rank = {f"{__package__}.{m}": i for i, m in enumerate(import_module(__package__).ALGORITHM_MODULES)}
        ordered = sorted(dict.items(self), key=lambda kv: rank.get(kv[1].steps.__module__, len(rank)))  # stable
        dict.clear(self)
        dict.update(self, ordered)


class Registry(Algorithms):
    """The registry before its first read, which imports the package's ALGORITHM_MODULES (each registers its
    algorithms) and then becomes a plain ``Algorithms``."""

    def load(self) -> Algorithms:
        with _LOAD_LOCK:  # another thread's first read waits; the importing thread's register() calls pass
            if type(self) is Registry and not self.__dict__.get("loading"):
                self.loading = True
                try:
                    for name in import_module(__package__).ALGORITHM_MODULES:
                        import_module(f"{__package__}.{name}")
                    self.__class__ = Algorithms
                finally:
                    self.loading = False
        return self

    def __getitem__(self, name: str) -> Algorithm:
        return dict.__getitem__(self.load(), name)

    def __contains__(self, name: object) -> bool:
        return dict.__contains__(self.load(), name)

    def __iter__(self):
        return dict.__iter__(self.load())

    def __len__(self) -> int:
        return dict.__len__(self.load())

    def get(self, name: str, default=None):
        return dict.get(self.load(), name, default)

    def keys(self):
        return dict.keys(self.load())

    def values(self):
        return dict.values(self.load())

    def items(self):
        return dict.items(self.load())


ALGORITHMS: Algorithms = Registry()


def register(alg: Algorithm) -> Algorithm:
    ALGORITHMS.add(alg)
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
    """Every built-in algorithm registered (the registry's first read does it too)."""
    ALGORITHMS.load()
