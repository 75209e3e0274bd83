"""HostReports of all nodes -> Cluster: PCIe tree, NVLink/NVSwitch, NICs and the network they imply.

Conventions follow ``profiles.build_node_type``: devices ``gpu<i>`` (``cpu<i>`` for CPU rank slots) in
local-rank order, sockets ``cpu<j>`` (host bridges), PCIe switches ``pcie<k>``, multi-switch trees
``pcie_root<m>``, ``nvswitch``, NICs ``nic<k>`` with a link to ``net``; CPU-only hosts are rank slots on
a shared-memory ``host``.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

from sp_plan.planner.cluster import MIN_BYTES_PER_S, MIN_MEMORY_BYTES, NET, Cluster, Device, Link, NodeType, Switch
from sp_plan.planner.errors import PlanError
from .checks import RATE_PEER_FRACTION, gbit
from .report import HostReport, NicInfo
from .specs import gpu_spec, peak_flops
from .topo import LEVEL_RANK, LEVELS

SMP_CAPACITY = 40e9  # bytes/s per direction between sockets (UPI / Infinity Fabric), until profiled
PCIE_LATENCY, NVLINK_LATENCY, SMP_LATENCY = 3e-6, 2e-6, 3e-6
NET_LATENCY = {"ib": 5e-6, "roce": 5e-6, "ethernet": 20e-6}
NET_ORDER = ("ethernet", "roce", "ib")  # slowest first
PLACEHOLDER_RATE = 1.25e9  # 10 GbE, for a NIC whose rate nobody reports
CPU_SLOT = dict(model="cpu-rank", kind="cpu", peak_flops={"bf16": 5.0e10, "fp16": 5.0e10, "fp32": 5.0e10, "fp64": 2.5e10},
                matmul_efficiency=0.8, attn_efficiency=0.5, attn_half_block=64)  # as profiles/clusters/cpu-local
SHM_CAPACITY, SHM_LATENCY = 5e9, 20e-6
_VIRTUAL_SKIP = re.compile(r"^(docker|br-|virbr|veth|cni|flannel|cali|tun|tap|ifb|vxlan|kube|lxc|dummy)")


@dataclass
class NodeBuild:
    """One node's type under construction, and what it tells the user."""

    node_type: NodeType
    network: str | None
    nic_names: dict[str, str] = field(default_factory=dict)  # nic<k> -> real name
    warnings: list[str] = field(default_factory=list)


# ---- NICs
def choose_nics(host: HostReport, warns: list[str]) -> list[NicInfo]:
    """The NICs a node's ranks talk through: the socket interface if pinned (but on GPUs with RDMA ports up, NCCL's
    data goes over those whatever NCCL_SOCKET_IFNAME pins its bootstrap to, unless NCCL_IB_DISABLE), else the fastest
    fabric's ports."""
    up = [n for n in host.nics if n.up]
    rdma = [n for n in up if n.kind in ("ib", "roce") and n.physical]
    if host.socket_ifname and rdma and host.gpus and not host.rdma_disabled:
        warns.append(f"socket interface {host.socket_ifname!r} carries NCCL's bootstrap only: its data goes over the "
                     f"RDMA ports, which are kept (with NCCL_IB_DISABLE=1 the pinned one would be)")
    elif host.socket_ifname:
        hit = [n for n in up if host.socket_ifname in (n.netdev, n.name)]
        if hit:
            return hit[:1]
        warns.append(f"socket interface {host.socket_ifname!r} not found among this host's NICs")
    for kind in ("ib", "roce", "ethernet"):
        ports = [n for n in up if n.kind == kind and n.physical]
        if ports:
            top = max(n.rate for n in ports)
            keep = [n for n in ports if kind != "ethernet" or n.rate >= RATE_PEER_FRACTION * top]
            for n in ports:
                if n not in keep:
                    warns.append(f"NIC {n.name} ({gbit(n.rate)}) left out: far slower than {gbit(top)} (management port?)")
            return keep
    unknown = [n for n in host.nics if n.kind == "unknown"]
    if unknown:
        warns.append(f"NIC(s) {[n.name for n in unknown]} seen only by nvidia-smi topo -m: assumed InfiniBand")
        return unknown
    virtual = [n for n in up if not n.physical and not _VIRTUAL_SKIP.match(n.name)]
    if virtual:
        n = virtual[0]
        warns.append(f"no physical NIC visible (container?); using virtual interface {n.name}, rate unknown")
        return [n]
    warns.append("no NIC found; a placeholder Ethernet NIC stands in until `sp-plan profile links` measures the network")
    return [NicInfo(name="nic", kind="ethernet", physical=False)]


def _nic_kind(n: NicInfo) -> str:
    return "ib" if n.kind == "unknown" else n.kind


def _nic_rate(n: NicInfo, warns: list[str]) -> float:
    if n.rate >= MIN_BYTES_PER_S and n.physical:  # a rate below any NIC's is a misreading: unknown
        return n.rate
    warns.append(f"rate of NIC {n.name} unknown; placeholder {gbit(PLACEHOLDER_RATE)} until `sp-plan profile links`")
    return PLACEHOLDER_RATE


# ---- PCIe tree
def _closure(host: HostReport, labels: list[str]) -> dict[tuple[str, str], int]:
    """Pairwise PCIe level ranks, gaps filled by the ultrametric rule d(a,b) <= max(d(a,c), d(c,b)) where that
    bound says something: a bound of SYS holds for any pair, so such a gap stays open for the NUMA ids to decide (a
    DGX-1's NVLink cells are gaps, and SYS fills put each GPU on a socket of its own)."""
    inf, sys_rank = len(LEVELS) + 1, LEVEL_RANK["SYS"]
    d = {(a, b): (0 if a == b else LEVEL_RANK.get(host.level(a, b) or "", inf)) for a in labels for b in labels}
    for c in labels:
        for a in labels:
            dac = d[(a, c)]
            if dac >= sys_rank:
                continue
            for b in labels:
                m = max(dac, d[(c, b)])
                if m < d[(a, b)] and m < sys_rank:
                    d[(a, b)] = m
    return d


def _components(items: list[str], near) -> list[list[str]]:
    comps: list[list[str]] = []
    for x in items:
        hit = [c for c in comps if any(near(x, y) for y in c)]
        merged = [x] + [y for c in hit for y in c]
        comps = [c for c in comps if c not in hit] + [sorted(merged, key=items.index)]
    return sorted(comps, key=lambda c: items.index(c[0]))


def _pcie_tree(labels: list[str], dist, numa: dict[str, int | None], cap: dict[str, float]):
    """Switches and links of a PCIe tree over ``labels``; returns (switches, links, parent of each label)."""
    node_rank, pxb, pix = LEVEL_RANK["NODE"], LEVEL_RANK["PXB"], LEVEL_RANK["PIX"]

    def level(a: str, b: str) -> int:
        v = dist[(a, b)]
        if v <= len(LEVELS) - 1:
            return v
        na, nb = numa.get(a), numa.get(b)
        if na is not None and nb is not None:
            return node_rank if na == nb else LEVEL_RANK["SYS"]
        return LEVEL_RANK["PHB"]

    switches: list[Switch] = []
    links: list[Link] = []
    parent: dict[str, str] = {}

    def switch(name: str, up: str, below: list[str]) -> str:
        """A PCIe switch over ``below``, linked to ``up`` at the fastest of them; its name."""
        switches.append(Switch(name=name, kind="pcie_switch"))
        links.append(Link(src=name, dst=up, kind="pcie", capacity=max(cap[x] for x in below), latency=PCIE_LATENCY))
        return name

    sockets = _components(labels, lambda a, b: level(a, b) <= node_rank)
    roots, leaves = itertools.count(), itertools.count()
    for j, sock in enumerate(sockets):
        cpu = f"cpu{j}"
        switches.append(Switch(name=cpu, kind="host_bridge"))
        for tree in _components(sock, lambda a, b: level(a, b) <= pxb):
            groups = _components(tree, lambda a, b: level(a, b) <= pix)
            up = switch(f"pcie_root{next(roots)}", cpu, tree) if len(groups) > 1 else cpu
            for grp in groups:
                home = switch(f"pcie{next(leaves)}", up, grp) if len(grp) > 1 else up
                parent.update(dict.fromkeys(grp, home))
    for a in range(len(sockets)):
        for b in range(a + 1, len(sockets)):
            links.append(Link(src=f"cpu{a}", dst=f"cpu{b}", kind="smp", capacity=SMP_CAPACITY, latency=SMP_LATENCY))
    return switches, links, parent


# ---- node types
def _assign(gpu_labels: list[str], nics: list[NicInfo], dist) -> dict[str, NicInfo]:
    """Each GPU's NIC: the nearest on PCIe; ties go to the least used (rail-style, as NCCL spreads them)."""
    use = {n.name: 0 for n in nics}
    out = {}
    for g in gpu_labels:
        best = min(nics, key=lambda n: (dist[(g, n.name)], use[n.name], nics.index(n)))
        use[best.name] += 1
        out[g] = best
    return out


def gpu_node(host: HostReport, gpu_ids: list[int], multi_node: bool) -> NodeBuild:
    """A GPU node: devices in rank order, NVLink/NVSwitch, PCIe tree, NICs nearest each GPU."""
    warns: list[str] = []
    gpus = {g.index: g for g in host.gpus}
    missing = [i for i in gpu_ids if i not in gpus]
    if missing:
        raise PlanError("gpus", f"{host.hostname}: ranks use GPU(s) {missing} that discovery did not find",
                        "check CUDA_VISIBLE_DEVICES and that every rank sees its GPU")
    glabels = [f"GPU{i}" for i in gpu_ids]
    chosen = choose_nics(host, warns)
    every = list(dict.fromkeys([f"GPU{g.index}" for g in host.gpus] + [n.name for n in host.nics] + [n.name for n in chosen]))
    dist = _closure(host, every)
    nic_of = _assign(glabels, chosen, dist)
    nics = [n for n in chosen if any(v is n for v in nic_of.values())]
    unused = [n.name for n in chosen if n not in nics]
    if unused:
        warns.append(f"NIC(s) {unused} are nearest to none of the ranks' GPUs: left out (storage or unused rail?)")
    nlabels = [n.name for n in nics]
    name = {f"GPU{i}": f"gpu{p}" for p, i in enumerate(gpu_ids)}
    name.update({n.name: f"nic{k}" for k, n in enumerate(nics)})
    read = lambda c: c if c >= MIN_BYTES_PER_S else 0.0  # noqa: E731 - below any link's: a misreading, unknown
    default_cap = max((read(gpus[i].pcie_capacity) for i in gpu_ids), default=32e9) or 32e9
    cap = {f"GPU{i}": read(gpus[i].pcie_capacity) or default_cap for i in gpu_ids}
    cap.update({n.name: read(n.pcie_capacity) or default_cap for n in nics})
    numa = {f"GPU{i}": gpus[i].numa for i in gpu_ids}
    numa.update({n.name: n.numa for n in nics})
    located = [x for x in glabels + nlabels
               if x in glabels or any(host.level(x, y) for y in every) or numa.get(x) is not None]
    switches, links, parent = _pcie_tree(located, dist, numa, cap)
    links = [Link(src=name[x], dst=p, kind="pcie", capacity=cap[x], latency=PCIE_LATENCY)
             for x, p in parent.items()] + links
    for x in glabels + nlabels:
        if x not in parent:  # no PCIe facts at all (a virtual NIC): on the first socket
            links.append(Link(src=name[x], dst="cpu0", kind="pcie", capacity=cap[x], latency=PCIE_LATENCY))
    _nvlinks(gpus, gpu_ids, name, switches, links)
    devices = _gpu_devices(gpus, gpu_ids, name, nic_of, warns)
    _nic_switches(nics, name, switches, links, warns)
    nt = NodeType(devices=devices, switches=switches, links=links)
    return NodeBuild(nt, _nic_kind(nics[0]), {name[n.name]: n.name for n in nics}, warns)


def _nvlinks(gpus: dict, gpu_ids: list[int], name: dict[str, str], switches: list, links: list) -> None:
    """The node's NVSwitch and its links, and the direct NVLinks between GPUs (added to ``switches``, ``links``)."""
    if any(gpus[i].nvswitch_links for i in gpu_ids):
        switches.append(Switch(name="nvswitch", kind="nvswitch"))
        for i in gpu_ids:
            g = gpus[i]
            if g.nvswitch_links:
                links.append(Link(src=name[f"GPU{i}"], dst="nvswitch", kind="nvswitch",
                                  capacity=g.nvswitch_links * g.link_speed, latency=NVLINK_LATENCY))
    for a_pos, a in enumerate(gpu_ids):
        for b in gpu_ids[a_pos + 1:]:
            n_ab = gpus[a].nvlinks.get(b, 0)
            if n_ab:
                speed = min(gpus[a].link_speed, gpus[b].link_speed or gpus[a].link_speed)
                links.append(Link(src=name[f"GPU{a}"], dst=name[f"GPU{b}"], kind="nvlink", capacity=n_ab * speed,
                                  latency=NVLINK_LATENCY))


def _gpu_devices(gpus: dict, gpu_ids: list[int], name: dict[str, str], nic_of: dict, warns: list[str]) -> list[Device]:
    """The ranks' GPUs as devices, with a warning for a model not in the table or an unknown memory size."""
    devices, unknown, nomem = [], [], []
    for i in gpu_ids:
        g = gpus[i]
        spec = gpu_spec(g.name)
        if spec is None and g.name:
            unknown.append(f"GPU{i}")
        known = g.memory_bytes >= MIN_MEMORY_BYTES  # less than any device has is a misreading: unknown
        if not known:
            nomem.append(f"GPU{i}")
        devices.append(Device(name=name[f"GPU{i}"], kind="gpu", model=g.model or "unknown-gpu",
                              memory_bytes=g.memory_bytes if known else 16e9, peak_flops=peak_flops(spec),
                              nic=name[nic_of[f"GPU{i}"].name], pcie_bus=g.pci_bus, numa=g.numa))
    if unknown:
        names = sorted({gpus[int(x[3:])].name for x in unknown})
        warns.append(f"{_span(unknown)}: model {names} not in sp-plan's table; placeholder peak FLOP/s")
    if nomem:
        warns.append(f"{_span(nomem)}: memory unknown; 16 GB assumed")
    return devices


def _nic_switches(nics: list[NicInfo], name: dict[str, str], switches: list, links: list, warns: list[str]) -> None:
    """Each NIC as a switch with its link to the network (a placeholder rate where none is known)."""
    unrated = []
    for n in nics:
        kind = _nic_kind(n)
        rated = n.rate >= MIN_BYTES_PER_S and n.physical
        rate = n.rate if rated else PLACEHOLDER_RATE
        if not rated:
            unrated.append(n.name)
        switches.append(Switch(name=name[n.name], kind="nic", rate=rate, network=kind))
        links.append(Link(src=name[n.name], dst=NET, kind=kind, capacity=rate, latency=NET_LATENCY[kind]))
    if unrated:
        warns.append(f"rate of NIC(s) {unrated} unknown; placeholder {gbit(PLACEHOLDER_RATE)} until `sp-plan profile links`")


def _span(labels: list[str]) -> str:
    """``GPU0-GPU7`` for a run, else a comma list."""
    idx = [int(x[3:]) for x in labels]
    if len(idx) > 2 and idx == list(range(idx[0], idx[0] + len(idx))):
        return f"GPU{idx[0]}-GPU{idx[-1]}"
    return ", ".join(labels)


def cpu_node(host: HostReport, slots: int) -> NodeBuild:
    """A CPU-only node: ``slots`` rank slots over shared memory, NICs on the host."""
    warns: list[str] = []
    nics = choose_nics(host, warns)
    mem = host.cpu.memory_bytes / max(1, slots)
    if not mem >= MIN_MEMORY_BYTES:
        raise PlanError("memory", f"the host reports {host.cpu.memory_bytes:g} bytes of memory for {slots} rank slot(s)",
                        "check /proc/meminfo and the cgroup's memory limit, or write the cluster file by hand")
    devices = [Device(name=f"cpu{i}", memory_bytes=mem, nic="nic0", **CPU_SLOT) for i in range(slots)]
    switches = [Switch(name="host", kind="cpu")]
    links = [Link(src=d.name, dst="host", kind="shm", capacity=SHM_CAPACITY, latency=SHM_LATENCY) for d in devices]
    for k, n in enumerate(nics):
        kind = _nic_kind(n)
        rate = _nic_rate(n, warns)
        switches.append(Switch(name=f"nic{k}", kind="nic", rate=rate, network=kind))
        links.append(Link(src=f"nic{k}", dst="host", kind="shm", capacity=rate * 4, latency=SHM_LATENCY / 5))
        links.append(Link(src=f"nic{k}", dst=NET, kind=kind, capacity=rate, latency=NET_LATENCY[kind]))
    warns.append("CPU rank slots: peak FLOP/s and shared-memory bandwidth are placeholders until `sp-plan tune` measures them")
    return NodeBuild(NodeType(devices=devices, switches=switches, links=links), _nic_kind(nics[0]),
                     {f"nic{k}": n.name for k, n in enumerate(nics)}, warns)


def node_build(host: HostReport, multi_node: bool) -> NodeBuild:
    """The node type of one host: its ranks' GPUs, or CPU slots (one per rank; per core when run alone)."""
    ranks = sorted(host.ranks, key=lambda r: r.local_rank)
    if ranks:
        ids = [r.gpu for r in ranks]
        if all(i is not None for i in ids):
            if len(set(ids)) < len(ids):
                raise PlanError("gpus", f"{host.hostname}: several ranks drive one GPU ({ids})",
                                "run one rank per GPU (torchrun --nproc-per-node = GPUs per node)")
            return gpu_node(host, ids, multi_node)
        return cpu_node(host, len(ranks))
    if host.gpus:
        return gpu_node(host, [g.index for g in host.gpus], multi_node)
    return cpu_node(host, host.cpu.cores)


def _type_name(nt: NodeType) -> str:
    d = nt.devices[0]
    base = re.sub(r"[^a-z0-9]+", "-", (d.model or d.kind).lower()).strip("-")
    return f"{base}-x{len(nt.devices)}"


def nic_names(host: HostReport, multi: bool = False) -> dict[str, str]:
    """The cluster's NICs of ``host`` by their real names (``nic<k>`` -> ``mlx5_0``); ``multi``: a node of several."""
    return node_build(host, multi).nic_names


def build_cluster(hosts: list[HostReport], name: str | None = None) -> Cluster:
    """The Cluster of these hosts (one per node, in node-rank order), with every warning kept."""
    if not hosts:
        raise PlanError("hosts", "no host reports to build a cluster from", "run discovery on at least one host")
    hosts = sorted(hosts, key=lambda h: (h.node_rank, h.hostname))
    multi = len(hosts) > 1
    warnings: list[str] = []
    types: dict[str, NodeType] = {}
    nodes: list[str] = []
    nets: list[str] = []
    nic_names: dict[str, str] = {}
    for k, h in enumerate(hosts):
        tag = f"node {k} ({h.hostname})"
        warnings += [f"{tag}: {w}" for w in h.warnings]
        b = node_build(h, multi)
        warnings += [f"{tag}: {w}" for w in b.warnings]
        if not nic_names:
            nic_names = b.nic_names
        nets.append(b.network or "ethernet")
        tname = next((t for t, nt in types.items() if nt == b.node_type), None)
        if tname is None:
            tname = _type_name(b.node_type)
            while tname in types:
                tname += "-b"
            types[tname] = b.node_type
        nodes.append(tname)
    warnings += _cluster_checks(hosts, types, nodes, nets)
    network = min(nets, key=NET_ORDER.index) if multi else "none"
    hostnames = ", ".join(dict.fromkeys(h.hostname for h in hosts))
    nicmap = ", ".join(f"{k}={v}" for k, v in nic_names.items())
    first = types[nodes[0]].devices[0]
    return Cluster(name=name or (f"discovered-{len(hosts)}x{nodes[0]}" if multi else f"discovered-{_slug(hosts[0].hostname)}"),
                   node_types=types, nodes=nodes, network=network,
                   source=f"sp-plan discover on {hostnames}: {first.model} x{len(types[nodes[0]].devices)} per node; "
                          f"NICs of node 0: {nicmap}",
                   warnings=list(dict.fromkeys(warnings)))


def _slug(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-") or "host"


def _cluster_checks(hosts: list[HostReport], types: dict[str, NodeType], nodes: list[str], nets: list[str]) -> list[str]:
    """Contradictions between nodes: different node types, networks, NIC rates, rank order."""
    out = []
    if len(set(nodes)) > 1:
        out.append(f"nodes differ ({sorted(set(nodes))}); the cost engine prices every node like node 0")
    if len(set(nets)) > 1:
        out.append(f"nodes are on different networks ({nets}); the cluster uses the slowest, {min(nets, key=NET_ORDER.index)}")
    rates = [sum(s.rate or 0 for s in types[t].switches if s.kind == "nic") for t in nodes]
    top = max(rates, default=0)
    for k, r in enumerate(rates):
        if 0 < r < top:
            out.append(f"node {k} ({hosts[k].hostname}) has {gbit(r)} of NIC bandwidth, below its peers ({gbit(top)})")
    offset = 0
    for k, h in enumerate(hosts):
        for r in h.ranks:
            if r.rank != offset + r.local_rank:
                out.append(f"rank {r.rank} on node {k} is not node-major (expected {offset + r.local_rank}); "
                           "plans number ranks node by node")
                break
        offset += len(types[nodes[k]].devices)
    return out
