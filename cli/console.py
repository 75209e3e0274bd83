"""The CLI's consoles and its one error line (the caller exits 2, or 1 for a stopped tune).

The planner, the store and the pipeline name the domain field an error is about ("store", "profile"); the CLI
prints the flag that sets it (``FLAGS``), so a user reads the option to change.
"""
from __future__ import annotations

import math
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from sp_plan.planner.errors import PlanError

#: stdout and stderr, as wide as the terminal (160 columns into a file, a pipe or a CI log: one-line rows and errors)
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)

#: a domain field an error names -> the flag that sets it; fields no flag sets (a plan file's, the environment's
#: SP_PLAN_STORE) are printed as they are
FLAGS = {
    "cluster": "--cluster", "nodes": "--nodes", "model": "--model", "store": "--store", "profile": "--profile",
    "storage": "--storage", "server": "--server", "trials": "--trials", "to": "--to", "token_file": "--token-file",
    "max_minutes": "--max-minutes", "output": "--output", "report": "--report", "sizes": "--sizes",
    "topo_file": "--topo-file", "seed": "--seed", "seq_len": "--seq-len", "batch": "--batch",
    "documents": "--documents", "window": "--window", "window_pattern": "--window-pattern",
}


#: the `profile` subcommands name a profile by its id argument, not by --profile
ID_FLAGS = {k: v for k, v in FLAGS.items() if k != "profile"}


def as_flag(e: PlanError, flags: dict[str, str] = FLAGS) -> PlanError:
    """``e`` with its domain field named by the flag that sets it (``e`` itself where no flag does)."""
    flag = flags.get(e.field)
    return e if flag is None else PlanError(flag, e.problem, e.fix)


def check_positive(flag: str, value: float) -> None:
    """A PlanError naming ``flag`` unless ``value`` is a positive finite number: typer reads ``nan`` and ``inf`` as
    floats, and ``nan <= 0`` is False, so a plain range check lets through a time that bounds nothing."""
    if not (value > 0 and math.isfinite(value)):
        raise PlanError(flag, f"must be a positive finite number, got {value:g}", "pass a positive number")


def print_error(text: str | PlanError, flags: dict[str, str] = FLAGS) -> None:
    """``error: TEXT`` on stderr (the word in red on a terminal); TEXT is escaped, never read as rich markup; a
    PlanError is printed with its field's flag (``as_flag`` with ``flags``)."""
    if isinstance(text, PlanError):
        text = str(as_flag(text, flags))
    err.print(f"[bold red]error[/]: {escape(text)}", highlight=False, soft_wrap=True)


def text_row(table: Table, *cells: str) -> None:
    """Add a row of data cells to ``table`` as literal text: a cell is never read as rich markup (a name with brackets
    prints as it is), and rich skips the markup pass it makes on each string cell, measured and rendered."""
    table.add_row(*(Text(c) for c in cells))
