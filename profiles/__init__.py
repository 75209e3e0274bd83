"""Cluster and model presets (data files) and the loader that turns a preset spec into a Cluster."""
from __future__ import annotations

from pathlib import Path

from sp_plan.planner.cluster import (NET, Cluster, Device, Link, NodeType, Switch, preset_name, preset_nodes,
                                    whole_number)
from sp_plan.planner.errors import NotFound, PlanError
from sp_plan.planner.model import ModelSpec
from sp_plan.planner.yamlio import load_yaml_model, model_from_data, names_file, read_data, yaml_load
from sp_plan.profiles.spec import node_spec

HERE = Path(__file__).parent
CLUSTERS = HERE / "clusters"
MODELS = HERE / "models"
#: more nodes than the largest clusters have (~100k GPUs): a typo, refused before building the node list
MAX_NODES = 100_000


def cluster_presets() -> list[str]:
    return sorted(p.stem for p in CLUSTERS.glob("*.yaml"))


def model_presets() -> list[str]:
    return sorted(p.stem for p in MODELS.glob("*.yaml"))


def preset_spec(name: str) -> dict:
    path = CLUSTERS / f"{name}.yaml"
    if not path.exists():
        raise unknown_cluster(name, PlanError, " or a cluster YAML file")
    return yaml_load(path.read_text())


def unknown_cluster(name: str, error: type[PlanError], files: str = "") -> PlanError:
    """The error for a cluster name that is no preset; where it is the name a preset cluster of N nodes reports
    (``preset_name``: dgx-h100x2), the fix gives the preset and its node count."""
    node, nodes = preset_nodes(name)
    if nodes > 1 and node in cluster_presets():
        return error("cluster", f"{name!r} names {nodes} nodes of the preset {node!r}",
                     f"give the preset and its node count: --cluster {node} --nodes {nodes} (in Python and HTTP: "
                     f"cluster={node!r}, nodes={nodes})")
    return error("cluster", f"unknown preset {name!r}", f"use one of {cluster_presets()}{files}")


def _intra_fabric(intra: dict, names: list[str]) -> tuple[list[Switch], list[Link]]:
    """The intra-node fabric: one NVSwitch, a full mesh of direct links (NVLink, HCCS), shared memory, or none
    beyond PCIe."""
    kind, n = intra["kind"], len(names)
    cap, lat = intra.get("capacity"), intra.get("latency")
    if kind == "nvswitch":
        return [Switch(name="nvswitch", kind="nvswitch")], [
            Link(src=names[i], dst="nvswitch", kind="nvswitch", capacity=cap, latency=lat) for i in range(n)]
    if kind in ("hccs", "nvlink"):  # full mesh of direct links
        return [], [Link(src=names[i], dst=names[j], kind=kind, capacity=cap, latency=lat)
                    for i in range(n) for j in range(i + 1, n)]
    if kind == "shm":
        return [Switch(name="host", kind="cpu")], [
            Link(src=names[i], dst="host", kind="shm", capacity=cap, latency=lat) for i in range(n)]
    if kind != "pcie":
        raise PlanError("intra.kind", f"unknown intra-node fabric {kind!r}", "use nvswitch, nvlink, hccs, shm or pcie")
    return [], []


def _pcie_tree(pcie: dict, names: list[str], sock: str) -> tuple[list[Switch], list[Link], dict[int, str]]:
    """Host bridges (joined by SMP links), an optional PXB root, and PCIe switches with their devices; also the
    switch of each device."""
    n, cap, lat = len(names), pcie["capacity"], pcie["latency"]
    groups = [g for g in pcie["switches"] if all(i < n for i in g)] or [list(range(n))]
    sockets = pcie.get("sockets", [list(range(len(groups)))])
    switches = [Switch(name=f"{sock}{j}", kind="host_bridge") for j, _ in enumerate(sockets)]
    links = [Link(src=f"{sock}{a}", dst=f"{sock}{a + 1}", kind="smp", capacity=pcie["smp_capacity"], latency=lat)
             for a in range(len(sockets) - 1)]
    if pcie.get("tree"):  # PXB: the switches hang off one more bridge below the host bridge
        switches.append(Switch(name="pcie_root", kind="pcie_switch"))
        links.append(Link(src="pcie_root", dst=f"{sock}0", kind="pcie", capacity=cap, latency=lat))
    switch_of: dict[int, str] = {}
    for k, members in enumerate(groups):
        sw = f"pcie{k}"
        switches.append(Switch(name=sw, kind="pcie_switch"))
        up = "pcie_root" if pcie.get("tree") else f"{sock}{next(j for j, s in enumerate(sockets) if k in s)}"
        links.append(Link(src=sw, dst=up, kind="pcie", capacity=cap, latency=lat))
        for i in members:
            switch_of[i] = sw
            links.append(Link(src=names[i], dst=sw, kind="pcie", capacity=cap, latency=lat))
    return switches, links, switch_of


def _nic_homes(nics: dict, names: list[str], switch_of: dict[int, str], host: str) -> list[tuple[str, str]]:
    """Each NIC's name and what it hangs off: its device's switch (or the device), a PCIe switch, or the host."""
    attach = nics["attach"]
    if attach == "per_gpu":
        return [(f"nic{i}", switch_of.get(i, names[i])) for i in range(len(names))]
    if attach == "per_switch":
        sws = sorted(set(switch_of.values()), key=lambda s: int(s[4:]))
        return [(f"nic{k}", s) for k, s in enumerate(sws)]
    return [(f"nic{k}", host) for k in range(nics.get("count", 1))]  # on the first host bridge or the shm host


def _nics(nics: dict, devices: list[Device], switch_of: dict[int, str], pcie: dict | None,
          sock: str) -> tuple[list[Switch], list[Link]]:
    """The node's NICs, each linked to its home and to the fabric; sets the NIC each device uses (its own, or
    the nearest shared one)."""
    net_kind = {"ib": "ib", "roce": "roce", "ethernet": "ethernet"}[nics["network"]]
    homes = _nic_homes(nics, [d.name for d in devices], switch_of, f"{sock}0" if pcie else "host")
    for i, d in enumerate(devices):
        d.nic = homes[i][0] if nics["attach"] == "per_gpu" else (
            next((nm for nm, h in homes if h == switch_of.get(i)), homes[0][0]))
    switches, links = [], []
    for name, home in homes:
        switches.append(Switch(name=name, kind="nic", rate=nics["rate"], network=nics["network"]))
        cap = pcie["capacity"] if pcie else nics["rate"] * 4
        links.append(Link(src=name, dst=home, kind="pcie" if pcie else "shm", capacity=cap, latency=nics["latency"] / 5))
        links.append(Link(src=name, dst=NET, kind=net_kind, capacity=nics["rate"], latency=nics["latency"]))
    return switches, links


def build_node_type(spec: dict, devices_per_node: int | None = None) -> NodeType:
    """Expand a preset's node description (devices, intra-node fabric, PCIe tree, NICs) into a NodeType."""
    spec = node_spec(spec, devices_per_node)
    dev = spec["device"]
    prefix = "cpu" if dev.get("kind") == "cpu" else "gpu"
    sock = "socket" if prefix == "cpu" else "cpu"  # host bridges; CPU rank slots already take the cpuN names
    devices = [model_from_data(Device, {"name": f"{prefix}{i}", **dev}, "cluster.device")
               for i in range(spec["devices_per_node"])]
    names = [d.name for d in devices]
    switches, links = _intra_fabric(spec.get("intra", {"kind": "pcie"}), names)
    pcie = spec.get("pcie")
    switch_of: dict[int, str] = {}
    if pcie:
        sw, ln, switch_of = _pcie_tree(pcie, names, sock)
        switches, links = switches + sw, links + ln
    if spec.get("nics"):
        sw, ln = _nics(spec["nics"], devices, switch_of, pcie, sock)
        switches, links = switches + sw, links + ln
    return NodeType(devices=devices, switches=switches, links=links)


def preset_cluster(name: str, nodes: int = 1, devices_per_node: int | None = None) -> Cluster:
    """A preset cluster of ``nodes`` alike nodes."""
    nodes = whole_number("nodes", nodes, 1, "pass --nodes 1 or more (in Python: nodes=N, a whole number)")
    if nodes > MAX_NODES:
        raise PlanError("nodes", f"{nodes:,} nodes is more than any cluster has (at most {MAX_NODES:,})", "check --nodes")
    spec = preset_spec(name)
    node = build_node_type(spec, devices_per_node)
    network = spec.get("nics", {}).get("network", "none") if nodes > 1 else "none"
    return Cluster(name=preset_name(name, nodes), node_types={name: node}, nodes=[name] * nodes,
                   network=network, source=spec.get("source", ""), fingerprint_memory=_keyed(name, spec))


def _keyed(name: str, spec: dict) -> dict[str, float]:
    """A preset's ``fingerprint_memory``: its node type's figure where the spec keeps one (NodeSpec)."""
    return {name: spec["fingerprint_memory_bytes"]} if spec.get("fingerprint_memory_bytes") else {}


def load_cluster(name_or_file: str, nodes: int | None = None, files: bool = True) -> Cluster:
    """A preset by name (with ``nodes``), or a cluster YAML/JSON file (``nodes`` must then be None or match);
    ``files=False``: a preset only, never a file (the service: a name never reads its working directory)."""
    name_or_file = preset_or_file("cluster", name_or_file, cluster_presets)
    if nodes is not None:
        nodes = whole_number("nodes", nodes, 1, "pass --nodes 1 or more (in Python: nodes=N, a whole number)")
    if not files and name_or_file not in cluster_presets():  # never a path: "../x" is no preset either
        raise unknown_cluster(name_or_file, NotFound)
    p = Path(name_or_file)
    if files and names_file(p):
        data = read_data(p, "cluster")
        if "devices_per_node" in data and "node_types" not in data:  # a preset-style spec file
            return spec_cluster(data, nodes or 1)
        c = load_yaml_model(Cluster, p, "cluster")
        if nodes is not None and nodes != c.num_nodes:
            raise PlanError("nodes", f"{p} describes {c.num_nodes} node(s), not {nodes}", "drop --nodes for a cluster file")
        return c
    return preset_cluster(name_or_file, nodes or 1)


def spec_cluster(spec: dict, nodes: int) -> Cluster:
    node = build_node_type(spec)
    name = spec.get("name", "custom")
    network = spec.get("nics", {}).get("network", "none") if nodes > 1 else "none"
    return Cluster(name=name, node_types={name: node}, nodes=[name] * nodes, network=network,
                   source=spec.get("source", ""), fingerprint_memory=_keyed(name, spec))


def load_model(name_or_file: str, files: bool = True) -> ModelSpec:
    """A model preset by name, or a model YAML/JSON file; ``files=False``: a preset only, never a file (the
    service)."""
    name_or_file = preset_or_file("model", name_or_file, model_presets)
    if not files and name_or_file not in model_presets():  # never a path: "../x" is no preset either
        raise NotFound("model", f"unknown preset {name_or_file!r}", f"use one of {model_presets()}")
    p = Path(name_or_file)
    if files and names_file(p):
        return load_yaml_model(ModelSpec, p, "model")
    path = MODELS / f"{name_or_file}.yaml"
    if not path.exists():
        raise PlanError("model", f"unknown preset {name_or_file!r}", f"use one of {model_presets()} or a model YAML file")
    return load_yaml_model(ModelSpec, path, "model")


def preset_or_file(field: str, name, presets) -> str:
    """``name`` as a str where it names a preset or a file (a str or a Path, not empty), else PlanError(field)."""
    if isinstance(name, Path):
        name = str(name)
    if not isinstance(name, str):
        raise PlanError(field, f"{type(name).__name__} is no preset name or file",
                        f"pass a preset name (one of {presets()}) or a file's path")
    if not name.strip():  # Path('') is the working directory: 'cannot read .' would not say what is wrong
        raise PlanError(field, "the name is empty", f"pass a preset name (one of {presets()}) or a file's path")
    return name
