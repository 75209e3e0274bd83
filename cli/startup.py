"""The CLI's start: the cyclic garbage collector paused while the app's modules load; cli/app.py resumes it at its end.

The CLI process owns its collector, as around the pipeline call (``cli/options.owns_collector``). Loading the app
builds ~10^5 objects (typer's commands, pydantic's schemas and validators, rich), which ~90 young collections would
walk again and again: about 0.04 s of every command's start. Importing this module pauses the collector; ``resume``
puts it back as it was.
"""
from __future__ import annotations

import gc

_WAS_ENABLED = gc.isenabled()
gc.disable()


def resume() -> None:
    """The collector as it was before the app's modules loaded."""
    if _WAS_ENABLED:
        gc.enable()
