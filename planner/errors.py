"""One error type for bad user input: it names the field and the fix.

Not a ValueError on purpose: pydantic would wrap a ValueError raised in a validator, and we want
the field and fix to reach the user as written.

Its subclasses say what kind of failure it is (``NotFound``: an unknown name; ``Unavailable`` and ``StoreError``:
something the input needs is down), so an adapter picks its answer by class: the service its HTTP status
(service/errors.py), never by the field's text.
"""
from __future__ import annotations

import operator


class PlanError(Exception):
    """Bad input to sp-plan; the message names the field and how to fix it (CLI exits 2)."""

    def __init__(self, field: str, problem: str, fix: str):
        self.field, self.problem, self.fix = field, problem, fix
        super().__init__(f"{field}: {problem}; {fix}")


class NotFound(PlanError):
    """The input names something that does not exist: an unknown preset, stored profile or computed plan."""


class Unavailable(PlanError):
    """The input is fine but something it needs is down or broke (the service's search process, the store)."""


class StoreError(Unavailable):
    """The profile store cannot be opened or used: unreachable, unwritable, a bad URL or a newer schema."""


class MissingExtra(PlanError, ImportError):
    """A command needs an optional dependency that is not installed: a PlanError (the CLI exits 2 with one line)
    and an ImportError (what a library caller expects of a missing module)."""

    def __init__(self, module: str, extra: str, needed_by: str):
        PlanError.__init__(self, needed_by, f"needs {module}, which is not installed",
                           f"pip install 'sp-plan[{extra}]'")
        self.name = module


def require_extra(module: str, extra: str, needed_by: str) -> None:
    """Import ``module`` or raise MissingExtra naming the extra that brings it (pyproject's optional-dependencies)."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        raise MissingExtra(module, extra, needed_by) from None


def whole_number(field: str, value, low: int, fix: str, high: int | None = None) -> int:
    """``value`` as an int where it is a whole number from ``low`` (to ``high``), else a PlanError naming ``field``."""
    # operator.index takes what an int does and numpy's integers (a DataFrame's or a sweep's values), never a float;
    # a bool is an int to Python but no count a caller means
    try:
        n = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        n = None
    if n is None or n < low or (high is not None and n > high):
        span = f"at least {low:,}" if high is None else f"from {low:,} to {high:,}"
        problem = f"must be {span}, got {n:,}" if n is not None else \
            f"must be a whole number {'of ' if high is None else ''}{span}, got {value!r}"
        raise PlanError(field, problem, fix)
    return n


def of_type(field: str, value, cls: type, how: str):
    """``value`` where it is a ``cls``, else a PlanError naming ``field`` and ``how`` to pass one."""
    if not isinstance(value, cls):
        name = " or ".join(c.__name__ for c in cls) if isinstance(cls, tuple) else cls.__name__
        raise PlanError(field, f"{type(value).__name__} is no {name}", f"pass {how}")
    return value
