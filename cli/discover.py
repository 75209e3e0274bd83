"""`sp-plan discover` and `sp-plan profile links`: find the cluster's topology, measure its links.

Both work under torchrun (every rank joins; rank 0 prints and writes); `discover` also works alone
(this host only). `register(app)` adds them to the main app; ``profile_app`` is the `sp-plan profile`
group, open for more subcommands (a later `sp-plan profile run`).
"""
from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from sp_plan.cli.console import ID_FLAGS, as_flag, check_positive, err, out, print_error
from sp_plan.cli.progress import reporter
from sp_plan.planner.cluster import NET, Cluster
from sp_plan.planner.errors import PlanError
from sp_plan.planner.yamlio import check_writable
from sp_plan.profiles.discover import sizes as link_sizes
from sp_plan.profiles.discover.sizes import DEFAULT_SIZES


profile_app = typer.Typer(no_args_is_help=True, help="Measure this cluster under torchrun and calibrate the cluster file; list, show, export, import and delete stored profiles.")



def _fail(e: PlanError, rank: int = 0) -> None:
    """Print the error on rank 0 (fields by their flags; a profile by its id argument) and exit 2."""
    if rank == 0:
        print_error(e, ID_FLAGS)
    raise typer.Exit(2)


def parse_sizes(text: str, flag: str = "--sizes") -> list[int]:
    """``--sizes`` (or the ``flag`` of another command, tune's ``--link-sizes``): ``16K,1M,64m,1G`` or plain byte
    counts -> bytes (``profiles.discover.sizes``; errors name ``flag``, the option the user typed)."""
    try:
        return link_sizes.parse_sizes(text)
    except PlanError as e:
        raise PlanError(flag, e.problem, e.fix) from None


def rate(x: float) -> str:
    return f"{x / 1e9:.3g} GB/s" if x >= 1e9 else f"{x / 1e6:.3g} MB/s"


def _node_tree(cluster: Cluster, k: int, host) -> Tree:
    t = cluster.nodes[k]
    nt = cluster.node_types[t]
    name = host.hostname if host else f"node {k}"
    node = Tree(f"[bold]node {k}[/] {name}  [dim]type {t}[/]")
    devs = Counter((d.model, d.kind, round(d.memory_bytes / 2**30, 1)) for d in nt.devices)
    for (model, kind, gib), n in devs.items():
        node.add(f"{n} x {model} ({kind}, {gib} GiB)")
    kinds: dict[tuple, int] = Counter((l.kind, l.capacity) for l in nt.links if NET not in (l.src, l.dst))
    intra = node.add("intra-node links (per direction)")
    for (kind, cap), n in sorted(kinds.items()):
        intra.add(f"{kind}: {n} x {rate(cap)}")
    nics = node.add("NICs")
    from sp_plan.profiles.discover import nic_names  # noqa: PLC0415 - the host readers (NVML, sysfs): discovery loads them

    real = nic_names(host, cluster.num_nodes > 1) if host is not None else {}
    users = Counter(d.nic for d in nt.devices)
    for s in nt.switches:
        if s.kind == "nic":
            label = f" = {real[s.name]}" if s.name in real else ""
            nics.add(escape(f"{s.name}{label}: {s.network} {rate(s.rate or 0)} ({s.rate * 8 / 1e9:g} Gb/s), "
                     f"used by {users.get(s.name, 0)} device(s)"))
    if host is not None:
        src = node.add("sources")
        for key, val in host.sources.items():
            src.add(escape(f"{key}: {val}"))
    return node


def print_cluster(cluster: Cluster, hosts: list | None = None) -> None:
    """A tree of what discovery found: nodes, devices, links, NICs, sources, then the warnings."""
    hosts = hosts or []
    root = Tree(f"[bold]{cluster.name}[/]: {cluster.num_nodes} node(s), {cluster.world_size} device(s), "
                f"network {cluster.network}, fingerprint {cluster.fingerprint()}")
    for k in range(cluster.num_nodes):
        host = hosts[k] if k < len(hosts) else None
        if k and cluster.nodes[k] == cluster.nodes[0] and host is not None and host.sources == hosts[0].sources:
            root.add(f"[bold]node {k}[/] {host.hostname}  [dim]same as node 0[/]")
            continue
        root.add(_node_tree(cluster, k, host))
    if cluster.warnings:
        w = root.add(f"[yellow]warnings ({len(cluster.warnings)})[/]")
        for msg in cluster.warnings:
            w.add(f"[yellow]{escape(msg)}[/]", highlight=False)
    out.print(root)


def _describe_local(sysfs_root: str, topo_file: Optional[Path], no_nvml: bool):
    topo = None
    if topo_file is not None:
        if not topo_file.is_file():
            raise PlanError("--topo-file", f"{topo_file} does not exist or is not a file",
                            "pass a file holding `nvidia-smi topo -m` output")
        try:
            topo = topo_file.read_text(errors="replace")
        except OSError as e:
            raise PlanError("--topo-file", f"cannot read {topo_file} ({e.strerror})", "pass a readable file") from None
    from sp_plan.profiles.discover import describe_host  # noqa: PLC0415 - as in _node_tree

    return lambda r=None: describe_host(sysfs_root, nvml=False if no_nvml else None, topo_text=topo,
                                        node_rank=r.node_rank if r is not None else 0)


def discover_cmd(
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="write the Cluster here (.yaml or .json)",
                                          show_default="print only"),
    topo_file: Optional[Path] = typer.Option(None, "--topo-file", help="a saved `nvidia-smi topo -m` output to use "
                                             "instead of running it", show_default="run nvidia-smi where there is one"),
    no_nvml: bool = typer.Option(False, "--no-nvml", help="do not use NVML (nvidia-ml-py)"),
    sysfs_root: str = typer.Option("/", "--sysfs-root", hidden=True, help="root of /sys (tests)"),
    name: Optional[str] = typer.Option(None, "--name", help="name of the cluster", show_default="discovered-HOSTNAME; discovered-NxTYPE for several nodes"),
    timeout: float = typer.Option(120.0, "--timeout", help="seconds any rank waits for the others"),
) -> None:
    """Find this cluster's devices, links and NICs (alone: this host; under torchrun: every node)."""
    from sp_plan.profiles.discover import build_cluster  # noqa: PLC0415 - as in _node_tree

    rank, owned, probe = 0, False, None
    try:
        check_positive("--timeout", timeout)
        if output:
            check_writable(output)
        describe = _describe_local(sysfs_root, topo_file, no_nvml)
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun: import torch only then
            from sp_plan.profiles.discover import probe  # noqa: PLC0415 - torch (~2 s): only a measuring command loads it
        if probe is not None and probe.under_torchrun():
            owned = probe.init_world(timeout)
            rank = probe.dist.get_rank()
            hosts = probe.gather_hosts(describe)
        else:
            hosts = [describe()]
        cluster = build_cluster(hosts, name)
    except PlanError as e:
        if probe is not None:
            probe.finish(owned)
        _fail(e, rank)
    if rank == 0:
        print_cluster(cluster, hosts)
        if output:
            try:
                cluster.save(output)
            except PlanError as e:
                _fail(e, rank)
            out.print(f"wrote {output}")
    if owned:
        probe.dist.barrier()
        probe.finish(owned)


@profile_app.command("links")
def links_cmd(
    cluster_file: Optional[Path] = typer.Option(None, "--cluster", help="cluster file from `sp-plan discover`",
                                                show_default="discover now"),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="write the calibrated Cluster here",
                                          show_default="--cluster, else cluster.yaml"),
    sizes: Optional[str] = typer.Option(None, "--sizes", help="message sizes, e.g. 64K,1M,16M",
                                        show_default="16K..4M on CPU, 1M..256M on GPU"),
    timeout: float = typer.Option(60.0, "--timeout", help="seconds any one measurement may wait"),
    store: Optional[str] = typer.Option(None, "--store", help="also save the link fit in this store (SQLAlchemy URL)",
                                        show_default="$SP_PLAN_STORE, else SQLite in the user data directory"),
    quiet: bool = typer.Option(False, "--quiet", help="print no progress, only what was written"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON event per line (progress, then the result "
                                 "or the error) instead of tables"),
) -> None:
    """Time send/recv, all-gather, reduce-scatter and all-to-all within and across nodes; fit and store the links."""
    try:  # the flags first, before torch is imported and the world is checked: a mistyped one is answered at once
        given_sizes, given_cluster = _check_links_flags(cluster_file, output, sizes, timeout)
    except PlanError as e:
        _refuse(e, 0, as_json)
    from sp_plan.profiles.discover import build_cluster, probe  # noqa: PLC0415 - torch (~2 s): only a measuring command

    rank, owned, db = 0, False, None
    try:
        if not probe.under_torchrun() or int(os.environ.get("WORLD_SIZE", "1")) < 2:
            raise PlanError("profile links", "needs a torchrun world of at least 2 ranks",
                            "run `torchrun --nproc-per-node N -m sp_plan.cli.app profile links`")
        size_list = given_sizes or parse_sizes(DEFAULT_SIZES["cuda" if probe.use_cuda() else "cpu"])
        if os.environ.get("RANK", "0") == "0":  # rank 0 writes: a bad --store fails before any measuring
            from sp_plan.profiles.store import Store  # noqa: PLC0415 - SQLAlchemy: only a command that stores loads it
            db = Store(store)
        owned = probe.init_world(max(timeout, 60.0))
        rank = probe.dist.get_rank()
        hosts = probe.gather_hosts()
        cluster = given_cluster or build_cluster(hosts)
        probe.check_world(cluster, hosts)
    except PlanError as e:
        probe.finish(owned)
        _refuse(e, rank, as_json)
    dest = output or cluster_file or Path("cluster.yaml")
    if rank != 0:
        new, samples = probe.profile_links(cluster, hosts, size_list, timeout)
    else:
        with reporter("profile links", ("links",), err, quiet, as_json) as prog:
            new, samples = probe.profile_links(cluster, hosts, size_list, timeout,
                                               lambda i, n, lab: prog("links", i, n, lab))
        prog.result(_save_links(new, dest, db, tables=not (quiet or as_json), quiet=as_json))
    probe.dist.barrier()
    probe.finish(owned)


def _check_links_flags(cluster_file: Optional[Path], output: Optional[Path], sizes: Optional[str],
                       timeout: float) -> tuple[list[int] | None, Cluster | None]:
    """`profile links`' flags, or a PlanError naming one: the sizes read (None: the device's defaults, known once
    torch is), a positive finite --timeout, a writable --output and the --cluster file read (None: discover now)."""
    size_list = parse_sizes(sizes) if sizes else None
    check_positive("--timeout", timeout)
    if output:
        check_writable(output)
    return size_list, Cluster.load(cluster_file) if cluster_file else None


def _refuse(e: PlanError, rank: int, as_json: bool) -> None:
    """`profile links`' error: the JSON error event first (``--json``, rank 0), then ``_fail``'s line and exit 2."""
    if as_json and rank == 0:
        reporter("profile links", ("links",), err, as_json=True).error(str(as_flag(e, ID_FLAGS)))
    _fail(e, rank)


def _save_links(new: Cluster, dest: Path, db, tables: bool, quiet: bool) -> dict:
    """Write the calibrated cluster and store its link fit; print the fit's tables (``tables``) and what was written
    (unless ``quiet``); the result event's fields."""
    if tables:
        print_links(new)
    new.save(dest)
    result = {"cluster_file": str(dest), "fingerprint": new.fingerprint(), "store": None,
              "topology_fingerprint": new.topology_fingerprint()}
    if not quiet:
        out.print(f"wrote {dest} (fingerprint {new.fingerprint()})")
    if db is not None:
        try:
            db.save_link_fit(new.topology_fingerprint(), new.calibration.get("links", {}))
            result["store"] = db.shown
            if not quiet:
                out.print(f"stored the link fit in {db.shown} (topology fingerprint {new.topology_fingerprint()})",
                          highlight=False)
        except PlanError as e:
            print_error(str(e))
    return result


def print_links(cluster: Cluster) -> None:
    """The fitted latency and bandwidth per link class and op, what was written back, and any failure."""
    cal = cluster.calibration.get("links", {})
    t = Table(title=f"link fits ({cal.get('backend', '?')} on {cal.get('device', '?')}, {cal.get('world_size', '?')} ranks, "
                    f"{cal.get('nodes', '?')} node(s))")
    for c in ("class", "op", "ranks", "alpha", "bus bandwidth", "peak busbw", "points"):
        t.add_column(c, justify="left" if c in ("class", "op") else "right")
    for cls, c in cal.get("classes", {}).items():
        for op, f in c["ops"].items():
            t.add_row(cls, op, str(f["group_size"]), f"{f['alpha_s'] * 1e6:.1f} us", rate(f["busbw"]), rate(f["peak_busbw"]),
                      str(f["points"]))
    out.print(t)
    for kind, a in cal.get("applied", {}).items():
        out.print(f"calibrated {kind} links: x{a['scale']:.3g} -> {rate(a['bottleneck_capacity'])}, latency "
                  f"{a['latency'] * 1e6:.1f} us (from {a['class']}, ranks {a['pair']})", highlight=False)
    for f in cal.get("failed", []):
        err.print(f"[yellow]failed[/]: {escape(str(f['link_class']))} {f['op']} {f['nbytes']} B: {escape(str(f['error']))}",
                  highlight=False)


def register(app: typer.Typer) -> None:
    """Add `discover` and the `profile` group to the main `sp-plan` app."""
    # adds list/show/export/import/delete to profile_app; cli/profiles imports this module's profile_app (a cycle)
    from sp_plan.cli import profiles  # noqa: F401, PLC0415

    app.command("discover")(discover_cmd)
    app.add_typer(profile_app, name="profile")
