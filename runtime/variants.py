"""Registry of the runtime's attention variants by plan algorithm name (the planner's registry's shape).

Each variant module (ring, ulysses, usp, wallfacer, tokenring, metp) calls ``register`` at import;
this module imports none of them, so there is no import cycle. ``load_all`` is the one explicit
import of the built-in variant modules. A new variant is one new module that calls ``register``
(and a line in ``load_all``).

Entry signature: fn(q, k, v, *, groups, ranks, causal, token_layout, scale, backend) -> out, with
``groups`` / ``ranks`` as ``runtime.context`` passes them (missing or None group = degree 1) and
``backend`` the block kernel's name for ``kernels.block_attention`` (None = its default).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch.distributed as dist


@dataclass(frozen=True)
class Variant:
    """One runtime attention variant: its plan algorithm name and its entry function."""

    name: str
    fn: Callable[..., object]


VARIANTS: dict[str, Variant] = {}

#: the modules that register the built-in variants, imported by ``load_all``
BUILTIN_MODULES = ("ring", "ulysses", "usp", "wallfacer", "tokenring", "metp")


def register(name: str, fn) -> Variant:
    """Add an attention variant under its plan algorithm name (a second registration replaces the first)."""
    entry = Variant(name, fn)
    VARIANTS[name] = entry
    return entry


def load_all() -> dict[str, Variant]:
    """Import the built-in variant modules (each registers itself); the registry."""
    import importlib

    for mod in BUILTIN_MODULES:
        importlib.import_module(f"{__package__}.{mod}")
    return VARIANTS


def degree(group) -> int:
    """Degree of a group; an absent group (None) is degree 1."""
    return 1 if group is None else dist.get_world_size(group)
