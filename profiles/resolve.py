"""Which parameters price a plan: the cluster's stored profile, a profile file, or the presets' defaults.

The planner takes ``Params`` and opens nothing; this module is where a profile is looked up (a file, an id in the
store, or the cluster's newest stored profile), beside the store it reads. The application pipeline
(``sp_plan.pipeline``) calls it before it searches.
"""
from __future__ import annotations

from sp_plan.planner.cluster import Cluster
from sp_plan.planner.params import Params
from sp_plan.planner.profile import Profile
from sp_plan.profiles.kernels import default_params
from sp_plan.profiles.peek import none_stored, store_url

NO_PROFILE_LINE = "not using a profile: none (--no-profile)"


def resolve_params(cluster: Cluster, profile=None, store=None) -> tuple[Params, str, Profile | None]:
    """(Params to price with, one line for the user, the Profile applied or None) for ``profile``: a Profile, an id
    or file (str), None (the cluster's newest stored profile) or False (none: the presets' defaults,
    ``profiles.kernels.default_params``); ``store`` is a Store, a URL or None (``$SP_PLAN_STORE``, else the user
    data directory's)."""
    if profile is False:  # no store to open: SQLAlchemy stays unimported
        return default_params(cluster), NO_PROFILE_LINE, None
    if profile is None and (store is None or isinstance(store, str)):
        none = none_stored(store_url(store), cluster.topology_fingerprint())
        if none:  # a glance at a SQLite store shows nothing to look up (profiles/peek.py)
            return default_params(cluster), f"not using a profile: {none}", None
    # the store module imports SQLAlchemy (~0.2 s): only a command that looks a profile up pays for it
    from sp_plan.profiles import store as store_mod  # noqa: PLC0415

    if isinstance(store, str):
        store = store_mod.Store(store)
    prof, line = store_mod.resolve_profile(profile, cluster, store=store)
    if prof is None:  # the presets' default terms (kernel curves, collective efficiencies, overheads)
        why = line.removeprefix("profile: ")
        return default_params(cluster), (why if why.startswith("not using") else f"not using a profile: {why}"), None
    return prof.params, (line if line.startswith("using") else f"using {line}"), prof

