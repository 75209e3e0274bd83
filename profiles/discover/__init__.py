"""Topology discovery: describe a host (NVML, `nvidia-smi topo -m`, sysfs) and build the Cluster graph.

    from sp_plan.profiles.discover import describe_host, build_cluster
    cluster = build_cluster([describe_host()])      # this host alone

It reads the host (files, NVML, nvidia-smi), so it sits beside the profile store in the layer of host I/O, above the
pure planner whose Cluster it builds. No torch.distributed here: gathering the reports of every node is
``sp_plan.runtime.probe``'s job.
"""
from .build import build_cluster, nic_names
from .host import describe_host, visible_gpus
from .report import CpuInfo, GpuInfo, HostReport, NicInfo, RankInfo
from .topo import TopoMatrix, parse_topo

__all__ = ["build_cluster", "nic_names", "describe_host", "visible_gpus", "HostReport", "GpuInfo", "NicInfo", "CpuInfo", "RankInfo",
           "TopoMatrix", "parse_topo"]
