"""Read GPUs through NVML (nvidia-ml-py, imported lazily): model, memory, NVLink per peer, P2P, PCIe, NUMA."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .sysfs import norm_bdf

# NVML constants (nvml.h); the module's own values win where it has them.
FI_NVLINK_SPEED_MBPS_L = (84, 85, 86, 87, 88, 89, 132, 133, 134, 135, 136, 137)  # NVML_FI_DEV_NVLINK_SPEED_MBPS_L0..L11
FI_NVLINK_SPEED_MBPS_COMMON = 90  # NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON
FI_NVLINK_GET_SPEED = 164  # NVML_FI_DEV_NVLINK_GET_SPEED, scoped by link (newer drivers)
NVLINK_MAX_LINKS = 18
TOPOLOGY_LEVEL = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}  # nvmlGpuTopologyLevel_t
DEVICE_TYPE_SWITCH = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH


class NvmlUnavailable(RuntimeError):
    """NVML could not be used (library missing, driver not loaded, no permission)."""


@dataclass
class NvmlGpu:
    """One GPU as NVML sees it; NVLink counts are active links, speeds bytes/s per link and direction."""

    index: int
    name: str
    uuid: str
    memory_bytes: float
    pci_bus: str
    numa: int | None = None
    nvlink_peers: dict[str, int] = field(default_factory=dict)  # remote PCI bus id -> active links (GPUs)
    nvswitch_links: int = 0
    link_speed: float = 0.0  # bytes/s per link and direction (mean over active links)
    p2p: dict[int, bool] = field(default_factory=dict)
    ancestor: dict[int, str] = field(default_factory=dict)  # other GPU index -> PIX ... SYS
    pcie_gen: int | None = None
    pcie_width: int | None = None
    notes: list[str] = field(default_factory=list)


def load_nvml() -> Any:
    """Import pynvml (nvidia-ml-py) or raise NvmlUnavailable saying how to get it."""
    try:
        import pynvml  # noqa: PLC0415 - optional dependency, imported lazily
    except ImportError as e:
        raise NvmlUnavailable(f"nvidia-ml-py is not installed ({e}); pip install 'sp-plan[gpu]'") from None
    return pynvml


def _s(x) -> str:
    """NVML's string answer (bytes or str); anything else is no answer."""
    if isinstance(x, bytes):
        return x.decode(errors="replace")
    return x if isinstance(x, str) else ""


def _int(x, lo: int, hi: int) -> int | None:
    """NVML's integer answer if it is one within [lo, hi], else None (an odd driver answer counts as none)."""
    return x if isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi else None


def _bytes(x) -> float:
    """A memory size in bytes if NVML gave a sane one, else 0.0 (unknown)."""
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and 0 < x < 2**60
    return float(x) if ok else 0.0


def _field_value(v) -> float | None:
    """The number in an nvmlFieldValue_t, or None if NVML reported an error for it."""
    if getattr(v, "nvmlReturn", 1) != 0:
        return None
    t = _int(getattr(v, "valueType", 1), 0, 6)
    name = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(t, "uiVal")
    x = getattr(getattr(v, "value", None), name, None)
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    return float(x) if ok else None


def link_speed_mbps(nvml, handle, link: int) -> float | None:
    """Per-link NVLink speed in MB/s from NVML's field values: per-link field, scoped field, then the common one."""
    tries: list = []
    if link < len(FI_NVLINK_SPEED_MBPS_L):
        tries.append(FI_NVLINK_SPEED_MBPS_L[link])
    tries += [(getattr(nvml, "NVML_FI_DEV_NVLINK_GET_SPEED", FI_NVLINK_GET_SPEED), link), FI_NVLINK_SPEED_MBPS_COMMON]
    for fid in tries:
        try:
            vals = nvml.nvmlDeviceGetFieldValues(handle, [fid])
        except Exception:  # noqa: BLE001 - NVMLError of any kind: try the next field
            continue
        v = _field_value(vals[0]) if isinstance(vals, (list, tuple)) and vals else None
        if v and 0 < v < 1e7:  # MB/s per link: NVLink 5 is 50,000; more is a bad answer
            return v
    return None


def _try(fn, *args, default=None):
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported, FunctionNotFound, ...
        return default


def _note_mig(nvml, handle, g: NvmlGpu) -> None:
    """A note where MIG partitions the GPU: the cluster describes whole GPUs, and a rank on a slice has only the
    slice's memory and SMs (and no NVLink), which discovery does not read."""
    get = getattr(nvml, "nvmlDeviceGetMigMode", None)  # older nvidia-ml-py, and pre-Ampere drivers, lack it
    mode = _try(get, handle) if get else None
    current = mode[0] if isinstance(mode, (list, tuple)) and mode else mode
    if current == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
        g.notes.append(f"GPU{g.index}: MIG is enabled; the cluster gives the whole GPU's memory and compute, and a rank "
                       "on a MIG slice has the slice's: write its memory_bytes and peak_flops into the cluster file, "
                       "or disable MIG (nvidia-smi -mig 0)")


def read_nvml(nvml=None) -> list[NvmlGpu]:
    """Every GPU NVML sees; raises NvmlUnavailable if NVML cannot be initialized."""
    nvml = nvml or load_nvml()
    try:
        nvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
        raise NvmlUnavailable(f"nvmlInit failed: {e}") from None
    try:
        return _read(nvml)
    finally:
        _try(nvml.nvmlShutdown)


def _read(nvml) -> list[NvmlGpu]:
    n = nvml.nvmlDeviceGetCount()
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
    gpus: list[NvmlGpu] = []
    for i, h in enumerate(handles):
        pci = nvml.nvmlDeviceGetPciInfo(h)
        mem = _try(nvml.nvmlDeviceGetMemoryInfo, h)
        gpus.append(NvmlGpu(index=i, name=_s(nvml.nvmlDeviceGetName(h)), uuid=_s(_try(nvml.nvmlDeviceGetUUID, h, default="")),
                            memory_bytes=_bytes(getattr(mem, "total", None)), pci_bus=norm_bdf(_s(getattr(pci, "busId", ""))),
                            numa=_int(_try(nvml.nvmlDeviceGetNumaNodeId, h), 0, 4095),
                            pcie_gen=_int(_try(nvml.nvmlDeviceGetMaxPcieLinkGeneration, h), 1, 7),
                            pcie_width=_int(_try(nvml.nvmlDeviceGetMaxPcieLinkWidth, h), 1, 32)))
    for g, h in zip(gpus, handles):
        _note_mig(nvml, h, g)
    buses = {g.pci_bus: g.index for g in gpus}
    enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
    max_links = getattr(nvml, "NVML_NVLINK_MAX_LINKS", NVLINK_MAX_LINKS)
    for g, h in zip(gpus, handles):
        speeds = []
        for link in range(max_links):
            try:
                state = nvml.nvmlDeviceGetNvLinkState(h, link)
            except Exception:  # noqa: BLE001 - link absent or NVLink unsupported
                continue
            if state != enabled:
                continue
            remote = _try(nvml.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
            bus = norm_bdf(_s(getattr(remote, "busId", "")))
            rtype = _try(nvml.nvmlDeviceGetNvLinkRemoteDeviceType, h, link)
            if bus in buses and rtype != DEVICE_TYPE_SWITCH:
                g.nvlink_peers[bus] = g.nvlink_peers.get(bus, 0) + 1
            elif rtype == DEVICE_TYPE_SWITCH or bus not in buses:
                g.nvswitch_links += 1
            sp = link_speed_mbps(nvml, h, link)
            if sp:
                speeds.append(sp * 1e6)
        active = g.nvswitch_links + sum(g.nvlink_peers.values())
        if speeds:
            g.link_speed = sum(speeds) / len(speeds)
        elif active:
            g.notes.append(f"GPU{g.index}: NVML gave no NVLink speed field; per-link speed assumed from the GPU model")
    read_idx = getattr(nvml, "NVML_P2P_CAPS_INDEX_READ", 0)
    ok = getattr(nvml, "NVML_P2P_STATUS_OK", 0)
    for a, ha in zip(gpus, handles):
        for b, hb in zip(gpus, handles):
            if a.index == b.index:
                continue
            st = _try(nvml.nvmlDeviceGetP2PStatus, ha, hb, read_idx)
            if st is not None:
                a.p2p[b.index] = st == ok
            lv = _int(_try(nvml.nvmlDeviceGetTopologyCommonAncestor, ha, hb), 0, 100)
            if lv is not None and lv in TOPOLOGY_LEVEL:
                a.ancestor[b.index] = TOPOLOGY_LEVEL[lv]
    return gpus
