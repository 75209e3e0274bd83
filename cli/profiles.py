"""`sp-plan profile list|show|export|import|delete`: the profiles in the store (profiles/store.py).

Registered on the `sp-plan profile` group of cli/discover.py; every command takes ``--store URL``
(default ``$SP_PLAN_STORE``, else SQLite in the user data directory).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from sp_plan.cli.discover import _fail, err, out, profile_app
from sp_plan.planner.errors import PlanError

STORE_HELP = "store URL (SQLAlchemy: sqlite:///FILE, postgresql+psycopg://...)"
STORE_DEFAULT = "$SP_PLAN_STORE, else SQLite in the user data directory"


def _store(url: Optional[str], existing: bool = True):
    """The store of --store (else $SP_PLAN_STORE or the default); ``existing``: a command that only reads or deletes
    refuses a SQLite file that is not there rather than make an empty store of a mistyped path."""
    from sp_plan.profiles.store import Store  # noqa: PLC0415

    return Store(url, existing=existing)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _secs(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.3f} s"


def _stack(stack: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in stack.items()) or "-"


@profile_app.command("list")
def list_cmd(
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP, show_default=STORE_DEFAULT),
    cluster: Optional[str] = typer.Option(None, "--cluster", help="only profiles of this cluster (preset name or "
                                          "cluster file)", show_default="every cluster"),
    nodes: Optional[int] = typer.Option(None, "--nodes", min=1, help="node count for a --cluster preset", show_default="1"),
) -> None:
    """List the stored profiles, newest first."""
    try:
        fp = None
        if cluster is not None:
            from sp_plan.profiles import load_cluster  # noqa: PLC0415

            fp = load_cluster(cluster, nodes).topology_fingerprint()
        elif nodes is not None:
            raise PlanError("--nodes", "only filters together with --cluster", "add --cluster NAME|FILE or drop --nodes")
        st = _store(store)
        unreadable: list = []
        profiles = st.list_profiles(fp, unreadable)
    except PlanError as e:
        _fail(e)
    for pid, e in unreadable:  # listed beside the others, each with why
        err.print(f"profile {pid}: cannot read it ({e.field}: {e.problem}); {e.fix}", highlight=False)
    t = Table(title=f"profiles in {st.shown}" + (f" for topology {fp}" if fp else ""))
    for c in ("id", "cluster", "topology", "created", "candidates measured", "LOO error after", "stack"):
        t.add_column(c, justify="right" if c in ("candidates measured", "LOO error after") else "left")
    for p in profiles:
        ok = sum(1 for c in p.candidates if c.status == "ok")
        t.add_row(p.id or "", escape(p.cluster), p.cluster_fingerprint, p.created_at, f"{ok}/{len(p.candidates)}",
                  _pct(p.loo_error_after), escape(_stack(p.stack)))
    if profiles:
        out.print(t)
    else:
        out.print(f"no profiles stored in {st.shown}" + (f" for topology {fp}" if fp else "") + "; make one with "
                  "`sp-plan tune` or `sp-plan profile import FILE`", highlight=False)


@profile_app.command("show")
def show_cmd(
    id: str = typer.Argument(..., help="profile id (see `sp-plan profile list`)"),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP, show_default=STORE_DEFAULT),
) -> None:
    """Print one profile: what was fitted, and each candidate predicted before / after and measured."""
    try:
        p = _store(store).get_profile(id)
    except PlanError as e:
        _fail(e)
    out.print(f"[bold]{escape(p.line())}[/]", highlight=False)
    out.print(f"cluster {escape(p.cluster or '-')}, topology {p.cluster_fingerprint}, stack {escape(_stack(p.stack))}, "
              f"leave-one-out error {_pct(p.loo_error_before)} before -> {_pct(p.loo_error_after)} after", highlight=False,
              soft_wrap=True)
    if p.workloads:
        out.print("workloads: " + escape("; ".join(", ".join(f"{k}={v}" for k, v in w.items()) for w in p.workloads)),
                  highlight=False, soft_wrap=True)
    t = Table(title="parameters fitted")
    t.add_column("parameter")
    t.add_column("value")
    for name, value in p.params.model_dump(mode="json", exclude_defaults=True).items():
        t.add_row(name, escape(str(value)))
    out.print(t)
    for line in p.fitted:
        out.print(f"  {escape(line)}", highlight=False)
    c = Table(title="candidates (step time)")
    for col in ("#", "layout", "status", "predicted before", "predicted after", "measured", "error after"):
        c.add_column(col, justify="left" if col in ("layout", "status") else "right")
    for i, m in enumerate(p.candidates):
        e = "-"
        if m.measured_s and m.predicted_after_s is not None:
            e = f"{(m.predicted_after_s - m.measured_s) / m.measured_s:+.1%}"
        c.add_row(str(i + 1), escape(m.summary), m.status + (f" ({escape(m.reason)})" if m.reason else ""),
                  _secs(m.predicted_before_s), _secs(m.predicted_after_s), _secs(m.measured_s), e)
    out.print(c)


@profile_app.command("export")
def export_cmd(
    id: str = typer.Argument(..., help="profile id"),
    output: Path = typer.Option(..., "-o", "--output", help="write the profile here (.yaml or .json)"),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP, show_default=STORE_DEFAULT),
) -> None:
    """Write a stored profile to a file (to share it, or to pass as `--profile FILE`)."""
    try:
        p = _store(store).get_profile(id)
        try:
            p.save(output)
        except OSError as e:
            raise PlanError("--output", f"cannot write {output} ({e.strerror or e})", "pass a writable path") from None
    except PlanError as e:
        _fail(e)
    out.print(f"wrote {output} (profile {p.id})", highlight=False)


@profile_app.command("import")
def import_cmd(
    path: Path = typer.Argument(..., help="a profile file (from `sp-plan profile export`)"),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP, show_default=STORE_DEFAULT),
    server: Optional[str] = typer.Option(None, "--server", help="upload to a planner service (`sp-plan serve`) at "
                                         "this URL instead (token: $SP_PLAN_TOKEN)", show_default="the local store"),
) -> None:
    """Store a profile file; prints its id (kept from the file unless another profile holds it)."""
    taken = None
    try:
        from sp_plan.planner.profile import Profile  # noqa: PLC0415

        p = Profile.load(path)
        if server is not None:  # '' (an unset variable) is refused by the client, not taken for the local store
            from sp_plan.client import Client  # noqa: PLC0415

            pid, shown = Client.from_env(server).upload_profile(p), server
        else:
            st = _store(store, existing=False)
            (pid, taken), shown = st.import_profile(p), st.shown
    except PlanError as e:
        _fail(e)
    note = f"; the file's id {taken} holds another profile there" if taken else ""
    err.print(f"imported {path} as profile {pid} ({escape(p.cluster or '-')}, topology {p.cluster_fingerprint}) "
              f"into {shown}{note}", highlight=False)
    out.print(pid, highlight=False)


@profile_app.command("delete")
def delete_cmd(
    id: str = typer.Argument(..., help="profile id (or a unique prefix of 4+ characters)"),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP, show_default=STORE_DEFAULT),
) -> None:
    """Remove a profile from the store."""
    try:
        st = _store(store)
        real = st.delete_profile(id)
    except PlanError as e:
        _fail(e)
    out.print(f"deleted profile {real} from {st.shown}", highlight=False)
