"""The CLI's standard-error console and its one error line (the caller exits 2, or 1 for a stopped tune)."""
from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape

#: stderr, as wide as the terminal (160 columns into a file or pipe, so that one error stays one line)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def print_error(text: str) -> None:
    """``error: TEXT`` on stderr (the word in red on a terminal); TEXT is escaped, never read as rich markup."""
    err.print(f"[bold red]error[/]: {escape(text)}", highlight=False, soft_wrap=True)
