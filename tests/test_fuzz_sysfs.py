"""Fuzzing the sysfs boundary: generated /sys trees (NICs, RDMA ports, GPUs, memory) with sane and odd
contents; discovery reads what is there and never crashes on what is not."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from fuzzing import outcome
from sp_plan.planner.discover import build_cluster, describe_host
from sp_plan.planner.discover.sysfs import read_cpu, read_gpus, read_nics

ODD = st.one_of(st.sampled_from(["", "-1", "0", "99999999999999999999999", "nan", "\x00\x01", "unknown", "²",
                                 "100000 Gb/sec", "x GT/s", "1e400"]), st.text(max_size=30))
BINARY = st.binary(max_size=40)


def content(sane: st.SearchStrategy) -> st.SearchStrategy:
    """A sysfs file: usually what the kernel writes, sometimes odd text, bytes that are not UTF-8, or missing."""
    return st.one_of(sane, sane, sane, ODD, BINARY, st.none())


@st.composite
def trees(draw) -> dict:
    """A description of a /sys tree: PCI devices (GPUs, NICs), netdevs, RDMA ports, meminfo and cgroup."""
    n_pci = draw(st.integers(0, 4))
    pci = []
    for i in range(n_pci):
        bridges = draw(st.integers(0, 2))
        chain = [f"0000:{0x10 * (i + 1) + k:02x}:00.0" for k in range(bridges + 1)]
        pci.append({"root": f"pci0000:{0x10 * (i + 1):02x}", "chain": chain,
                    "vendor": draw(content(st.sampled_from(["0x10de", "0x15b3", "0x8086"]))),
                    "class": draw(content(st.sampled_from(["0x030200", "0x030000", "0x020000"]))),
                    "numa_node": draw(content(st.integers(-1, 3).map(str))),
                    "max_link_speed": draw(content(st.sampled_from(["16.0 GT/s PCIe", "32.0 GT/s PCIe", "8.0 GT/s"]))),
                    "max_link_width": draw(content(st.sampled_from(["16", "8"])))})
    nets = [{"name": draw(st.sampled_from(["eth", "ens", "ib", "lo", "bond"])) + str(i),
             "type": draw(content(st.sampled_from(["1", "32", "772"]))),
             "speed": draw(content(st.sampled_from(["100000", "25000", "-1", "0"]))),
             "operstate": draw(content(st.sampled_from(["up", "down", "unknown"]))),
             "pci": draw(st.one_of(st.none(), st.integers(0, max(0, n_pci - 1)))) if n_pci else None}
            for i in range(draw(st.integers(0, 3)))]
    ibs = [{"name": f"mlx5_{i}", "pci": draw(st.one_of(st.none(), st.integers(0, max(0, n_pci - 1)))) if n_pci else None,
            "ports": [{"link_layer": draw(content(st.sampled_from(["InfiniBand", "Ethernet"]))),
                       "state": draw(content(st.sampled_from(["4: ACTIVE", "1: DOWN"]))),
                       "rate": draw(content(st.sampled_from(["400 Gb/sec (4X NDR)", "200 Gb/sec (4X HDR)"])))}
                      for _ in range(draw(st.integers(0, 2)))]}
           for i in range(draw(st.integers(0, 2)))]
    meminfo = draw(content(st.integers(1, 2**40).map(lambda k: f"MemTotal:       {k} kB\n")))
    cgroup = draw(content(st.sampled_from(["max", "8589934592", "0"])))
    return {"pci": pci, "nets": nets, "ibs": ibs, "meminfo": meminfo, "cgroup": cgroup}


def _put(path: Path, value) -> None:
    if value is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass"))


def materialize(root: Path, t: dict) -> None:
    """Write the tree as the kernel lays it out: devices under /sys/devices, symlinks from bus and class."""
    dev_dirs = []
    for p in t["pci"]:
        d = root / "sys" / "devices" / p["root"]
        for bdf in p["chain"]:
            d = d / bdf
        d.mkdir(parents=True, exist_ok=True)
        for k in ("vendor", "class", "numa_node", "max_link_speed", "max_link_width"):
            _put(d / k, p[k])
        dev_dirs.append(d)
        link = root / "sys" / "bus" / "pci" / "devices" / p["chain"][-1]
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            os.symlink(d, link)
    for n in t["nets"]:
        d = root / "sys" / "class" / "net" / n["name"]
        d.mkdir(parents=True, exist_ok=True)
        for k in ("type", "speed", "operstate"):
            _put(d / k, n[k])
        if n["pci"] is not None:
            os.symlink(dev_dirs[n["pci"]], d / "device")
    for ib in t["ibs"]:
        d = root / "sys" / "class" / "infiniband" / ib["name"]
        (d / "ports").mkdir(parents=True, exist_ok=True)
        if ib["pci"] is not None:
            os.symlink(dev_dirs[ib["pci"]], d / "device")
        for j, port in enumerate(ib["ports"], 1):
            for k in ("link_layer", "state", "rate"):
                _put(d / "ports" / str(j) / k, port[k])
    _put(root / "proc" / "meminfo", t["meminfo"])
    _put(root / "sys" / "fs" / "cgroup" / "memory.max", t["cgroup"])


NEGATIVE_WIDTH = {"pci": [{"root": "pci0000:10", "chain": ["0000:10:00.0"], "vendor": "0x10de", "class": "0x030200",
                           "numa_node": "0", "max_link_speed": "16.0 GT/s PCIe", "max_link_width": "-1"}],
                  "nets": [], "ibs": [], "meminfo": "MemTotal:       1 kB\n", "cgroup": "max"}  # found by the dev profile


@example(NEGATIVE_WIDTH)
@given(trees())
def test_any_sysfs_tree_is_read_without_crashing(t):
    with tempfile.TemporaryDirectory() as d:
        materialize(Path(d), t)
        nics = read_nics(d)
        assert all(n.rate >= 0 and n.kind in ("ib", "roce", "ethernet") for n in nics)
        names = {n["name"] for n in t["nets"] if n["name"] != "lo"}
        assert {n.name for n in nics if n.kind == "ethernet"} <= names
        gpus = read_gpus(d)
        assert len(gpus) <= len(t["pci"])
        cpu = read_cpu(d)
        assert cpu.cores >= 1 and cpu.memory_bytes > 0 and cpu.numa_nodes >= 1
        host = describe_host(d, nvml=False, use_smi=False, hostname="fuzz")
        outcome(lambda: build_cluster([host]))  # a cluster, or a clear error (e.g. nothing to build from)


@given(trees())
def test_sane_ethernet_speeds_are_read_as_written(t):
    with tempfile.TemporaryDirectory() as d:
        materialize(Path(d), t)
        nics = {n.name: n for n in read_nics(d)}
    for n in t["nets"]:
        if n["name"] in nics and n["speed"] in ("100000", "25000") and nics[n["name"]].kind == "ethernet":
            assert nics[n["name"]].rate == int(n["speed"]) * 1e6 / 8
