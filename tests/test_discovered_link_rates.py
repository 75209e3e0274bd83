"""The rates a discovered node's links get: a PCIe link from its generation and width (sysfs, NVML or the model's
datasheet), an NVLink from NVML's per-link speeds, and latencies in seconds."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from test_discover import SYSFS, dgx_h100_nvml, fake_smi, h100_pair_nvml, links, node

from sp_plan.profiles.discover import build_cluster, describe_host
from sp_plan.profiles.discover.host import _nics, gather_sources
from sp_plan.profiles.discover.report import GpuInfo, HostReport
from sp_plan.profiles.discover.sysfs import pci_device

#: PCIe per lane: GT/s and line code (8b/10b for Gen 1-2, 128b/130b for Gen 3-5)
LANE = {1: (2.5, 8 / 10), 2: (5.0, 8 / 10), 3: (8.0, 128 / 130), 4: (16.0, 128 / 130), 5: (32.0, 128 / 130)}


def _x16(gen: int) -> float:
    gts, code = LANE[gen]
    return gts * 1e9 * 16 * code / 8


@pytest.mark.parametrize("speed,gen", [("2.5 GT/s PCIe", 1), ("5.0 GT/s PCIe", 2), ("8.0 GT/s PCIe", 3),
                                       ("16.0 GT/s PCIe", 4), ("32.0 GT/s PCIe", 5), ("64.0 GT/s PCIe", 6)])
def test_sysfs_link_speed_names_the_generation(tmp_path, speed, gen):
    """sysfs's max_link_speed per lane is the PCIe generation: 2.5, 5, 8, 16, 32, 64 GT/s are Gen 1 to 6."""
    dev = tmp_path / "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"
    dev.mkdir(parents=True)
    for d in (dev, dev.parent):
        (d / "max_link_speed").write_text(speed + "\n")
    assert pci_device(dev).gen == gen


def _slot(tmp: Path, speed: str, width: int, card: str = "32.0 GT/s PCIe") -> Path:
    """A sysfs root with one H100 PCIe card (Gen5 x16) in a root port of ``speed`` x ``width``."""
    port = tmp / "sys/devices/pci0000:00/0000:00:01.0"
    dev = port / "0000:01:00.0"
    dev.mkdir(parents=True)
    for d, (s, w) in ((port, (speed, width)), (dev, (card, 16))):
        (d / "max_link_speed").write_text(s + "\n")
        (d / "max_link_width").write_text(f"{w}\n")
        (d / "numa_node").write_text("0\n")
    (dev / "vendor").write_text("0x10de\n")
    (dev / "class").write_text("0x030200\n")
    (tmp / "sys/bus/pci/devices").mkdir(parents=True)
    (tmp / "sys/bus/pci/devices/0000:01:00.0").symlink_to(dev)
    return tmp


def _one_gpu_topo(*args):
    if args[:2] == ("topo", "-m"):
        return "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \t0-31\t0\t\tN/A\n", ""
    return "0, NVIDIA H100 PCIe, 81559, 00000000:01:00.0\n", ""


@pytest.mark.parametrize("speed,width,gen,lanes", [("32.0 GT/s PCIe", 8, 5, 8), ("16.0 GT/s PCIe", 16, 4, 16)])
def test_without_nvml_a_gpu_runs_at_its_slots_generation_and_width(tmp_path, speed, width, gen, lanes):
    """Without NVML a Gen5 x16 card in a Gen5 x8 or a Gen4 x16 slot is priced at the slot's rate (32 GB/s), read
    from sysfs, not at the card's datasheet Gen5 x16."""
    r = describe_host(_slot(tmp_path, speed, width), nvml=False, smi=_one_gpu_topo)
    assert r.gpus[0].pcie_capacity == pytest.approx(_x16(gen) * lanes / 16, rel=0.02)
    (link,) = links(node(build_cluster([r])), "pcie", src="gpu0")
    assert link.capacity == r.gpus[0].pcie_capacity


def test_a_nic_in_an_x8_slot_is_priced_at_x8(tmp_path):
    """A Gen4 NIC whose sysfs link is x8 gets half an x16 Gen4 link."""
    port = tmp_path / "sys/devices/pci0000:00/0000:00:01.0"
    dev = port / "0000:01:00.0"
    dev.mkdir(parents=True)
    for d in (port, dev):
        (d / "max_link_speed").write_text("16.0 GT/s PCIe\n")
        (d / "max_link_width").write_text("8\n")
    ib = tmp_path / "sys/class/infiniband/mlx5_0"
    (ib / "ports/1").mkdir(parents=True)
    (ib / "device").symlink_to(dev)
    for f, v in (("link_layer", "InfiniBand"), ("state", "4: ACTIVE"), ("rate", "200 Gb/sec (4X HDR)")):
        (ib / "ports/1" / f).write_text(v + "\n")
    s, _ = gather_sources(tmp_path, nvml=False, use_smi=False)
    (nic,) = _nics(s)
    assert nic.pcie_capacity == pytest.approx(_x16(4) / 2, rel=0.02)


def _gpu(i: int, peer: int, speed: float) -> GpuInfo:
    return GpuInfo(index=i, name="NVIDIA H100 PCIe", model="H100-PCIe-80GB", memory_bytes=80 * 2**30, numa=0,
                   pcie_capacity=64e9, nvlinks={peer: 4}, link_speed=speed)


def test_an_nvlink_runs_at_the_slower_ends_speed():
    """Four NVLinks between a GPU at 25 GB/s per link and one at 20 GB/s: 4 x 20 GB/s, whichever end is first."""
    for a, b in ((25e9, 20e9), (20e9, 25e9)):
        r = HostReport(hostname="h", gpus=[_gpu(0, 1, a), _gpu(1, 0, b)], pcie={"GPU0": {"GPU1": "PHB"},
                                                                                "GPU1": {"GPU0": "PHB"}})
        (nv,) = links(node(build_cluster([r])), "nvlink")
        assert nv.capacity == 4 * 20e9


def test_nvml_link_speeds_add_up_link_by_link():
    """NVML reports 20,000 MB/s on one half of a GPU pair's links and 30,000 MB/s on the other: the pair's NVLink
    carries the sum of its links' speeds (12 links: 6 x 20 + 6 x 30 GB/s = 300 GB/s)."""
    nvml = h100_pair_nvml()
    per_link = {}

    def fields(h, ids):
        out = []
        for fid in ids:
            key = (h, fid)
            per_link.setdefault(key, 20000 if len(per_link) % 2 == 0 else 30000)
            out.append(SimpleNamespace(nvmlReturn=0, valueType=1, value=SimpleNamespace(uiVal=per_link[key])))
        return out

    nvml.nvmlDeviceGetFieldValues = fields
    r = describe_host(SYSFS / "roce", nvml=nvml, smi=fake_smi("h100-pcie-nvlink-pair"))
    (nv,) = links(node(build_cluster([r])), "nvlink")
    assert nv.capacity == pytest.approx(6 * 20e9 + 6 * 30e9)


def test_nvswitch_links_are_found_without_the_remote_device_type():
    """Drivers without nvmlDeviceGetNvLinkRemoteDeviceType: a link whose far end is no GPU of this host is an
    NVSwitch port, so a DGX H100 still gets its 18 NVSwitch links per GPU."""
    nvml = dgx_h100_nvml()

    def missing(*a):
        raise RuntimeError("Function Not Found")

    nvml.nvmlDeviceGetNvLinkRemoteDeviceType = missing
    r = describe_host(SYSFS / "ib-ndr", nvml=nvml, smi=fake_smi("dgx-h100"))
    assert [g.nvswitch_links for g in r.gpus] == [18] * 8


def test_latencies_are_microseconds_not_milliseconds():
    """Every link a discovered node gets (PCIe, SMP, NVLink, the NIC's network link of each kind) has a latency in
    seconds between 0.1 us and 100 us."""
    query = "\n".join(f"{i}, NVIDIA L20, 46068, 00000000:{b}:00.0" for i, b in
                      enumerate(["1A", "1B", "1C", "1D", "9A", "9B", "9C", "9D"]))
    hosts = [describe_host(SYSFS / "eth100", nvml=False, smi=fake_smi("l20-8-pcie", query)),
             describe_host(SYSFS / "ib-ndr", nvml=dgx_h100_nvml(), smi=fake_smi("dgx-h100")),
             describe_host(SYSFS / "roce", nvml=h100_pair_nvml(), smi=fake_smi("h100-pcie-nvlink-pair"))]
    kinds = set()
    for h in hosts:
        for l in node(build_cluster([h])).links:
            kinds.add(l.kind)
            assert 1e-7 <= l.latency <= 1e-4, (l.kind, l.latency)
    assert {"pcie", "smp", "nvswitch", "nvlink", "ib", "roce", "ethernet"} <= kinds


def _nv_mesh(gpus: int, per_pair: int) -> str:
    """A topo -m of ``gpus`` GPUs joined pairwise by NV``per_pair`` and nothing else."""
    head = "\t" + "\t".join(f"GPU{i}" for i in range(gpus)) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
    rows = [f"GPU{a}\t" + "\t".join(" X " if a == b else f"NV{per_pair}" for b in range(gpus)) + "\t0-31\t0\t\tN/A"
            for a in range(gpus)]
    return "\n".join([head] + rows) + "\n"


def test_a_four_gpu_board_with_all_18_links_direct_has_no_nvswitch():
    """An HGX H100 4-GPU board: each GPU's 18 NVLinks go 6 to each of its 3 peers, directly (18 is what a GPU has,
    so nothing needs a switch): six direct NVLinks of 6 x 25 GB/s, no NVSwitch."""
    text = _nv_mesh(4, 6)
    smi = lambda *a: (text, "") if a[:2] == ("topo", "-m") else (None, "")  # noqa: E731
    nt = node(build_cluster([describe_host(SYSFS / "none", nvml=False, smi=smi)]))
    nv = links(nt, "nvlink")
    assert len(nv) == 6 and all(l.capacity == 6 * 25e9 for l in nv)
    assert not links(nt, "nvswitch")
