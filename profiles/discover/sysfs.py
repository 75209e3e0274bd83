"""Read NICs, NVIDIA GPUs' PCI placement and the host's CPU and memory from sysfs (any root, for tests)."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path


_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_ROOT = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
_GEN = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}  # GT/s per lane -> PCIe generation
ETH_TYPE, IB_TYPE = 1, 32  # /sys/class/net/*/type (ARPHRD_ETHER, ARPHRD_INFINIBAND)


@dataclass
class PciDev:
    """A PCI function: bus id, its host bridge (``pci0000:17``), the chain of bridges above it, NUMA node."""

    bdf: str
    root: str
    chain: list[str]  # bus ids from below the host bridge down to this device (inclusive)
    numa: int | None = None
    gen: int | None = None
    width: int | None = None


@dataclass
class SysNic:
    """A network port: an RDMA port (InfiniBand or RoCE) or an Ethernet netdev."""

    name: str
    kind: str  # ib | roce | ethernet
    rate: float  # bytes/s, 0 when unknown
    up: bool
    netdev: str = ""
    port: int = 1
    physical: bool = True
    pci: PciDev | None = None
    detail: str = ""


@dataclass
class SysGpu:
    bdf: str
    pci: PciDev


@dataclass
class SysCpu:
    cores: int
    memory_bytes: float
    numa_nodes: int
    notes: list[str] = field(default_factory=list)


def norm_bdf(bus: str) -> str:
    """NVML's ``00000000:1B:00.0`` or sysfs's ``0000:1b:00.0`` -> ``0000:1b:00.0``."""
    bus = bus.strip().lower()
    m = re.match(r"^(?:([0-9a-f]+):)?([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$", bus)
    if not m:
        return bus
    dom = (m.group(1) or "0")[-4:].rjust(4, "0")
    return f"{dom}:{m.group(2)}:{m.group(3)}.{m.group(4)}"


def _read(p: Path) -> str | None:
    try:
        return p.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def pci_device(dev_dir: Path) -> PciDev | None:
    """The PCI placement of a device directory (a ``device`` symlink or a ``/sys/bus/pci/devices`` entry)."""
    try:
        real = Path(os.path.realpath(dev_dir))
    except OSError:
        return None
    parts = real.parts
    roots = [i for i, p in enumerate(parts) if _ROOT.match(p)]
    if not roots:
        return None
    chain = [p for p in parts[roots[-1] + 1:] if _BDF.match(p)]
    if not chain:
        return None
    numa = _int(_read(real / "numa_node"))
    # the device and the port it sits in: their link trains to the lesser (a Gen5 card in a Gen4 slot runs Gen4),
    # read from each one's max (a GPU's current speed drops while it idles); links further up are their own
    ports = [Path(*parts[:i + 1]) for i in range(roots[-1] + 1, len(parts)) if _BDF.match(parts[i])][-2:]
    gens = [g for g in (_link_gen(d) for d in ports) if g is not None]
    widths = [w for w in (_int(_read(d / "max_link_width")) for d in ports) if w and 1 <= w <= 32]
    return PciDev(bdf=chain[-1], root=parts[roots[-1]], chain=chain, numa=numa if numa is not None and numa >= 0 else None,
                  gen=min(gens) if gens else None, width=min(widths) if widths else None)


def _link_gen(dev_dir: Path) -> int | None:
    """The PCIe generation of a device's or bridge's ``max_link_speed`` (None where unreadable)."""
    m = re.match(r"([\d.]+)\s*GT/s", _read(dev_dir / "max_link_speed") or "")
    return _GEN.get(float(m.group(1))) if m else None


def pci_level(a: PciDev, b: PciDev) -> str:
    """nvidia-smi's distance between two PCI devices: PIX, PXB, PHB, NODE or SYS."""
    if a.root != b.root:
        return "NODE" if a.numa is not None and a.numa == b.numa else "SYS"
    k = 0
    while k < min(len(a.chain), len(b.chain)) - 1 and a.chain[k] == b.chain[k]:
        k += 1
    if a.chain[:-1] == b.chain[:-1]:  # functions of one device or siblings on one port
        return "PIX"
    if k == 0:
        return "PHB"
    below_a, below_b = len(a.chain) - 1 - k, len(b.chain) - 1 - k  # bridges under the common one
    return "PIX" if max(below_a, below_b) <= 1 else "PXB"


def parse_ib_rate(text: str | None) -> float:
    """``400 Gb/sec (4X NDR)`` -> bytes/s (0 if unreadable)."""
    m = re.match(r"\s*([\d.]+)\s*Gb/sec", text or "")
    return float(m.group(1)) * 1e9 / 8 if m else 0.0


def read_nics(root: str | Path = "/") -> list[SysNic]:
    """Every RDMA port and Ethernet netdev under ``root``/sys/class, physical and virtual."""
    sys = Path(root) / "sys" / "class"
    nics: list[SysNic] = []
    claimed: dict[str, str] = {}  # PCI bus id -> RDMA device name
    ib = sys / "infiniband"
    for dev in sorted(ib.iterdir() if ib.is_dir() else [], key=lambda p: _natural(p.name)):
        pci = pci_device(dev / "device")
        ports = sorted((dev / "ports").iterdir(), key=lambda p: _natural(p.name)) if (dev / "ports").is_dir() else []
        for port in ports:
            layer = (_read(port / "link_layer") or "InfiniBand").lower()
            state = _read(port / "state") or ""
            rate_txt = _read(port / "rate")
            name = dev.name if len(ports) == 1 else f"{dev.name}:{port.name}"
            nics.append(SysNic(name=name, kind="ib" if layer == "infiniband" else "roce", rate=parse_ib_rate(rate_txt),
                               up="ACTIVE" in state.upper(), port=_int(port.name) or 1, pci=pci,
                               detail=f"rate {rate_txt!r}, state {state!r}"))
        if pci:
            claimed[pci.bdf] = dev.name
    net = sys / "net"
    for nd in sorted(net.iterdir() if net.is_dir() else [], key=lambda p: _natural(p.name)):
        typ = _int(_read(nd / "type"))
        pci = pci_device(nd / "device") if (nd / "device").exists() else None
        if pci and pci.bdf in claimed:  # the netdev of an RDMA port: name it there
            for n in nics:
                if n.pci and n.pci.bdf == pci.bdf and not n.netdev:
                    n.netdev = nd.name
                    break
            continue
        if typ not in (ETH_TYPE, None) or nd.name == "lo":
            continue
        speed = _int(_read(nd / "speed"))
        oper = _read(nd / "operstate") or "unknown"
        nics.append(SysNic(name=nd.name, kind="ethernet", rate=speed * 1e6 / 8 if speed and speed > 0 else 0.0,
                           up=oper in ("up", "unknown") and (speed is None or speed != 0), netdev=nd.name,
                           physical=pci is not None, pci=pci, detail=f"speed {speed} Mb/s, operstate {oper}"))
    return nics


def read_gpus(root: str | Path = "/") -> list[SysGpu]:
    """NVIDIA display/3D controllers on the PCI bus, in bus order (nvidia-smi's order)."""
    bus = Path(root) / "sys" / "bus" / "pci" / "devices"
    gpus = []
    for d in sorted(bus.iterdir() if bus.is_dir() else [], key=lambda p: p.name):
        if (_read(d / "vendor") or "").lower() != "0x10de":
            continue
        cls = (_read(d / "class") or "").lower()
        if not (cls.startswith("0x0300") or cls.startswith("0x0302")):
            continue
        pci = pci_device(d)
        if pci:
            gpus.append(SysGpu(bdf=norm_bdf(d.name), pci=pci))
    return gpus


def pci_of(root: str | Path, bdf: str) -> PciDev | None:
    """The placement of one PCI device by bus id (None if sysfs does not show it)."""
    d = Path(root) / "sys" / "bus" / "pci" / "devices" / norm_bdf(bdf)
    return pci_device(d) if d.exists() else None


def read_cpu(root: str | Path = "/") -> SysCpu:
    """Usable cores (affinity), memory (the cgroup limit if lower than RAM) and NUMA node count."""
    root = Path(root)
    notes = []
    try:
        cores = len(os.sched_getaffinity(0)) if str(root) == "/" else (os.cpu_count() or 1)
    except AttributeError:
        cores = os.cpu_count() or 1
    mem = 0.0
    m = re.search(r"MemTotal:\s+(\d+)\s*kB", _read(root / "proc" / "meminfo") or "")
    if m:
        mem = float(m.group(1)) * 1024
    for p in (root / "sys/fs/cgroup/memory.max", root / "sys/fs/cgroup/memory/memory.limit_in_bytes"):
        lim = _int(_read(p))
        if lim and 0 < lim < (mem or float("inf")):
            notes.append(f"memory limited by cgroup to {lim / 2**30:.1f} GiB")
            mem = float(lim)
            break
    nodes = root / "sys" / "devices" / "system" / "node"
    numa = len([p for p in nodes.glob("node[0-9]*")]) if nodes.is_dir() else 1
    return SysCpu(cores=max(1, cores), memory_bytes=mem or 4e9, numa_nodes=max(1, numa), notes=notes)


def _natural(name: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]
