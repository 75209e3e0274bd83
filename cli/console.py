"""The CLI's consoles and its one error line (the caller exits 2, or 1 for a stopped tune)."""
from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape

#: stdout and stderr, as wide as the terminal (160 columns into a file, a pipe or a CI log: one-line rows and errors)
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def print_error(text: str) -> None:
    """``error: TEXT`` on stderr (the word in red on a terminal); TEXT is escaped, never read as rich markup."""
    err.print(f"[bold red]error[/]: {escape(text)}", highlight=False, soft_wrap=True)
