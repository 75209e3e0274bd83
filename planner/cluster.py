"""Cluster: devices, switches and NICs joined by directed links, as a pydantic model and a networkx graph.

A cluster is a list of nodes, each of a *node type* (a template: its devices, switches, NICs and
the links among them, names local to the node), plus a network fabric that every NIC reaches
through the special endpoint ``net``. Nodes of one type are alike, which is what lets the cost
engine price a phase on one node's links instead of routing every flow of the cluster.

Global names: device ``gpu3`` of node 2 is ``n2.gpu3``; the fabric is ``net``. World rank =
node index * devices per node + the device's index in its node type (torchrun's numbering).
"""
from __future__ import annotations

import hashlib
import heapq
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .errors import PlanError, whole_number
from .plausible import MIN_EFFICIENCY, check_finite
from .yamlio import check_schema_version, dump_data, load_yaml_model

if TYPE_CHECKING:
    import networkx as nx

SCHEMA_VERSION = 1
NET = "net"


#: the least a cluster file's figures may claim: a link or NIC slower than 1 kB/s, a device below 1 MFLOP/s or with
#: less than 1 MB of memory is a typo (1e-300 for 1e300, a missing exponent), and a step priced from one overflows
MIN_BYTES_PER_S = 1e3
MIN_FLOPS = 1e6
MIN_MEMORY_BYTES = 1e6
#: the longest a link may take to deliver a message (a second: no link a job spans is slower to answer)
MAX_LATENCY_S = 1.0
#: the longest block (tokens) at which attention may reach half its efficiency
MAX_HALF_BLOCK = float(1 << 24)


class Device(BaseModel):
    """A compute device (GPU, NPU) or a CPU rank slot; peak FLOP/s per dtype and memory in bytes."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    name: str
    kind: Literal["gpu", "npu", "cpu"] = "gpu"
    model: str = ""
    memory_bytes: float = Field(ge=MIN_MEMORY_BYTES)
    peak_flops: dict[str, Annotated[float, Field(ge=MIN_FLOPS)]] = Field(min_length=1, description="dense FLOP/s per dtype, e.g. {bf16: 9.89e14}")
    matmul_efficiency: float = Field(default=0.7, ge=MIN_EFFICIENCY, le=1, description="achieved / peak for large GEMMs")
    attn_efficiency: float = Field(default=0.6, ge=MIN_EFFICIENCY, le=1, description="achieved / peak of attention on large blocks")
    attn_half_block: float = Field(default=256, ge=0, le=MAX_HALF_BLOCK, description="block length (tokens) at which attention runs at half of attn_efficiency")
    nic: str | None = Field(default=None, description="the NIC this device sends through (NCCL's closest NIC)")
    pcie_bus: str = ""
    numa: int | None = None


class Switch(BaseModel):
    """A switch, bridge or NIC inside a node."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    name: str
    kind: Literal["nvswitch", "pcie_switch", "host_bridge", "cpu", "nic", "network_switch"]
    rate: float | None = Field(default=None, ge=MIN_BYTES_PER_S, description="NIC line rate, bytes/s")
    network: Literal["ib", "roce", "ethernet", "shm", None] = None


class Link(BaseModel):
    """A link between two endpoints of a node (or a NIC and ``net``): capacity per direction in bytes/s."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    src: str
    dst: str
    kind: Literal["nvlink", "nvswitch", "pcie", "hccs", "shm", "smp", "ib", "roce", "ethernet"]
    capacity: float = Field(ge=MIN_BYTES_PER_S, description="bytes/s in each direction it carries")
    latency: float = Field(default=2e-6, ge=0, le=MAX_LATENCY_S, description="seconds")
    bidirectional: bool = True


class LinkGraph:
    """A node's directed link graph without a graph library (importing networkx costs a command a quarter of a
    second): endpoints and edges with their attributes, successors in insertion order, as networkx's DiGraph keeps
    them, and its weighted shortest path with the same ties."""

    def __init__(self):
        self.nodes: dict[str, dict] = {}
        self.edges: dict[tuple[str, str], dict] = {}
        self.succ: dict[str, dict[str, dict]] = {}

    def add_node(self, name: str, **attrs) -> None:
        self.nodes.setdefault(name, {}).update(attrs)
        self.succ.setdefault(name, {})

    def add_edge(self, src: str, dst: str, **attrs) -> None:
        """An edge, or new attributes for an existing one (networkx's add_edge)."""
        for n in (src, dst):
            if n not in self.nodes:
                self.add_node(n)
        d = self.edges.get((src, dst))
        if d is None:
            d = self.edges[src, dst] = self.succ[src][dst] = {}
        d.update(attrs)

    def reachable(self, a: str) -> set[str]:
        """Every endpoint a path from ``a`` reaches (``a`` included)."""
        seen, todo = {a}, [a]
        while todo:
            for b in self.succ.get(todo.pop(), ()):
                if b not in seen:
                    seen.add(b)
                    todo.append(b)
        return seen

    def shortest_path(self, a: str, b: str, weight: str = "weight") -> list[str]:
        """The least-weight path from ``a`` to ``b``: Dijkstra as networkx.shortest_path runs it (a heap of (distance,
        push count, endpoint), successors in insertion order, a path replaced only by a strictly shorter one), so
        equal-weight routes tie the same way."""
        dist: dict[str, float] = {}
        seen, paths, fringe, count = {a: 0.0}, {a: [a]}, [(0.0, 0, a)], 1
        while fringe:
            d, _, v = heapq.heappop(fringe)
            if v in dist:
                continue
            dist[v] = d
            if v == b:
                return paths[v]
            for u, e in self.succ.get(v, {}).items():
                du = d + e.get(weight, 1)
                if u not in dist and (u not in seen or du < seen[u]):
                    seen[u], paths[u] = du, paths[v] + [u]
                    heapq.heappush(fringe, (du, count, u))
                    count += 1
        raise PlanError("links", f"no path from {a} to {b} inside the node", f"add the link(s) that connect {a} and {b}")

    def to_networkx(self) -> nx.DiGraph:
        """The same graph as a networkx DiGraph (figures draw it)."""
        import networkx as nx  # noqa: PLC0415

        g = nx.DiGraph()
        for n, attrs in self.nodes.items():
            g.add_node(n, **attrs)
        for (u, v), attrs in self.edges.items():
            g.add_edge(u, v, **attrs)
        return g


#: the message size a route is chosen for: the K/V blocks, all-to-all chunks and gradient buckets sp-plan prices are
#: megabytes to gigabytes, so bandwidth decides the route and latency only parts routes of equal bandwidth
ROUTE_BYTES = 16 * 2**20


def route_weight(link: Link) -> float:
    """A link's routing weight: its seconds per byte for a ROUTE_BYTES message, 1/capacity + latency/ROUTE_BYTES."""
    return 1.0 / link.capacity + link.latency / ROUTE_BYTES


class NodeType(BaseModel):
    """The template of one kind of node: its devices (in rank order), switches and links."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    devices: list[Device]
    switches: list[Switch] = []
    links: list[Link] = []

    @model_validator(mode="after")
    def _check(self):
        names = [d.name for d in self.devices] + [s.name for s in self.switches]
        if not self.devices:
            raise PlanError("node_types.devices", "a node type has no devices", "list at least one device")
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise PlanError("node_types", f"duplicate endpoint names {sorted(dup)}", "give every device and switch a unique name")
        known = set(names) | {NET}
        for i, l in enumerate(self.links):
            for end in (l.src, l.dst):
                if end not in known:
                    raise PlanError(f"links[{i}]", f"endpoint {end!r} is not a device or switch of this node",
                                    f"declare {end!r} under devices or switches, or fix the link")
        self._check_nics()
        g, devs = self.link_graph(), [d.name for d in self.devices]
        for a in devs:
            reach = g.reachable(a)
            for b in devs:
                if b not in reach:
                    raise PlanError("links", f"no path from {a} to {b} inside the node (missing link)",
                                    f"add the link(s) that connect {a} and {b}")
        return self

    def _check_nics(self) -> None:
        """Every device's ``nic`` is a NIC of this node linked to the fabric: the engine routes its inter-node
        traffic from there."""
        nics = sorted(s.name for s in self.switches if s.kind == "nic" and any({l.src, l.dst} == {s.name, NET}
                                                                                for l in self.links))
        for i, d in enumerate(self.devices):
            if d.nic is not None and d.nic not in nics:
                raise PlanError(f"devices[{i}].nic", f"{d.nic!r} is not a NIC of this node linked to {NET!r}",
                                f"use one of {nics}" if nics else f"declare a switch of kind nic linked to {NET!r}")

    def link_graph(self) -> LinkGraph:
        """The node's own directed graph, with ``net`` standing for the fabric: what the engine routes on."""
        g = LinkGraph()
        for d in self.devices:
            g.add_node(d.name, role="device", kind=d.kind)
        for s in self.switches:
            g.add_node(s.name, role="switch", kind=s.kind)
        for l in self.links:
            attrs = dict(kind=l.kind, capacity=l.capacity, latency=l.latency, weight=route_weight(l))
            g.add_edge(l.src, l.dst, **attrs)
            if l.bidirectional:
                g.add_edge(l.dst, l.src, **attrs)
        return g

    def local_graph(self) -> nx.DiGraph:
        """``link_graph`` as a networkx DiGraph (the same nodes, edges and attributes, in the same order)."""
        return self.link_graph().to_networkx()

    @property
    def has_network(self) -> bool:
        return any(NET in (l.src, l.dst) for l in self.links)


def preset_name(node: str, nodes: int) -> str:
    """A preset cluster's name: its node type's, with ``xN`` for N > 1 nodes (``dgx-h100x2``)."""
    return node + (f"x{nodes}" if nodes > 1 else "")


def preset_nodes(name: str) -> tuple[str, int]:
    """(node type, nodes) of a preset cluster's name (``preset_name`` read back); a name without ``xN``: one node."""
    m = re.fullmatch(r"(.+)x(\d+)", name)
    return (m.group(1), int(m.group(2))) if m else (name, 1)


class Cluster(BaseModel):
    """A whole cluster: nodes (each of a node type) on one network fabric."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    schema_version: int = SCHEMA_VERSION
    name: str = "cluster"
    node_types: dict[str, NodeType]
    nodes: list[str] = Field(description="the node type of each node, in node-rank order")
    network: Literal["ib", "roce", "ethernet", "none"] = "none"
    source: str = ""
    warnings: list[str] = []
    calibration: dict = Field(default_factory=dict, description="fitted parameters from `sp-plan profile`")
    fingerprint_memory: dict[str, Annotated[float, Field(gt=0)]] = Field(
        default_factory=dict, description="node type -> the device memory its fingerprints are computed with, where "
        "it differs from the devices' (a preset's decimal datasheet figure, which its plans and profiles are keyed by)")

    @model_validator(mode="before")
    @classmethod
    def _version(cls, data):
        check_schema_version(data, SCHEMA_VERSION, "cluster")
        return data

    def _memory_of(self, node_type: str, device: Device) -> float:
        """The memory a device's fingerprints are computed with (``fingerprint_memory``, else its own)."""
        return self.fingerprint_memory.get(node_type, device.memory_bytes)

    @model_validator(mode="after")
    def _check(self):
        check_finite(self.calibration, "cluster.calibration")
        if not self.nodes:
            raise PlanError("cluster.nodes", "the cluster has zero nodes",
                            "list the node type of each node under nodes: (a preset takes --nodes N >= 1)")
        for i, t in enumerate(self.nodes):
            if t not in self.node_types:
                raise PlanError(f"nodes[{i}]", f"unknown node type {t!r}", f"use one of {sorted(self.node_types)}")
        for t in self.fingerprint_memory:
            if t not in self.node_types:
                raise PlanError(f"fingerprint_memory.{t}", f"unknown node type {t!r}",
                                f"key it by one of {sorted(self.node_types)}, or drop it")
        if len(self.nodes) > 1:
            for t in set(self.nodes):
                if not self.node_types[t].has_network:
                    raise PlanError(f"node_types.{t}.links", "a multi-node cluster but this node type has no link to 'net'",
                                    "add a NIC with a link to 'net'")
        return self

    # ---- sizes
    @property
    def num_nodes(self) -> int:
        """How many nodes the cluster has."""
        return len(self.nodes)

    def node_type(self, node: int = 0) -> NodeType:
        """The node type of node ``node`` (0 to ``num_nodes`` - 1)."""
        return self.node_types[self.nodes[self._index("node", node, len(self.nodes))]]

    def _index(self, field: str, i, n: int) -> int:
        """``i`` where it is 0 to ``n`` - 1 (a negative index would count from the end: another device)."""
        if type(i) is int and 0 <= i < n:  # the planner's own calls, on every candidate: no checks beyond this
            return i
        return whole_number(field, i, 0, f"use a {field} below {n:,} (this cluster's {field}s are 0 to {n - 1:,})",
                            high=n - 1)

    @property
    def devices_per_node(self) -> int:
        """Devices (ranks) of the first node."""
        return len(self.node_type(0).devices)

    @property
    def world_size(self) -> int:
        """Devices (ranks) of the whole cluster."""
        return sum(len(self.node_types[t].devices) for t in self.nodes)

    @property
    def homogeneous(self) -> bool:
        """Whether every node is of one node type."""
        return len(set(self.nodes)) == 1

    def device(self, rank: int) -> Device:
        """The device that world rank ``rank`` runs on."""
        rank = self._index("rank", rank, self.world_size)
        for t in self.nodes:
            devs = self.node_types[t].devices
            if rank < len(devs):
                return devs[rank]
            rank -= len(devs)
        raise PlanError("rank", "outside the cluster", "use a rank below the world size")

    def node_of(self, rank: int) -> int:
        """The node index that world rank ``rank`` runs on."""
        rank = self._index("rank", rank, self.world_size)
        if self.homogeneous:
            return rank // self.devices_per_node
        for i, t in enumerate(self.nodes):
            n = len(self.node_types[t].devices)
            if rank < n:
                return i
            rank -= n
        raise PlanError("rank", "outside the cluster", "use a rank below the world size")

    # ---- identity
    def fingerprint(self) -> str:
        """Stable hash of the topology (node types, node list, network); names and notes excluded."""
        data = self.model_dump(include={"node_types", "nodes", "network"})
        for t, mem in self.fingerprint_memory.items():
            for d in data["node_types"].get(t, {}).get("devices", []):
                d["memory_bytes"] = mem
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def topology_fingerprint(self) -> str:
        """Stable hash of what a profile is keyed by: device kinds, models and counts, the link graph (ends and
        kinds), NIC rates and the network; not link capacities or latencies, which `profile links` calibrates."""
        types = {}
        for name, nt in self.node_types.items():
            types[name] = {"devices": [[d.kind, d.model, self._memory_of(name, d)] for d in nt.devices],
                           "switches": [[s.name, s.kind, s.rate, s.network] for s in nt.switches],
                           "links": sorted([l.src, l.dst, l.kind, l.bidirectional] for l in nt.links)}
        text = json.dumps({"types": types, "nodes": self.nodes, "network": self.network}, sort_keys=True,
                          separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    # ---- graph
    def graph(self) -> nx.DiGraph:
        """The whole cluster as a networkx DiGraph (every node expanded; ``net`` is the fabric)."""
        import networkx as nx  # noqa: PLC0415

        g = nx.DiGraph()
        if self.num_nodes > 1:
            g.add_node(NET, role="switch", kind="network_switch")
        for k, t in enumerate(self.nodes):
            local = self.node_types[t].local_graph()
            name = lambda x: x if x == NET else f"n{k}.{x}"  # noqa: E731
            for x, attrs in local.nodes(data=True):
                if x != NET:
                    g.add_node(name(x), node=k, **attrs)
            for a, b, attrs in local.edges(data=True):
                if self.num_nodes == 1 and NET in (a, b):
                    continue
                g.add_edge(name(a), name(b), **attrs)
        return g

    # ---- io
    def save(self, path: str | Path) -> None:
        """Write the cluster as a YAML (or, for a .json path, JSON) file that ``load`` and ``--cluster`` read."""
        dump_data(self.model_dump(mode="json", exclude=None if self.fingerprint_memory else {"fingerprint_memory"}),
                  path)

    @classmethod
    def load(cls, path: str | Path) -> "Cluster":
        """The cluster in a YAML or JSON cluster file."""
        return load_yaml_model(cls, path, "cluster")
