"""Describe this host as a HostReport: GPUs (NVML, else topo -m and sysfs), NICs (sysfs), CPU, sources, warnings."""
from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

from .checks import cross_check
from .nvml import NvmlGpu, NvmlUnavailable, read_nvml
from .report import CpuInfo, GpuInfo, HostReport, NicInfo, RankInfo
from .specs import NVLINK_LINK_BYTES, gpu_spec, model_name, pcie_capacity
from .sysfs import SysNic, norm_bdf, pci_level, pci_of, read_cpu, read_gpus, read_nics
from .topo import TopoMatrix, parse_query_gpu, parse_topo, run_smi

__all__ = ["HostReport", "GpuInfo", "NicInfo", "CpuInfo", "RankInfo", "describe_host", "Sources"]

NVLINKS_PER_GPU_MAX = 18  # H100/B200: more NV# to all peers than this means the links go through NVSwitch


@dataclass
class Sources:
    """What each source gave (None where it was missing) and why a source was not used."""

    nvml: list[NvmlGpu] | None = None
    topo: TopoMatrix | None = None
    query: list[dict] | None = None
    sys_nics: list[SysNic] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)
    root: str = "/"


def gather_sources(sysfs_root: str | Path = "/", nvml=None, topo_text: str | None = None,
                   use_smi: bool = True, smi=run_smi) -> tuple[Sources, list[str]]:
    """Ask every source; never raise for a missing GPU, library or tool, say so instead.

    ``smi(*args) -> (stdout or None, why not)`` runs nvidia-smi (tests pass a fake).
    """
    s, warns = Sources(root=str(sysfs_root)), []
    if nvml is False:
        s.notes["nvml"] = "skipped"
    else:
        try:
            s.nvml = read_nvml(nvml)
            s.notes["nvml"] = f"ok: {len(s.nvml)} GPU(s)"
        except NvmlUnavailable as e:
            s.notes["nvml"] = f"unavailable: {e}"
        except Exception as e:  # noqa: BLE001 - a broken driver must not crash discovery
            s.notes["nvml"] = f"failed: {type(e).__name__}: {e}"
    if topo_text is not None:
        s.topo = parse_topo(topo_text, "topo file")  # a file the user gave: bad text is their error
        s.notes["topo"] = f"ok (file): {len(s.topo.gpus)} GPU(s), {len(s.topo.nics)} NIC(s)"
    elif use_smi:
        text, why = smi("topo", "-m")
        if text is None:
            s.notes["topo"] = f"unavailable: {why}"
        else:
            try:
                s.topo = parse_topo(text)
                s.notes["topo"] = f"ok: {len(s.topo.gpus)} GPU(s), {len(s.topo.nics)} NIC(s)"
            except Exception as e:  # noqa: BLE001 - an odd driver's format: fall back, say so
                s.notes["topo"] = f"unparsable: {e}"
                warns.append(f"could not parse `nvidia-smi topo -m` ({e}); using NVML and sysfs only")
        if s.nvml is None and s.topo is not None:
            text, why = smi("--query-gpu=index,name,memory.total,pci.bus_id", "--format=csv,noheader,nounits")
            s.query = parse_query_gpu(text) if text else None
    else:
        s.notes["topo"] = "skipped"
    try:
        s.sys_nics = read_nics(sysfs_root)
        ib = sum(n.kind != "ethernet" for n in s.sys_nics)
        s.notes["sysfs"] = f"ok: {ib} RDMA port(s), {len(s.sys_nics) - ib} Ethernet netdev(s)"
    except OSError as e:
        s.notes["sysfs"] = f"unreadable: {e}"
    return s, warns


def _gpus(s: Sources, root, warns: list[str]) -> list[GpuInfo]:
    """The host's GPUs from the best source present: NVML, else topo -m (+ query-gpu) with sysfs, else sysfs."""
    sys_gpus = read_gpus(root)
    if s.nvml is not None and s.nvml:
        by_bus = {g.pci_bus: g.index for g in s.nvml}
        out = []
        for g in s.nvml:
            peers = {by_bus[b]: n for b, n in g.nvlink_peers.items() if b in by_bus}
            out.append(GpuInfo(index=g.index, name=g.name, model=model_name(g.name, g.memory_bytes), uuid=g.uuid,
                               memory_bytes=g.memory_bytes, pci_bus=g.pci_bus, numa=g.numa, nvlinks=peers,
                               nvswitch_links=g.nvswitch_links, link_speed=g.link_speed, p2p=dict(g.p2p),
                               pcie_capacity=pcie_capacity(g.pcie_gen, g.pcie_width) if g.pcie_gen else 0.0))
            warns.extend(g.notes)
        return out
    n = len(s.topo.gpus) if s.topo else len(sys_gpus)
    if not n:
        return []
    rows = {r["index"]: r for r in (s.query or [])}
    out = []
    for i in range(n):
        r = rows.get(i, {})
        bus = norm_bdf(r["pci_bus"]) if r.get("pci_bus") else (sys_gpus[i].bdf if i < len(sys_gpus) else "")
        name = r.get("name", "")
        out.append(GpuInfo(index=i, name=name, model=model_name(name, r.get("memory_bytes", 0.0)) if name else "",
                           memory_bytes=r.get("memory_bytes", 0.0), pci_bus=bus))
    if not rows:
        warns.append(f"model and memory of {n} GPU(s) unknown (no NVML, no nvidia-smi --query-gpu)")
    if s.topo:
        for g in out:
            lab = f"GPU{g.index}"
            g.nvlinks = {j: k for j in range(n) if j != g.index and (k := s.topo.nvlinks(lab, f"GPU{j}"))}
            g.numa = s.topo.numa.get(lab)
    return out


def _infer_nvswitch(gpus: list[GpuInfo], notes: dict[str, str]) -> None:
    """Where NV# to every peer adds up to more links than a GPU has, the links go through NVSwitch."""
    for g in gpus:
        total = sum(g.nvlinks.values())
        if g.nvswitch_links == 0 and total > NVLINKS_PER_GPU_MAX:
            g.nvswitch_links = max(g.nvlinks.values())
            g.nvlinks = {}
            notes["nvswitch"] = (f"inferred from topo -m: NV{g.nvswitch_links} to {len(gpus) - 1} peers exceeds "
                                 f"{NVLINKS_PER_GPU_MAX} links per GPU")


def _nics(s: Sources) -> list[NicInfo]:
    out = []
    for n in s.sys_nics:
        cap = pcie_capacity(n.pci.gen, n.pci.width) if n.pci and n.pci.gen else 0.0
        out.append(NicInfo(name=n.name, kind=n.kind, rate=n.rate, up=n.up, netdev=n.netdev, physical=n.physical,
                           pci_bus=n.pci.bdf if n.pci else "", numa=n.pci.numa if n.pci else None, pcie_capacity=cap))
    return out


def _pcie_matrix(s: Sources, gpus: list[GpuInfo], nics: list[NicInfo], root) -> dict[str, dict[str, str]]:
    """PCIe levels between endpoints: NVML's common ancestor, else sysfs paths, else topo -m."""
    m: dict[str, dict[str, str]] = {}

    def put(a: str, b: str, lv: str | None, force: bool = False) -> None:
        if lv and a != b and (force or b not in m.get(a, {})):
            m.setdefault(a, {})[b] = lv
            m.setdefault(b, {})[a] = lv

    if s.nvml:
        for g in s.nvml:
            for j, lv in g.ancestor.items():
                put(f"GPU{g.index}", f"GPU{j}", lv)
    pci = {f"GPU{g.index}": pci_of(root, g.pci_bus) for g in gpus if g.pci_bus}
    pci.update({n.name: sn.pci for n, sn in zip(nics, s.sys_nics) if sn.pci})
    pci = {k: v for k, v in pci.items() if v is not None}
    names = sorted(pci)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            put(a, b, pci_level(pci[a], pci[b]))
    if s.topo:
        labels = s.topo.gpus + s.topo.nics
        for a in labels:
            for b in labels:
                put(_nic_key(a, nics), _nic_key(b, nics), s.topo.pcie(a, b))
    return m


def _nic_key(label: str, nics: list[NicInfo]) -> str:
    """A topo -m NIC name (``mlx5_1``) as our NIC name (``mlx5_1`` or ``mlx5_1:1`` for a multi-port device)."""
    if label.startswith("GPU"):
        return label
    for n in nics:
        if n.name == label or n.name.split(":")[0] == label:
            return n.name
    return label


def _fill_numa(gpus: list[GpuInfo], root) -> None:
    for g in gpus:
        if g.numa is None and g.pci_bus:
            p = pci_of(root, g.pci_bus)
            if p is not None:
                g.numa = p.numa
        if not g.pcie_capacity:
            p = pci_of(root, g.pci_bus) if g.pci_bus else None
            spec = gpu_spec(g.name)
            g.pcie_capacity = pcie_capacity(p.gen if p and p.gen else (spec.pcie_gen if spec else None),
                                            p.width if p else None)


def describe_host(sysfs_root: str | Path = "/", nvml=None, topo_text: str | None = None, use_smi: bool = True,
                  hostname: str | None = None, node_rank: int = 0, smi=run_smi) -> HostReport:
    """Describe this host. ``nvml``: a pynvml-like module (tests), None to import it, False to skip it."""
    s, warns = gather_sources(sysfs_root, nvml, topo_text, use_smi, smi)
    gpus = _gpus(s, sysfs_root, warns)
    _infer_nvswitch(gpus, s.notes)
    _fill_numa(gpus, sysfs_root)
    for g in gpus:
        if (g.nvlinks or g.nvswitch_links) and not g.link_speed:
            spec = gpu_spec(g.name)
            g.link_speed = spec.nvlink if spec else NVLINK_LINK_BYTES  # the model's NVLink generation, if known
            s.notes.setdefault("nvlink_speed", f"assumed {g.link_speed / 1e9:.0f} GB/s per link and direction "
                                               "(NVML gave none)")
    nics = _nics(s)
    if s.topo:  # NICs that topo -m shows but sysfs does not (e.g. /sys/class/infiniband not mounted)
        known = {n.name.split(":")[0] for n in nics}
        for name in s.topo.nics:
            if name not in known:
                nics.append(NicInfo(name=name, kind="unknown"))
    pcie = _pcie_matrix(s, gpus, nics, sysfs_root)
    cpu = read_cpu(sysfs_root)
    warns += cpu.notes
    if gpus and s.nvml is None:
        warns.append(f"NVML not used ({s.notes.get('nvml', 'skipped')}); GPUs from "
                     + ("nvidia-smi topo -m" if s.topo else "sysfs") + " instead")
    report = HostReport(hostname=hostname or socket.gethostname(), node_rank=node_rank,
                        cpu=CpuInfo(cores=cpu.cores, memory_bytes=cpu.memory_bytes, numa_nodes=cpu.numa_nodes),
                        gpus=gpus, nics=nics, pcie=pcie, sources=dict(s.notes), warnings=warns,
                        socket_ifname=socket_ifname(),
                        rdma_disabled=os.environ.get("NCCL_IB_DISABLE", "").strip() not in ("", "0"))
    report.warnings += cross_check(report, s)
    return report


def socket_ifname(env: dict | None = None) -> str:
    """The interface gloo/NCCL sockets are pinned to (first of a list; exclusions ``^...`` ignored)."""
    env = os.environ if env is None else env
    for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        v = env.get(key, "").strip()
        if v and not v.startswith("^"):
            return v.split(",")[0].lstrip("=")
    return ""


def visible_gpus(report: HostReport, env: dict | None = None) -> list[int]:
    """Physical GPU indices CUDA numbers 0, 1, ... (CUDA_VISIBLE_DEVICES: indices or UUID prefixes)."""
    env = os.environ if env is None else env
    allg = [g.index for g in report.gpus]
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return allg
    out = []
    for tok in [t.strip() for t in cvd.split(",") if t.strip()]:
        if re.fullmatch(r"[0-9]+", tok):
            if int(tok) in allg:
                out.append(int(tok))
            else:
                break  # CUDA stops at the first invalid entry
        else:
            hit = [g.index for g in report.gpus if g.uuid and g.uuid.startswith(tok)]
            if not hit:
                break
            out.append(hit[0])
    return out
