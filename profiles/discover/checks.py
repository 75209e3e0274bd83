"""Cross-checks between NVML, `nvidia-smi topo -m` and sysfs: every contradiction becomes one warning."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .sysfs import pci_level, pci_of

if TYPE_CHECKING:
    from .host import Sources
    from .report import HostReport

RATE_PEER_FRACTION = 0.25  # an Ethernet port slower than this share of the fastest is management, not a peer


def gbit(rate: float) -> str:
    return f"{rate * 8 / 1e9:g} Gb/s"


def _nvlink_checks(r: "HostReport", s: "Sources") -> list[str]:
    out: list[str] = []
    if not (s.nvml and s.topo):
        return out
    if len(s.nvml) != len(s.topo.gpus):
        out.append(f"NVML sees {len(s.nvml)} GPU(s) but nvidia-smi topo -m shows {len(s.topo.gpus)}")
    by_bus = {g.pci_bus: g.index for g in s.nvml}
    idx = {g.index: g for g in s.nvml}
    for a in s.nvml:
        for b in s.nvml:
            if b.index <= a.index or f"GPU{b.index}" not in s.topo.gpus or f"GPU{a.index}" not in s.topo.gpus:
                continue
            direct = sum(n for bus, n in a.nvlink_peers.items() if by_bus.get(bus) == b.index)
            via_switch = min(a.nvswitch_links, idx[b.index].nvswitch_links)
            nv = max(direct, a.nvswitch_links if via_switch else 0)
            t = s.topo.nvlinks(f"GPU{a.index}", f"GPU{b.index}")
            if nv and not t:
                out.append(f"NVML sees {nv} active NVLink(s) between GPU{a.index} and GPU{b.index} that "
                           f"nvidia-smi topo -m does not show ({s.topo.cells.get((f'GPU{a.index}', f'GPU{b.index}'))})")
            elif t and not nv:
                out.append(f"nvidia-smi topo -m shows NV{t} between GPU{a.index} and GPU{b.index} but NVML finds "
                           "no active NVLink (links down?)")
            elif t and nv != t:
                out.append(f"GPU{a.index}-GPU{b.index}: NVML counts {nv} active NVLink(s), topo -m shows NV{t}")
            lv_n, lv_t = a.ancestor.get(b.index), s.topo.pcie(f"GPU{a.index}", f"GPU{b.index}")
            if lv_n and lv_t and lv_n != lv_t:
                out.append(f"GPU{a.index}-GPU{b.index}: NVML's PCIe common ancestor is {lv_n}, topo -m says {lv_t}")
            if a.p2p.get(b.index) is False:
                out.append(f"P2P reads not supported between GPU{a.index} and GPU{b.index} (copies go through the host)")
    return out


def _nic_checks(r: "HostReport", s: "Sources") -> list[str]:
    out: list[str] = []
    rdma = [n for n in s.sys_nics if n.kind in ("ib", "roce")]
    if s.topo:
        sys_names = {n.name.split(":")[0] for n in rdma}
        only_topo = [name for name in s.topo.nics if name not in sys_names]
        if only_topo:
            out.append(f"NIC(s) {only_topo} appear in nvidia-smi topo -m but not in /sys/class/infiniband "
                       "(not mounted in this container?); their kind and rate are unknown")
        for name in sorted(sys_names - set(s.topo.nics)):
            out.append(f"RDMA device {name} is in sysfs but not in nvidia-smi topo -m")
        gpu_pci = {f"GPU{g.index}": g.pci_bus for g in r.gpus if g.pci_bus}
        for n in rdma:
            base = n.name.split(":")[0]
            if base not in s.topo.nics or n.pci is None:
                continue
            for lab, bus in gpu_pci.items():
                p = pci_of(s.root, bus)
                t = s.topo.cells.get((lab, base))
                if p is None or t is None:
                    continue
                lv = pci_level(p, n.pci)
                if t != lv:
                    out.append(f"{lab}-{n.name}: sysfs PCI path gives {lv}, topo -m says {t}")
    for n in rdma:
        if not n.up:
            out.append(f"RDMA port {n.name} is not active ({n.detail}); not used")
    for kind in ("ib", "roce"):
        up = [n for n in rdma if n.kind == kind and n.up and n.rate > 0]
        top = max((n.rate for n in up), default=0.0)
        for n in up:
            if n.rate < top:
                out.append(f"NIC {n.name} ({kind}) runs at {gbit(n.rate)}, below its peers ({gbit(top)})")
    eth = [n for n in s.sys_nics if n.kind == "ethernet" and n.physical and n.up and n.rate > 0]
    top = max((n.rate for n in eth), default=0.0)
    for n in eth:
        if RATE_PEER_FRACTION * top <= n.rate < top:
            out.append(f"NIC {n.name} (ethernet) runs at {gbit(n.rate)}, below its peers ({gbit(top)})")
    return out


def _numa_checks(r: "HostReport", s: "Sources") -> list[str]:
    out: list[str] = []
    if s.topo:
        for g in r.gpus:
            t = s.topo.numa.get(f"GPU{g.index}")
            if t is not None and g.numa is not None and t != g.numa:
                out.append(f"GPU{g.index}: NUMA node {g.numa} (NVML/sysfs) but topo -m says {t}")
    return out


def cross_check(r: "HostReport", s: "Sources") -> list[str]:
    """Contradictions between the sources of one host, as warnings."""
    return _nvlink_checks(r, s) + _nic_checks(r, s) + _numa_checks(r, s)
