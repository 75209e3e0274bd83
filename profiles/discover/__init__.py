"""Topology discovery: describe a host (NVML, `nvidia-smi topo -m`, sysfs) and build the Cluster graph.

    from sp_plan.profiles.discover import describe_host, build_cluster
    cluster = build_cluster([describe_host()])      # this host alone

It reads the host (files, NVML, nvidia-smi), so it sits beside the profile store in the layer of host I/O, above the
pure planner whose Cluster it builds. Gathering the reports of every node of a torchrun world and measuring its links
is ``.probe``'s job (torch.distributed), which this package does not import: describing a host needs no torch.
"""
from .build import build_cluster, nic_names
from .host import describe_host, visible_gpus
from .report import CpuInfo, GpuInfo, HostReport, NicInfo, RankInfo
from .topo import TopoMatrix, parse_topo

__all__ = ["build_cluster", "nic_names", "describe_host", "visible_gpus", "HostReport", "GpuInfo", "NicInfo", "CpuInfo", "RankInfo",
           "TopoMatrix", "parse_topo"]
