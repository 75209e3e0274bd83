"""The report's matplotlib figures, each rendered to PNG bytes with the Agg canvas (no pyplot, no global backend).

step_bars: ranked plans as stacked bars (compute, exposed communication per mesh dimension, pipeline bubble);
memory_bars: each plan's peak memory by part against the device; measured_scatter: predicted against measured
step time; cluster_groups: the cluster graph with the winner's groups; sensitivity_bars: the winner's step
under each scenario against that scenario's best.
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import networkx as nx

from sp_plan.planner.cluster import NET, Cluster
from sp_plan.planner.errors import require_extra
from sp_plan.planner.plan import Plan
from sp_plan.planner.profile import MeasuredCandidate
from sp_plan.planner.search import summarize
from sp_plan.planner.sensitivity import Sensitivity

# matplotlib comes with the report extra: name it before the imports below would fail without a fix
require_extra("matplotlib", "report", "the report's figures")
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

GIB = 2.0 ** 30
COMPUTE, BUBBLE = "#4c72b0", "#9e9e9e"
PALETTE = ("#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#ccb974", "#64b5cd", "#2f4f4f")
LINK_COLOURS = {"nvlink": "#76b900", "nvswitch": "#76b900", "hccs": "#76b900", "pcie": "#8c8c8c", "smp": "#bbbbbb",
                "shm": "#bbbbbb", "ib": "#1f77b4", "roce": "#1f77b4", "ethernet": "#ff7f0e"}
GROUP_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
                 "#7f7f7f", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94")
#: at most this many devices are drawn in the cluster graph (whole nodes, at least one)
MAX_DRAWN_DEVICES = 32
#: groups drawn as closed cycles (their members pass blocks round a ring)
RING_GROUPS = ("ring", "sub_ring")


@dataclass
class Figure_:
    """One rendered figure: PNG bytes, alt text and a caption (what it shows, what it leaves out)."""

    png: bytes
    alt: str
    caption: str


def _png(fig: Figure) -> bytes:
    """PNG bytes of ``fig``. Every figure is laid out by its constrained layout, so a tight bounding box would only
    draw it a second time."""
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def _secs(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.3f} s"


def _labels(plans: list[Plan], chosen: int | None) -> list[str]:
    return [f"{'* ' if i == chosen else ''}#{i + 1} {p.summary()}" for i, p in enumerate(plans)]


def _bar_height(n: int) -> float:
    return 1.2 + 0.42 * n


def step_bars(plans: list[Plan], chosen: int | None = 0) -> Figure_:
    """Ranked plans as stacked horizontal bars of exposed seconds (planner.search.summarize's categories)."""
    parts = [summarize(p) for p in plans]
    comm = sorted({k for s in parts for k in s if k.startswith("comm ")})
    keys = ["compute"] + comm + ["pipeline bubble"]
    colours = {"compute": COMPUTE, "pipeline bubble": BUBBLE}
    colours.update({k: PALETTE[i % len(PALETTE)] for i, k in enumerate(comm)})
    fig = Figure(figsize=(11, _bar_height(len(plans))), layout="constrained")
    ax = fig.add_subplot()
    y = list(range(len(plans)))[::-1]
    left = [0.0] * len(plans)
    for k in keys:
        w = [s.get(k, 0.0) for s in parts]
        if not any(w):
            continue
        ax.barh(y, w, left=left, color=colours[k], label=k.replace("comm ", "exposed comm: "), edgecolor="white",
                linewidth=0.5)
        left = [a + b for a, b in zip(left, w)]
    for yi, p in zip(y, plans):
        ax.text(p.predicted.step_time_s, yi, f" {_secs(p.predicted.step_time_s)}", va="center", fontsize=8)
    ax.set_yticks(y, _labels(plans, chosen), fontsize=8)
    ax.set_xlabel("predicted step time (s): exposed seconds by category")
    ax.set_xlim(0, max(p.predicted.step_time_s for p in plans) * 1.15)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.06 - 0.6 / (len(plans) + 2)), ncol=3, fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    fig.suptitle("ranked layouts: where each step's time goes", fontsize=11)
    return Figure_(_png(fig), "stacked bars of the ranked layouts' step time",
                   "Each bar is one layout's predicted step: compute, the communication each mesh dimension leaves "
                   "exposed (what double buffering does not hide), and the pipeline bubble. * marks the plan.")


def memory_bars(plans: list[Plan], chosen: int | None = 0) -> Figure_:
    """Each plan's per-rank peak memory by part (Prediction.memory) against the device's capacity."""
    parts = [p.predicted.memory or {"peak": p.predicted.peak_memory_bytes} for p in plans]
    keys = list(dict.fromkeys(k for s in parts for k in s))
    fig = Figure(figsize=(11, _bar_height(len(plans))), layout="constrained")
    ax = fig.add_subplot()
    y = list(range(len(plans)))[::-1]
    left = [0.0] * len(plans)
    for i, k in enumerate(keys):
        w = [s.get(k, 0.0) / GIB for s in parts]
        ax.barh(y, w, left=left, color=(GROUP_COLOURS + PALETTE)[i % 25], label=k, edgecolor="white", linewidth=0.5)
        left = [a + b for a, b in zip(left, w)]
    for yi, p in zip(y, plans):
        ax.text(p.predicted.peak_memory_bytes / GIB, yi, f" {p.predicted.peak_memory_bytes / GIB:.1f} GiB", va="center",
                fontsize=8)
    usable = max(p.predicted.memory_capacity_bytes for p in plans) / GIB
    top = max(max(p.predicted.peak_memory_bytes for p in plans) / GIB, usable)
    if usable > 0:
        ax.axvline(usable, color="#c44e52", linestyle="--", linewidth=1.2)
        ax.text(usable, len(plans) - 0.45, " usable device memory", color="#c44e52", fontsize=8, va="bottom")
    ax.set_yticks(y, _labels(plans, chosen), fontsize=8)
    ax.set_ylim(-0.6, len(plans) - 0.1)
    ax.set_xlim(0, top * 1.18)
    ax.set_xlabel("predicted peak memory per rank (GiB)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.06 - 0.6 / (len(plans) + 2)), ncol=5, fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    fig.suptitle("memory of each layout against the device", fontsize=11)
    return Figure_(_png(fig), "stacked bars of each layout's peak memory",
                   f"Per-rank peak memory by part ({', '.join(keys)}) against the usable device memory (the "
                   "planner keeps a headroom below the device's size).")


def measured_scatter(points: list[tuple[str, float | None, float | None, float]]) -> Figure_:
    """Predicted (before and after calibration) against measured step time, one point per measured candidate.

    ``points``: (label, predicted before calibration or None, predicted after or None, measured seconds)."""
    fig = Figure(figsize=(7.5, 6), layout="constrained")
    ax = fig.add_subplot()
    meas = [m for _, _, _, m in points]
    preds = [v for _, b, a, _ in points for v in (b, a) if v is not None]
    lo, hi = min(meas + preds) * 0.85, max(meas + preds) * 1.15
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=1, label="predicted = measured")
    ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="#cccccc", alpha=0.4, label="within 10 %")
    before = [(m, b) for _, b, _, m in points if b is not None]
    after = [(m, a) for _, _, a, m in points if a is not None]
    if before:
        ax.scatter(*zip(*before), s=60, facecolors="none", edgecolors="#dd8452", linewidths=1.5,
                   label="predicted before calibration")
    if after:
        ax.scatter(*zip(*after), s=60, color="#4c72b0", label="predicted (calibrated)")
    for label, b, a, m in points:  # labels on the right half point left, so they stay inside the axes
        right = m > (lo + hi) / 2
        ax.annotate(label, (m, a if a is not None else b), textcoords="offset points", xytext=(-6 if right else 6, -10),
                    ha="right" if right else "left", fontsize=7)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("predicted step time (s)")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    fig.suptitle("predicted against measured", fontsize=11)
    return Figure_(_png(fig), "scatter of predicted against measured step time",
                   "One point per candidate that `sp-plan tune` ran (and per plan with a measurement): the model's "
                   "prediction before calibration (hollow) and with the profile (filled) against the measured step.")


def measured_points(plans: list[Plan], candidates: list[MeasuredCandidate]) -> list[tuple[str, float | None, float | None, float]]:
    """The scatter's points: tune's measured candidates (status ok) and plans that carry a measurement; a candidate
    measured on another model or sequence length than the plans' says which."""
    p0 = plans[0] if plans else None
    here = (p0.model.name if p0 and p0.model else "", p0.workload.seq_len if p0 and p0.workload else 0)

    def label(c: MeasuredCandidate) -> str:
        return c.summary if (c.model, c.seq_len) == here or not c.model else f"{c.summary} ({c.model}, {c.seq_len:,} tokens)"

    out = [(label(c), c.predicted_before_s, c.predicted_after_s, c.measured_s) for c in candidates
           if c.status == "ok" and c.measured_s and (c.predicted_before_s or c.predicted_after_s)]
    out += [(p.summary(), None, p.predicted.step_time_s, p.measured.step_time_s) for p in plans
            if p.measured is not None and p.predicted is not None]
    return out


# ---- the cluster graph
def drawn_nodes(cluster: Cluster) -> int:
    """How many whole nodes the graph figure draws (at most MAX_DRAWN_DEVICES devices, at least one node)."""
    return max(1, min(cluster.num_nodes, MAX_DRAWN_DEVICES // max(1, cluster.devices_per_node)))


def positions(cluster: Cluster, g: nx.DiGraph, nodes: int) -> dict[str, tuple[float, float]]:
    """A fixed layout: each node a column block, its devices in rows, switches placed under the devices they
    join (pcie switches, then NICs, then host bridges), NVSwitch above, the fabric below all nodes."""
    per_row = 8
    pos: dict[str, tuple[float, float]] = {}
    und = g.to_undirected(as_view=True)
    width = min(per_row, cluster.devices_per_node)
    levels = {"nvswitch": 1.4, "pcie_switch": -1.4, "nic": -2.5, "host_bridge": -3.6, "cpu": -3.6, "network_switch": -2.5}
    for k in range(nodes):
        x0 = k * (width + 1.5)
        devs = [n for n in g if g.nodes[n].get("node") == k and g.nodes[n].get("role") == "device"]
        rows = (len(devs) + per_row - 1) // per_row
        for i, n in enumerate(devs):  # device order is rank order (the node type's list)
            pos[n] = (x0 + i % per_row, 0.9 * (rows - 1 - i // per_row))
        for kind in ("nvswitch", "pcie_switch", "nic", "network_switch", "host_bridge", "cpu"):
            sw = [n for n in g if g.nodes[n].get("node") == k and g.nodes[n].get("kind") == kind]
            xs = []
            for n in sw:
                placed = [pos[m][0] for m in und.neighbors(n) if m in pos]
                xs.append(sum(placed) / len(placed) if placed else x0 + (width - 1) / 2)
            taken: dict[float, int] = {}
            for n, x in sorted(zip(sw, xs), key=lambda t: t[1]):
                key = round(x, 2)
                shift = taken.get(key, 0)
                taken[key] = shift + 1
                y = levels[kind] + (0.9 * (rows - 1) if kind == "nvswitch" else 0)
                pos[n] = (x + 0.35 * shift, y)
    if NET in g and nodes > 1:
        pos[NET] = ((nodes * (width + 1.5) - 1.5 - 1) / 2, -4.8)
    return pos


def _panels(plan: Plan) -> list[tuple[str, list[list[int]]]]:
    groups = plan.groups or plan.layout().all_groups()
    out = [(n, gs) for n, gs in groups.items() if gs and len(gs[0]) > 1]
    dims = {n for n, _ in out}
    if "sp" in dims and not ({"ulysses", "ring"} <= dims):
        out = [(n, gs) for n, gs in out if n != "sp"]  # sp is then the one sequence dimension again
    return out or [("(one rank per group)", [[r] for r in range(plan.world_size)])]


@dataclass(frozen=True)
class _Drawing:
    """The drawn part of a cluster: its graph, the layout, each drawn rank's position and each link's kind."""

    g: nx.DiGraph
    pos: dict[str, tuple[float, float]]
    where: dict[int, tuple[float, float]]  # device position by rank
    links: dict[tuple[str, str], str]  # each link once, whatever its directions
    nodes: int


def _drawing(cluster: Cluster) -> _Drawing:
    """Lay out the first ``drawn_nodes`` nodes of the cluster graph, numbering devices by rank."""
    nodes = drawn_nodes(cluster)
    g = cluster.model_copy(update={"nodes": cluster.nodes[:nodes]}).graph()  # only the nodes drawn, however big
    pos = positions(cluster, g, nodes)
    devices = [n for n in g if g.nodes[n].get("role") == "device"]
    rank_of = {n: i for i, n in enumerate(sorted(devices, key=lambda n: (g.nodes[n]["node"], _dev_index(cluster, n))))}
    links = {}
    for a, b, d in g.edges(data=True):
        links.setdefault(tuple(sorted((a, b))), d["kind"])
    return _Drawing(g, pos, {r: pos[n] for n, r in rank_of.items()}, links, nodes)


def _graph_figure(cluster: Cluster, d: _Drawing, panels: int) -> tuple[Figure, int, int]:
    """A figure sized for ``panels`` panels of the drawing at equal aspect: the figure, its rows and columns."""
    cols = 1 if d.nodes * min(8, cluster.devices_per_node) > 12 else 2
    rows = (panels + cols - 1) // cols
    xs = [p[0] for p in d.pos.values()]
    ys = [p[1] for p in d.pos.values()]
    w = max(xs) - min(xs) + 2
    fw = min(13, max(6.5, 0.55 * w * cols + 0.5))
    unit = fw / (w * cols)  # inches per layout unit (equal aspect): the height follows from the width
    return Figure(figsize=(fw, rows * (unit * (max(ys) - min(ys) + 2) + 0.5) + 0.4), layout="constrained"), rows, cols


def _draw_fabric(ax, d: _Drawing) -> None:
    """Links coloured by kind, switches, NICs and the fabric as grey squares."""
    g, pos = d.g, d.pos
    for kind in sorted(set(d.links.values())):
        segs = [(pos[a], pos[b]) for a, b in d.links if d.links[(a, b)] == kind]
        ax.add_collection(LineCollection(segs, colors=LINK_COLOURS.get(kind, "#999999"), linewidths=1.0,
                                         alpha=0.55, zorder=1, label=kind))
    sw = [n for n in g if g.nodes[n].get("role") != "device"]
    ax.scatter([pos[n][0] for n in sw], [pos[n][1] for n in sw], marker="s", s=28, color="#dddddd",
               edgecolors="#777777", linewidths=0.6, zorder=2)
    if NET in pos:
        ax.text(pos[NET][0], pos[NET][1] - 0.45, "network fabric", ha="center", va="top", fontsize=7, color="#555555")


def _draw_groups(ax, d: _Drawing, name: str, gs: list[list[int]]) -> None:
    """Each group's members joined in rank-list order (rings closed, with arrows), devices coloured by group."""
    where, ring = d.where, name in RING_GROUPS
    colour = {}
    for gi, members in enumerate(gs):
        c = GROUP_COLOURS[gi % len(GROUP_COLOURS)]
        for r in members:
            if r in where:
                colour[r] = c
        pairs = list(zip(members, members[1:])) + ([(members[-1], members[0])] if ring and len(members) > 2 else [])
        for a, b in pairs:
            if a in where and b in where:
                ax.add_patch(FancyArrowPatch(where[a], where[b], connectionstyle="arc3,rad=0.35", color=c,
                                             linewidth=1.6, alpha=0.9, zorder=3,
                                             arrowstyle="-|>" if ring else "-", mutation_scale=8))
    ranks = sorted(where)
    ax.scatter([where[r][0] for r in ranks], [where[r][1] for r in ranks], s=260,
               color=[colour.get(r, "#ffffff") for r in ranks], edgecolors="black", linewidths=0.8, zorder=4)
    for r in ranks:
        ax.text(*where[r], str(r), ha="center", va="center", fontsize=7, color="white", fontweight="bold", zorder=5)


def _draw_nodes(ax, d: _Drawing) -> None:
    """A dotted box and a label around each drawn node."""
    g, pos = d.g, d.pos
    for k in range(d.nodes):
        bx = [pos[n][0] for n in g if g.nodes[n].get("node") == k]
        by = [pos[n][1] for n in g if g.nodes[n].get("node") == k]
        ax.add_patch(Rectangle((min(bx) - 0.6, min(by) - 0.5), max(bx) - min(bx) + 1.2, max(by) - min(by) + 1.0,
                               fill=False, edgecolor="#aaaaaa", linestyle=":", linewidth=0.8, zorder=0))
        ax.text(min(bx) - 0.5, max(by) + 0.55, f"node {k}", fontsize=7, color="#555555")


def _frame(ax, d: _Drawing, title: str, legend: bool) -> None:
    """Title, equal-aspect limits around the drawing, no axes; the links' legend on the first panel."""
    xs = [p[0] for p in d.pos.values()]
    ys = [p[1] for p in d.pos.values()]
    ax.set_title(title, fontsize=9)
    ax.set_xlim(min(xs) - 1, max(xs) + 1)
    ax.set_ylim(min(ys) - 1.0, max(ys) + 1.0)
    ax.set_aspect("equal")
    ax.axis("off")
    if legend:
        ax.legend(fontsize=7, loc="lower right", title="links", title_fontsize=7, frameon=False)


def _groups_caption(cluster: Cluster, nodes: int) -> str:
    """The cluster figure's caption, saying which nodes are drawn."""
    shown = (f"All {cluster.num_nodes} node(s) drawn." if nodes == cluster.num_nodes else
             f"The cluster has {cluster.num_nodes} nodes ({cluster.world_size} devices); the first {nodes} node(s) "
             f"(ranks 0-{nodes * cluster.devices_per_node - 1}) are drawn, and groups that leave them are cut at "
             f"their edge; the other nodes repeat the pattern.")
    return ("The cluster's link graph (devices numbered by rank, switches, NICs and the fabric as grey squares, "
            "links coloured by kind), once per mesh dimension: devices share a colour when they are in the same "
            "group, and each group's members are joined in rank-list order (rings closed, with arrows). " + shown)


def cluster_groups(cluster: Cluster, plan: Plan) -> Figure_:
    """The cluster graph (networkx, Cluster.graph) once per mesh dimension of ``plan``, devices coloured by the
    group they belong to in that dimension and each group's members joined in rank-list order (rings closed)."""
    d = _drawing(cluster)
    panels = _panels(plan)
    fig, rows, cols = _graph_figure(cluster, d, len(panels))
    for i, (name, gs) in enumerate(panels):
        ax = fig.add_subplot(rows, cols, i + 1)
        _draw_fabric(ax, d)
        _draw_groups(ax, d, name, gs)
        _draw_nodes(ax, d)
        _frame(ax, d, f"{name}: {len(gs)} group(s) of {len(gs[0])}", legend=i == 0)
    fig.suptitle(f"{plan.summary()} on {cluster.name}", fontsize=10)
    return Figure_(_png(fig), "the cluster graph with the plan's groups", _groups_caption(cluster, d.nodes))


def _dev_index(cluster: Cluster, name: str) -> int:
    node, dev = name.split(".", 1)
    names = [d.name for d in cluster.node_type(int(node[1:])).devices]
    return names.index(dev)


def sensitivity_bars(sen: Sensitivity) -> Figure_:
    """Per scenario: the winner's step time and that scenario's best, as a change against the winner today."""
    sc = sen.scenarios
    fig = Figure(figsize=(11, 1.4 + 0.5 * len(sc)), layout="constrained")
    ax = fig.add_subplot()
    y = list(range(len(sc)))[::-1]
    old = [100 * (s.old_winner_s / s.base_s - 1) for s in sc]
    new = [100 * (s.winner.predicted.step_time_s / s.base_s - 1) for s in sc]
    ax.barh([v + 0.18 for v in y], old, height=0.34, color=COMPUTE, label="the winner under the change")
    ax.barh([v - 0.18 for v in y], new, height=0.34, color=["#55a868" if s.holds else "#c44e52" for s in sc],
            label="the best plan under the change (green: the winner, red: another plan)")
    hi = max(old + new + [1.0])
    lo = min(old + new + [0.0])
    for v, s, a, b in zip(y, sc, old, new):
        note = "holds" if s.holds else f"changes to {s.winner.summary()}: the winner loses {s.loss:.1%}"
        ax.text(max(a, b, 0) + 0.01 * (hi - lo), v, f" {note}", va="center", fontsize=7.5)
    ax.axvline(0, color="black", linewidth=1)
    ax.set_yticks(y, [s.what for s in sc], fontsize=8)
    ax.set_xlim(lo - 0.05 * (hi - lo), hi + 0.75 * (hi - lo))
    ax.set_xlabel(f"predicted step time against the winner today ({_secs(sc[0].base_s) if sc else '-'}), %")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.09 - 0.3 / (len(sc) + 2)), ncol=2, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    fig.suptitle("sensitivity: does the winner hold?", fontsize=11)
    return Figure_(_png(fig), "bars of the winner's step time under each changed input",
                   "Each row changes one input and ranks every layout again: the winner's step under the change (blue) "
                   "and the best plan's under it (green when that is still the winner, red when another plan wins), "
                   "both against the winner's step today.")
