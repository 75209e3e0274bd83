"""Topology discovery: describe a host (NVML, `nvidia-smi topo -m`, sysfs) and build the Cluster graph.

    from sp_plan.profiles.discover import describe_host, build_cluster
    cluster = build_cluster([describe_host()])      # this host alone

It reads the host (files, NVML, nvidia-smi), so it sits beside the profile store in the layer of host I/O, above the
pure planner whose Cluster it builds. Gathering the reports of every node of a torchrun world and measuring its links
is ``.probe``'s job (torch.distributed), which this package does not import: describing a host needs no torch.
"""
from __future__ import annotations

import importlib

#: each public name and the module that defines it: loaded on first use (PEP 562), so a command that only parses
#: ``--sizes`` (``.sizes``) or never discovers does not load the readers of NVML, nvidia-smi and sysfs
_WHERE = {"build_cluster": "build", "nic_names": "build", "describe_host": "host", "visible_gpus": "host",
          "HostReport": "report", "GpuInfo": "report", "NicInfo": "report", "CpuInfo": "report", "RankInfo": "report",
          "TopoMatrix": "topo", "parse_topo": "topo"}
__all__ = list(_WHERE)


def __getattr__(name: str):
    """A public name, its module imported on first use."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(f".{where}", __name__), name)
    return value
