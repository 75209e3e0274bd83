"""Topology discovery: describe a host (NVML, `nvidia-smi topo -m`, sysfs) and build the Cluster graph.

    from sp_plan.planner.discover import describe_host, build_cluster
    cluster = build_cluster([describe_host()])      # this host alone

No torch.distributed here: gathering the reports of every node is ``sp_plan.runtime.probe``'s job.
"""
from .build import build_cluster
from .host import describe_host, visible_gpus
from .report import CpuInfo, GpuInfo, HostReport, NicInfo, RankInfo
from .topo import TopoMatrix, parse_topo

__all__ = ["build_cluster", "describe_host", "visible_gpus", "HostReport", "GpuInfo", "NicInfo", "CpuInfo", "RankInfo",
           "TopoMatrix", "parse_topo"]
