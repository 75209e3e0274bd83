"""The link-load engine: the cost of a communication phase from flows routed on the cluster graph.

Design rule (design.md): a phase costs, per step, its most loaded directed link (bytes over
capacity) plus the path latency. Every group of the phase's dimension runs at once, so the flows
of all concurrent groups load the links together.

Cost by symmetry: nodes of a cluster are alike, so only flows that start or end on node 0 are
routed, and only node 0's links (and its NICs' links to the fabric, which is taken to be
non-blocking) are loaded. The result depends on the pattern and the *shape* of the groups (their
size and rank strides, the world size), never on a candidate, and is cached by that shape. A
phase's time is linear in its bytes, so the cache holds seconds per byte and latency per step.

Collectives across nodes run as NCCL runs them: NCCL orders a collective's ring by the topology, not
by rank (node after node), and runs one ring per channel, its channels crossing the node boundary
through different NICs (each GPU's nearest one; on a rail-optimized fabric GPU i's is NIC i), so a
node's inter-node share of an all-gather is spread over all the NICs its members have (NCCL's
ring graph search, src/graph/search.cc; "Doubling all2all performance with NCCL 2.12", PXN). A
point-to-point flow (a ring attention round) leaves through its own GPU's NIC.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

from .cluster import NET, Cluster
from .errors import PlanError


@dataclass(frozen=True)
class GroupShape:
    """The groups of one (possibly merged) mesh dimension: (size, stride) per part, and the world size."""

    parts: tuple[tuple[int, int], ...]
    world: int

    @property
    def size(self) -> int:
        n = 1
        for s, _ in self.parts:
            n *= s
        return n

    def offset(self, idx: int) -> int:
        """Rank offset of the member with group index ``idx`` from its base (``offsets[idx]``)."""
        off = 0
        for size, stride in self.parts:
            idx, c = divmod(idx, size)
            off += c * stride
        return off

    @cached_property
    def offsets(self) -> tuple[int, ...]:
        """Rank offsets of a group's members from its base, the first part fastest."""
        offs = [0]
        for size, stride in self.parts:
            offs = [o + i * stride for i in range(size) for o in offs]
        return tuple(offs)

    def locate(self, rank: int) -> tuple[int, int]:
        """(base rank, index in its group) of ``rank``: members are base + offsets[i]."""
        base, idx, mult = rank, 0, 1
        for size, stride in self.parts:
            c = (rank // stride) % size
            base -= c * stride
            idx += c * mult
            mult *= size
        return base, idx

    def group_of(self, rank: int) -> tuple[int, ...]:
        """Members (in group order) of the group containing ``rank``."""
        base = rank
        for size, stride in self.parts:
            base -= ((rank // stride) % size) * stride
        return tuple(base + o for o in self.offsets)


@dataclass(frozen=True)
class StepCost:
    """Cost of one step of a pattern: seconds per byte of the phase's per-rank volume, latency, steps."""

    steps: int
    sec_per_byte: float  # for the whole phase volume per rank, per step, at its most loaded link
    latency: float  # per step
    bottleneck: str  # the most loaded link, for explanations
    link_class: str = "intra"  # "inter" when the most loaded link touches the network fabric, "host" when it is
    # the CPU's (LinkEngine.via_host); params.LINK_CLASSES

    def time(self, nbytes: float, fit=None) -> float:
        """Seconds for ``nbytes`` per rank; with a CommFit (params.CommFit): bandwidth over its efficiency,
        plus its alpha per step (steps x (bytes x s/B / efficiency + latency + alpha))."""
        if not self.steps:
            return 0.0
        if fit is None:
            return self.steps * (nbytes * self.sec_per_byte + self.latency)
        return self.steps * (nbytes * self.sec_per_byte / fit.efficiency + self.latency + fit.alpha_s)


#: ring collectives: n-1 (or 2(n-1)) steps of 1/n of the volume around a ring of the group
COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")


def pattern_steps(pattern: str, n: int) -> int:
    """Sequential steps of a pattern on a group of n.

    Ring all-gather / reduce-scatter: n-1 steps of 1/n to the next rank; all-reduce: 2(n-1) such steps
    (nccl-tests' bus-bandwidth model); all-to-all: 1/n to every other rank at once; shift: the whole
    volume to the next rank; shift_back: to the previous; shift_bi: the whole volume each way."""
    if n <= 1:
        return 0
    if pattern == "all_gather" or pattern == "reduce_scatter":
        return n - 1
    return 2 * (n - 1) if pattern == "all_reduce" else 1


def flows_touching(pattern: str, n: int, idx: list[int]) -> list[tuple[int, int, float]]:
    """The flows (src index, dst index, fraction of the per-rank volume) of one step of ``pattern`` (see
    ``pattern_steps``) that start or end at a group index in ``idx`` (the indices of the group's members on
    node 0). An all-to-all's flows to or from the members off node 0 share one node-0 route per local member
    (``LinkEngine.route``), so they come as one flow of their summed fraction."""
    mine = set(idx)
    if pattern == "all_to_all":
        out = [(i, j, 1.0 / n) for i in idx for j in idx if j != i]
        far = next((j for j in range(n) if j not in mine), None)  # off node 0: every such flow takes one route
        if far is not None:
            rest = (n - len(mine)) / n
            out += [(i, far, rest) for i in idx] + [(far, i, rest) for i in idx]
        return out
    frac = 1.0 if pattern.startswith("shift") else 1.0 / n
    pairs = set()
    if pattern in ("shift", "shift_bi", "all_gather", "reduce_scatter", "all_reduce"):
        pairs |= {(i, (i + 1) % n) for i in idx} | {((i - 1) % n, i) for i in idx}
    if pattern in ("shift_back", "shift_bi"):
        pairs |= {(i, (i - 1) % n) for i in idx} | {((i + 1) % n, i) for i in idx}
    return [(i, j, frac) for i, j in sorted(pairs) if i != j]


def check_alike_sizes(cluster: Cluster) -> None:
    """Nodes of one device count: the engine prices every node like node 0 and finds a rank's node by division, so
    nodes of other sizes would put ranks on devices that do not exist."""
    sizes = {t: len(cluster.node_types[t].devices) for t in dict.fromkeys(cluster.nodes)}
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{t}: {n}" for t, n in sizes.items())
        raise PlanError("cluster.nodes", f"the nodes hold different numbers of devices ({listed}); the cost engine "
                        "prices every node like node 0", "plan the nodes of one size together (a cluster file of those "
                        "nodes)")


class LinkEngine:
    """Prices communication phases on one cluster; one instance per cluster, cached by group shape."""

    def __init__(self, cluster: Cluster):
        check_alike_sizes(cluster)
        self.cluster = cluster
        self.gpn = cluster.devices_per_node
        node = cluster.node_type(0)
        self.local = node.link_graph()  # routing needs no networkx (cluster.LinkGraph)
        self.names = [d.name for d in node.devices]
        self.nics = {d.name: d.nic for d in node.devices}
        self.multi_node = cluster.num_nodes > 1
        self._route = lru_cache(maxsize=None)(self._route_uncached)
        self._cost = lru_cache(maxsize=None)(self._cost_uncached)
        self.evaluations = 0  # patterns x group shapes routed (each once: the cache above)
        self._by_shape: dict = {}  # (pattern, shape before canonical) -> StepCost
        self._floors: dict = {}  # (pattern, group size, world, spread) -> pattern_floor

    # ---- routing (node-0 part of a path)
    def _path(self, a: str, b: str) -> list[str]:
        return self.local.shortest_path(a, b, weight="weight")

    def _route_uncached(self, a: int, b: int, remote: int) -> tuple[tuple[tuple[str, str], ...], float]:
        """Node-0 edges and latency of a flow from local device a to local device b.

        remote = 0: both on node 0; 1: a on node 0, b elsewhere (a -> its NIC -> net);
        2: a elsewhere, b on node 0 (net -> b's NIC -> b).
        """
        da, db = self.names[a], self.names[b]
        if remote == 0:
            p = self._path(da, db)
        elif remote == 1:
            nic = self.nics.get(da)
            p = (self._path(da, nic) + [NET]) if nic else self._path(da, NET)
        else:
            nic = self.nics.get(db)
            p = ([NET] + self._path(nic, db)) if nic else self._path(NET, db)
        edges = tuple(zip(p[:-1], p[1:]))
        lat = sum(self.local.edges[e]["latency"] for e in edges)
        if remote:  # the far side of the path mirrors ours: count its latency too
            lat *= 2
        return edges, lat

    def route(self, src: int, dst: int):
        """Edges on node 0 used by a flow between world ranks src and dst (empty if it avoids node 0)."""
        ns, nd = src // self.gpn, dst // self.gpn
        if ns == 0 and nd == 0:
            return self._route(src, dst, 0)
        if ns == 0:
            return self._route(src, dst % self.gpn, 1)
        if nd == 0:
            return self._route(src % self.gpn, dst, 2)
        return (), 0.0

    def routes(self) -> tuple:
        """Every node-0 route a price can take (each pair of local devices, each device to and from the fabric):
        all that pricing reads of the links is these routes' edges."""
        n = len(self.names)
        keys = [(a, b, 0) for a in range(n) for b in range(n) if a != b]
        if self.multi_node:
            keys += [(a, a, r) for a in range(n) for r in (1, 2)]
        return tuple(self._route(*k) for k in keys)

    # ---- pattern cost
    def _cost_uncached(self, pattern: str, shape: GroupShape) -> StepCost:
        """Ring collectives are n-1 (or 2(n-1)) steps of a 1/n shift: they reuse the shift's link loads."""
        self.evaluations += 1
        n = shape.size
        steps = pattern_steps(pattern, n)
        if not steps:
            return StepCost(0, 0.0, 0.0, "")
        if pattern in COLLECTIVES:
            base = self._cost("channels", shape)
            return (StepCost(steps, base.sec_per_byte / n, base.latency, base.bottleneck, base.link_class)
                    if base.steps else base)
        load: dict[tuple[str, str], float] = {}
        lat = 0.0
        groups: dict[int, list[int]] = {}  # base rank -> indices of its members on node 0
        for r in range(min(self.gpn, shape.world)):
            base, i = shape.locate(r)
            groups.setdefault(base, []).append(i)
        off, route = shape.offset, self.route
        for base, local in groups.items():
            if pattern == "channels":
                flows = self.channel_flows(shape, base, local)
            else:
                flows = [(base + off(i), base + off(j), frac) for i, j, frac in flows_touching(pattern, n, local)]
            for src, dst, frac in flows:
                edges, l = route(src, dst)
                if l > lat:  # max(lat, l)
                    lat = l
                for e in edges:
                    load[e] = load.get(e, 0.0) + frac
        if not load:  # every flow stays on one device
            return StepCost(0, 0.0, 0.0, "")
        worst, spb = self.most_loaded(load)
        return StepCost(steps, spb, lat, f"{worst[0]}->{worst[1]} ({self.local.edges[worst]['kind']})",
                        "inter" if NET in worst else ("host" if self.via_host(worst) else "intra"))

    def most_loaded(self, load: dict[tuple[str, str], float]) -> tuple[tuple[str, str], float]:
        """The link of ``load`` with the most load over capacity (the first such, as ``max`` picks it) and that
        ratio: seconds per byte of the phase's volume."""
        cap = self._capacity
        worst, top = None, 0.0
        for e, v in load.items():
            r = v / cap[e]
            if worst is None or r > top:
                worst, top = e, r
        return worst, top

    @cached_property
    def _capacity(self) -> dict[tuple[str, str], float]:
        """Each node-0 link's capacity (bytes per second), read once per routed flow's links."""
        return {e: d["capacity"] for e, d in self.local.edges.items()}

    def channel_flows(self, shape: GroupShape, base: int, local: list[int]) -> list[tuple[int, int, float]]:
        """The node-0 flows (src rank, dst rank, fraction of the volume) of one step of a ring collective on the
        group at ``base`` whose members on node 0 have the indices ``local``.

        Inside one node, or where the node's members all leave through one NIC, it is one ring in group order
        (the shift). Across nodes with several NICs it is NCCL's: the ring visits the node's members in rank
        order and crosses to the next node from its last member, one channel per rotation of that order, so
        each channel's 1/k of the volume leaves (and enters) through a different member's NIC."""
        off, n = shape.offset, shape.size
        mine = sorted(base + off(i) for i in local)
        if len(mine) == n or len({self.nics.get(self.names[r]) for r in mine}) < 2:
            return [(base + off(i), base + off(j), frac) for i, j, frac in flows_touching("shift", n, local)]
        here = set(local)  # a member on another node (the first index not on node 0, without listing the group):
        far = base + off(next(i for i in range(n) if i not in here))  # a flow's node-0 route needs its node-0 end alone
        k = len(mine)
        out = []
        for c in range(k):
            seg = mine[c:] + mine[:c]
            out += [(far, seg[0], 1.0 / k), (seg[-1], far, 1.0 / k)]
            out += [(a, b, 1.0 / k) for a, b in zip(seg[:-1], seg[1:])]
        return out

    def via_host(self, edge: tuple[str, str]) -> bool:
        """Whether a link is the CPU's: the socket interconnect (smp) or a PCIe link into a host bridge, so that
        GPU-to-GPU traffic on it goes through the CPU's root complex (link class "host")."""
        g = self.local
        return g.edges[edge]["kind"] == "smp" or any(g.nodes[n].get("kind") == "host_bridge" for n in edge)

    def canonical(self, shape: GroupShape) -> GroupShape:
        """An equivalent shape for costing: parts whose stride is a multiple of the node size put each
        member on its own node, so only their sizes and order matter and their strides are compacted.
        Left as is when another part spans nodes by itself."""
        g = self.gpn
        if not any(st % g == 0 for _, st in shape.parts) or any(st % g and st * size > g for size, st in shape.parts):
            return shape
        parts, remote = [], g
        for size, st in shape.parts:
            if st % g == 0:
                parts.append((size, remote))
                remote *= size
            else:
                parts.append((size, st))
        return GroupShape(tuple(parts), remote)

    def cost(self, pattern: str, shape: GroupShape) -> StepCost:
        """Cost of one step of ``pattern`` on the groups of ``shape``, once per (pattern, shape)."""
        key = (pattern, shape)
        c = self._by_shape.get(key)
        if c is None:
            c = self._by_shape[key] = self._cost(pattern, self.canonical(shape))
        return c

    def time(self, pattern: str, shape: GroupShape, nbytes: float, params=None) -> float:
        """Seconds for a phase that moves ``nbytes`` per rank (see ``pattern_steps``) on every group of ``shape``;
        with ``params`` (planner/params.py) its CommFit for the pattern and the bottleneck's link class."""
        c = self._cost(pattern, shape)
        return c.time(nbytes, params.comm_fit(pattern, c.link_class) if params is not None else None)

    # ---- floors under every mesh order
    def pattern_floor(self, pattern: str, n: int, world: int, spread: int = 1) -> tuple[int, float, float]:
        """(steps, seconds per byte, latency) no higher than ``cost`` charges ``pattern`` on groups of ``n`` ranks in a
        world of ``world``, whatever their strides, so long as a group's members lie at least ``spread`` ranks apart
        (``_pattern_floor``), once per (pattern, n, world, spread)."""
        key = (pattern, n, world, spread)
        v = self._floors.get(key)
        if v is None:
            v = self._floors[key] = self._pattern_floor(pattern, n, world, spread)
        return v

    def _first_links(self, a: int, world: int) -> set[tuple[str, str]]:
        """The links a flow from node-0 device ``a`` can leave it by: its routes' first edges, to each other device of
        the node's ranks and, across nodes, to the fabric."""
        firsts = {self._route(a, b, 0)[0][0] for b in range(min(self.gpn, world)) if b != a}
        if self.multi_node:
            firsts.add(self._route(a, a, 1)[0][0])
        return firsts

    def _pattern_floor(self, pattern: str, n: int, world: int, spread: int) -> tuple[int, float, float]:
        """``pattern_floor``: a most loaded link carries at least what one node-0 member sends over the links its
        routes leave it by (``_first_links``: an all-to-all (n-1)/n of its volume; a shift its whole volume on one
        link; a ring collective's channels 1 in all). Where n exceeds the m <= ceil(node / spread) members a node
        can hold, every group on node 0 has a member elsewhere: an all-to-all member sends at least (n - m)/n off the
        node through its route's fabric link, a shift some member's whole volume through one, and each of the
        ceil(node / m) groups or more on node 0 a volume through them all. The latency: the least route such a flow
        can take. Patterns the engine prices otherwise: no floor (0)."""
        steps = pattern_steps(pattern, n)
        if not steps or pattern not in ("all_to_all", "shift", "shift_back", "shift_bi") + COLLECTIVES:
            return 0, 0.0, 0.0
        cap = self.local.edges
        devs = range(min(self.gpn, world))
        outs = [[cap[e]["capacity"] for e in self._first_links(a, world)] for a in devs]
        one_link, all_links = 1.0 / min(max(c) for c in outs), 1.0 / min(sum(c) for c in outs)
        held = min(n, -(-min(self.gpn, world) // spread))  # the most members of a group one node holds
        spans = self.multi_node and world > self.gpn and n > held
        leaving = -(-min(self.gpn, world) // held)  # groups on node 0, each sending a volume off it at least
        exits: dict = {}  # each member's fabric link (its route off the node's last edge) -> members leaving by it
        for a in devs:
            e = self._route(a, a, 1)[0][-1] if self.multi_node else None
            exits[e] = exits.get(e, 0) + 1
        if pattern == "all_to_all":
            spb = (n - 1) / n * all_links
            if spans:
                spb = max(spb, max(k * (n - held) / n / cap[e]["capacity"] for e, k in exits.items()))
        elif pattern in COLLECTIVES:
            spb = all_links
            if spans:
                spb = max(spb, leaving / sum(cap[e]["capacity"] for e in exits))
            spb /= n
        else:
            spb = max(one_link, 2 * all_links) if pattern == "shift_bi" and n > 2 else one_link
            if spans:
                spb = max(spb, 1.0 / max(cap[e]["capacity"] for e in exits),
                          leaving / sum(cap[e]["capacity"] for e in exits))
        remote = [self._route(a, a, 1)[1] for a in devs] if self.multi_node else []
        local = [self._route(a, b, 0)[1] for a in devs for b in devs if a != b]
        return steps, spb, min(remote) if spans else min(remote + local)
