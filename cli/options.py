"""What the commands share: the profile and store options' help, the profile choice, the exit on bad input and the
garbage collector's policy around a search."""
from __future__ import annotations

import functools
from typing import Callable, NoReturn, Optional

import typer

from sp_plan.cli.console import print_error
from sp_plan.planner.errors import PlanError
from sp_plan.service.collector import collector_paused

PROFILE_HELP = "calibration profile: a stored profile id or a profile file"
PROFILE_DEFAULT = "the cluster's newest stored profile"
NO_PROFILE_HELP = "price with the presets' default model terms, without a profile (opens no store)"
STORE_HELP = "profile store URL, e.g. sqlite:////path/store.db"
STORE_DEFAULT = "$SP_PLAN_STORE, else SQLite in the user data directory"
JSON_HELP = "print the answer as JSON: the HTTP response model (what POST /v1/plan or /v1/estimate returns)"


def jobs_option() -> Optional[int]:
    """`--jobs`: the processes a command's searches run in (None: ``workers.auto_jobs``, the usable cores)."""
    return typer.Option(None, "--jobs", min=1, help="processes the searches run in (forked, each a share of the "
                        "degrees choices or of the re-rankings; the same plans, though the count priced may differ as the shares prune "
                        "one another)",
                        show_default="the usable cores, at most 8")


def fail(e: PlanError) -> NoReturn:
    """Print the error's one line (its field named by the flag: console.as_flag) and exit 2."""
    print_error(e)
    raise typer.Exit(2)


def profile_options(profile: Optional[str], no_profile: bool) -> object:
    """The profile spec for profiles.resolve.resolve_params: False (--no-profile), an id or file, or None (the
    store's)."""
    if no_profile and profile:
        raise PlanError("--profile", "both --profile and --no-profile given", "pass one of them")
    return False if no_profile else profile


def owns_collector(command: Callable) -> Callable:
    """A command run with the garbage collector paused (``service.collector.collector_paused``): this process owns its
    collector, and a command that plans allocates ~10^5 objects a collection would walk again and again."""
    @functools.wraps(command)  # typer reads the options from the wrapped function's signature
    def run(*args, **kwargs):
        with collector_paused():
            return command(*args, **kwargs)

    return run
