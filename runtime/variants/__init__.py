"""Registry of the runtime's attention variants by plan algorithm name (the planner's registry's shape).

Each module of this subpackage (ring, ulysses, usp, wallfacer, tokenring, metp, allgather) is one variant and
calls ``register`` at import; this module imports none of them at its own import, so there is no import cycle.
``load_all`` is the one explicit import of the variant modules: every module of this subpackage. A new variant is
one new module here that calls ``register``.

Entry signature: fn(q, k, v, *, groups, ranks, causal, token_layout, scale, backend) -> out, with
``groups`` / ``ranks`` as ``runtime.context`` passes them (missing or None group = degree 1) and
``backend`` the block kernel's name for ``kernels.block_attention`` (None = its default). The variants that honour
masks (``attention.MASKED``: ring, ulysses, usp, allgather) also take ``cu_seqlens`` and ``window``.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import torch.distributed as dist


@dataclass(frozen=True)
class Variant:
    """One runtime attention variant: its plan algorithm name and its entry function."""

    name: str
    fn: Callable[..., object]


VARIANTS: dict[str, Variant] = {}

#: the modules that register the built-in variants (what ``variant_modules`` finds in this tree)
BUILTIN_MODULES = ("ring", "ulysses", "usp", "wallfacer", "tokenring", "metp", "allgather")


def register(name: str, fn) -> Variant:
    """Add an attention variant under its plan algorithm name (a second registration replaces the first)."""
    entry = Variant(name, fn)
    VARIANTS[name] = entry
    return entry


def variant_modules() -> list[str]:
    """Names of the variant modules: every public module of this subpackage."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


@lru_cache(maxsize=None)
def _import_variants() -> None:
    """Import every variant module once: listing the package reads its folder, which every attention call would pay."""
    for mod in variant_modules():
        importlib.import_module(f"{__name__}.{mod}")


def load_all() -> dict[str, Variant]:
    """Import the variant modules (each registers itself); the registry."""
    _import_variants()
    return VARIANTS


def degree(group) -> int:
    """Degree of a group; an absent group (None) is degree 1."""
    return 1 if group is None else dist.get_world_size(group)
