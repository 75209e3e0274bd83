"""Which parameters price a plan: the cluster's stored profile, a profile file, or the presets' defaults.

The planner takes ``Params`` and opens nothing; this module is where a profile is looked up (a file, an id in the
store, or the cluster's newest stored profile) and checked against the cluster it would price. The application
pipeline (``sp_plan.pipeline``) calls it before it searches. The cluster's newest profile is read with a glance
(profiles/peek.py) where that tells; the ``Store`` (SQLAlchemy) is opened only where it does not, or for an id.
"""
from __future__ import annotations

import os

from sp_plan.planner.cluster import Cluster
from sp_plan.planner.errors import NotFound, PlanError, StoreError, of_type
from sp_plan.planner.params import Params
from sp_plan.planner.plausible import check_hbm, check_params
from sp_plan.planner.profile import STACK_KEYS, Profile
from sp_plan.planner.yamlio import model_from_data, names_file
from sp_plan.profiles.kernels import default_params, hbm_figure
from sp_plan.profiles.peek import TUNE, glance, sqlite_path, store_url

NO_PROFILE_LINE = "not using a profile: none (--no-profile)"


def resolve_params(cluster: Cluster, profile=None, store=None) -> tuple[Params, str, Profile | None]:
    """(Params to price with, one line for the user, the Profile applied or None) for ``profile``: a Profile, an id
    or file (str), None (the cluster's newest stored profile) or False (none: the presets' defaults,
    ``profiles.kernels.default_params``); ``store`` is a Store, a URL or None (``$SP_PLAN_STORE``, else the user
    data directory's)."""
    check_store(store)
    if profile is False:  # no store to open: SQLAlchemy stays unimported
        return default_params(cluster), NO_PROFILE_LINE, None
    prof, line = resolve_profile(profile, cluster, store=store)
    if prof is None:  # the presets' default terms (kernel curves, collective efficiencies, overheads)
        why = line.removeprefix("profile: ")
        return default_params(cluster), (why if why.startswith("not using") else f"not using a profile: {why}"), None
    return prof.params, (line if line.startswith("using") else f"using {line}"), prof


def resolve_profile(spec: Profile | str | os.PathLike | bool | None, cluster: Cluster,
                    store=None) -> tuple[Profile | None, str]:
    """The profile to apply to ``cluster`` (a Cluster, ``sp_plan.load_cluster``'s) or None, and one line saying what
    happened.

    spec None: the newest stored profile of the cluster's topology fingerprint; False: none; a
    Profile; a str or Path: a profile file if that path exists, else a profile id in ``store`` (a Store, a URL or
    None). A profile of another fingerprint or software stack is not applied (the line says why); a bad file or an
    unknown id raises PlanError('profile')."""
    of_type("cluster", cluster, Cluster, "sp_plan.load_cluster(name or file)")
    check_store(store)
    if isinstance(spec, os.PathLike):  # a file, as the cluster, model and plan take one
        spec = os.fspath(spec)
    if spec is False:
        return None, "profile: none (--no-profile)"
    if isinstance(spec, Profile):
        return check_profile(spec, cluster)
    if isinstance(spec, str) and names_file(spec):
        return check_profile(_load_file(spec), cluster)
    if spec is not None and not isinstance(spec, str):
        raise PlanError("profile", f"cannot use {type(spec).__name__} as a profile", "pass a file, an id, or nothing")
    if spec is None and (store is None or isinstance(store, str)):
        url = store_url(store)
        seen = glance(url, cluster.topology_fingerprint())
        if seen is not None and seen.document is None:
            return None, f"profile: {seen.line}"
        if seen is not None:
            return check_profile(model_from_data(Profile, seen.document, "profile", f"store {url}"), cluster)
        path = sqlite_path(url)
        if path is not None and not path.exists():  # named, and not there: said, and not made (a lookup only reads)
            return None, (f"profile: no store at {url} ({path} does not exist; check --store or $SP_PLAN_STORE)"
                          f"{TUNE} or `sp-plan profile import`")
    return _from_store(spec, cluster, store)


def _from_store(spec: str | None, cluster, store) -> tuple[Profile | None, str]:
    """``resolve_profile`` where the Store answers: profile id ``spec``, or the cluster's newest (``spec`` None)."""
    # the store module imports SQLAlchemy and alembic (~0.2 s): only a lookup the glance cannot answer pays for it
    from sp_plan.profiles.store import Store  # noqa: PLC0415

    path = None if isinstance(store, Store) else sqlite_path(store_url(store))
    if spec is not None and path is not None and not path.exists():  # a lookup only reads: no store is made
        raise NotFound("profile", f"no profile file or stored profile id {spec!r} (no store at {store_url(store)}: "
                       f"{path} does not exist)", "pass a profile file, or an id and the --store that holds it")
    store = store if isinstance(store, Store) else Store(store)
    if spec is not None:
        try:
            return check_profile(store.get_profile(spec), cluster)
        except NotFound:
            raise NotFound("profile", f"no profile file or stored profile id {spec!r} (store {store.shown})",
                           "pass a profile file or an id from `sp-plan profile list`") from None
    fp = cluster.topology_fingerprint()
    p = store.latest_profile(fp)
    if p is None:
        return None, f"profile: none stored for topology {fp} in {store.shown}{TUNE}"
    return check_profile(p, cluster)


def check_profile(profile: Profile, cluster) -> tuple[Profile | None, str]:
    """(``profile``, its line) where it may price ``cluster``; (None, why) for another topology or software stack;
    PlanError for figures no plan may be priced with (``check_params``, the device memory's datasheet)."""
    fp = cluster.topology_fingerprint()
    name = profile.id or "(file)"
    if profile.cluster_fingerprint != fp:
        return None, (f"profile {name} is for topology {profile.cluster_fingerprint}, this cluster's is {fp}; "
                      "not applied")
    try:
        check_params(profile.params, cluster)
        check_hbm(profile.params, datasheet_hbm(cluster))
    except PlanError as e:  # impossible figures: refused, never used to rank
        drop = f"delete it (`sp-plan profile delete {profile.id}`) and " if profile.id else ""
        raise PlanError("profile", f"profile {name}: {e.field}: {e.problem}",
                        f"{e.fix}, or {drop}pass --no-profile meanwhile") from None
    diff = stack_mismatch(profile.stack, cluster.calibration.get("stack"))
    if diff:
        return None, f"profile {name} not applied: software stack mismatch ({diff}); run `sp-plan tune` on this stack"
    return profile, profile.line()


def stack_mismatch(profile_stack: dict, cluster_stack: dict | None) -> str | None:
    """The first STACK_KEYS entry recorded by both and different, as 'key: profile A, this cluster B'; else None."""
    if not cluster_stack:
        return None
    for k in STACK_KEYS:
        if k in profile_stack and k in cluster_stack and str(profile_stack[k]) != str(cluster_stack[k]):
            return f"{k}: profile {profile_stack[k]}, this cluster {cluster_stack[k]}"
    return None


def datasheet_hbm(cluster) -> float | None:
    """The device-memory bytes/s no profile of ``cluster`` can beat: the fastest of its devices' datasheet figures
    (profiles/kernels.yaml), or None where a device has none (CPU ranks, a model the table lacks)."""
    figures = [hbm_figure(d.model) if d.kind != "cpu" else None
               for t in cluster.node_types.values() for d in t.devices]
    return None if not figures or None in figures else max(f["bandwidth"] for f in figures)


def _load_file(path: str) -> Profile:
    """The profile file at ``path``; its errors name the profile (once)."""
    try:
        return Profile.load(path)
    except PlanError as e:
        if e.field == "profile":  # already named: "profile: profile: ..." would say it twice
            raise
        raise PlanError("profile", f"{e.field}: {e.problem}", e.fix) from None


def check_store(store) -> None:
    """``store`` is None, a URL that is not blank, or a Store; else the PlanError ``Store(store)`` would raise."""
    if store is None:
        return
    if isinstance(store, str):
        if not store.strip():  # the glance would take '' as "the default store", where Store('') refuses it
            raise StoreError("store", "the store URL is empty", "give a SQLAlchemy URL such as "
                             "sqlite:////path/store.db, or leave --store out for $SP_PLAN_STORE or the default store")
        return
    # a non-str store is a Store, whose module is then loaded already: this import costs nothing
    from sp_plan.profiles.store import Store  # noqa: PLC0415

    of_type("store", store, Store, "an sp_plan.Store or a SQLAlchemy URL (str), or None for the default store")
