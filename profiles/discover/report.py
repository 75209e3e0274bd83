"""The pydantic records discovery exchanges and stores: a host's GPUs, NICs, CPU, sources and warnings. Each is built
on first use (defer_build): every command loads this module, and only discovery uses them."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class GpuInfo(BaseModel):
    """One GPU of a host, facts merged from NVML, `nvidia-smi topo -m` and sysfs."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    index: int = Field(description="nvidia-smi / NVML index (PCI bus order)")
    name: str = ""
    model: str = ""
    uuid: str = ""
    memory_bytes: float = 0.0
    pci_bus: str = ""
    numa: int | None = None
    nvlinks: dict[int, int] = Field(default_factory=dict, description="peer GPU index -> active NVLinks")
    nvswitch_links: int = Field(default=0, description="active NVLinks into NVSwitch")
    link_speed: float = Field(default=0.0, description="bytes/s per NVLink and direction")
    p2p: dict[int, bool] = Field(default_factory=dict)
    pcie_capacity: float = Field(default=0.0, description="bytes/s per direction of the GPU's PCIe link")


class NicInfo(BaseModel):
    """One network port: InfiniBand, RoCE or Ethernet (``unknown`` when only topo -m saw it)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    name: str
    kind: Literal["ib", "roce", "ethernet", "unknown"]
    rate: float = Field(default=0.0, description="line rate, bytes/s (0 = unknown)")
    up: bool = True
    netdev: str = ""
    physical: bool = True
    pci_bus: str = ""
    numa: int | None = None
    pcie_capacity: float = 0.0


class CpuInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    cores: int = 1
    memory_bytes: float = 4e9
    numa_nodes: int = 1


class RankInfo(BaseModel):
    """Where one torchrun rank runs: its node (torchrun's node rank and the hostname) and GPU."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    hostname: str
    gpu: int | None = Field(default=None, description="physical GPU index (NVML) this rank drives, None for CPU")


class HostReport(BaseModel):
    """What discovery found on one host, which sources it used and what it could not find."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    hostname: str
    node_rank: int = 0
    cpu: CpuInfo = Field(default_factory=CpuInfo)
    gpus: list[GpuInfo] = []
    nics: list[NicInfo] = []
    pcie: dict[str, dict[str, str]] = Field(default_factory=dict,
                                            description="PCIe level (PIX..SYS) between endpoints GPU<i> and NIC names")
    sources: dict[str, str] = Field(default_factory=dict, description="source -> 'ok: ...' or why it was not used")
    warnings: list[str] = []
    socket_ifname: str = Field(default="", description="GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME of the ranks, if set")
    rdma_disabled: bool = Field(default=False, description="NCCL_IB_DISABLE=1: NCCL sends its data over sockets")
    ranks: list[RankInfo] = []

    def level(self, a: str, b: str) -> str | None:
        return self.pcie.get(a, {}).get(b)
