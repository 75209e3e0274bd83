"""What a benchmark prints first, so that its figures name the code that produced them."""
from __future__ import annotations

import subprocess
from pathlib import Path


def commit() -> str:
    """The short commit this ran at, "+dirty" with uncommitted changes to tracked files, or "unknown" outside git."""
    here = Path(__file__).parent
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (out.stdout.strip() + ("+dirty" if dirty else "")) if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"
