"""The PCIe part of a discovered node: which GPUs and NICs share a PCIe switch, a host bridge (socket) or neither,
from NVML's common ancestors, sysfs paths or `nvidia-smi topo -m` (nvidia-smi's legend: PIX at most one bridge, PXB
several bridges, PHB through the host bridge, NODE between host bridges of one NUMA node, SYS across the SMP
interconnect), and the capacity of each PCIe link in the tree."""
from __future__ import annotations

from test_discover import SYSFS, FakeNvml, dgx_h100_nvml, fake_smi, links, node, topo

from sp_plan.profiles.discover import build_cluster, describe_host
from sp_plan.profiles.discover.report import GpuInfo, HostReport, NicInfo
from sp_plan.profiles.discover.sysfs import pci_device, pci_level

GEN5_X16, GEN4_X16 = 64e9, 32e9  # bytes/s per direction: 32 and 16 GT/s x 16 lanes / 8 bits, rounded up


def _host(gpus: list[GpuInfo], nics: list[NicInfo], levels: dict[tuple[str, str], str]) -> HostReport:
    pcie: dict[str, dict[str, str]] = {}
    for (a, b), lv in levels.items():
        pcie.setdefault(a, {})[b] = lv
        pcie.setdefault(b, {})[a] = lv
    return HostReport(hostname="h", gpus=gpus, nics=nics, pcie=pcie)


def _gpu(i: int, cap: float = GEN5_X16, numa: int | None = 0) -> GpuInfo:
    return GpuInfo(index=i, name="NVIDIA H100 PCIe", model="H100-PCIe-80GB", memory_bytes=80 * 2**30,
                   pci_bus=f"0000:{0x10 + i:02x}:00.0", numa=numa, pcie_capacity=cap)


def _nic(cap: float = 0.0) -> NicInfo:
    return NicInfo(name="mlx5_0", kind="ib", rate=50e9, numa=0, pcie_capacity=cap)


def _homes(nt) -> dict[str, str]:
    return {l.src: l.dst for l in links(nt, "pcie")}


def _host_bridges(nt) -> list[str]:
    return sorted(s.name for s in nt.switches if s.kind == "host_bridge")


def test_a_switch_uplink_runs_at_its_fastest_device():
    """A Gen5 and a Gen4 GPU under one switch (PIX): the switch's link to the host bridge carries the Gen5 GPU's
    traffic at Gen5, not the slower device's rate."""
    r = _host([_gpu(0, GEN5_X16), _gpu(1, GEN4_X16)], [_nic(GEN5_X16)],
              {("GPU0", "GPU1"): "PIX", ("GPU0", "mlx5_0"): "PHB", ("GPU1", "mlx5_0"): "PHB"})
    nt = node(build_cluster([r]))
    home = _homes(nt)
    switch = home["gpu0"]
    assert home["gpu1"] == switch and switch.startswith("pcie")
    (up,) = links(nt, "pcie", src=switch)
    assert up.capacity == GEN5_X16


def test_a_nic_without_a_pcie_figure_gets_the_fastest_gpus():
    """A NIC that only topo -m saw has no PCIe figure of its own: it is priced like the node's fastest GPU link,
    not a fixed Gen4 guess."""
    r = _host([_gpu(0, GEN5_X16), _gpu(1, GEN4_X16)], [_nic(0.0)],
              {("GPU0", "GPU1"): "PHB", ("GPU0", "mlx5_0"): "PHB", ("GPU1", "mlx5_0"): "PHB"})
    (nic,) = links(node(build_cluster([r])), "pcie", src="nic0")
    assert nic.capacity == GEN5_X16


def test_nics_without_sysfs_get_the_gen5_gpus_pcie_rate():
    """DGX H100 through NVML (Gen5 x16 GPUs) and topo -m, without sysfs: its NICs' PCIe links are Gen5 too."""
    r = describe_host(SYSFS / "none", nvml=dgx_h100_nvml(), smi=fake_smi("dgx-h100"))
    nics = [l for l in links(node(build_cluster([r])), "pcie") if l.src.startswith("nic")]
    assert nics and all(l.capacity == GEN5_X16 for l in nics)


def _without_affinity(text: str) -> str:
    """A topo -m as old drivers print it: no CPU Affinity, NUMA Affinity or GPU NUMA ID columns."""
    rows = [ln.split("\t0-31")[0].split("\t32-63")[0] if ln.startswith("GPU") else ln for ln in text.splitlines()]
    return "\n".join(rows).replace("\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID", "") + "\n"


def test_gpus_nothing_places_share_one_host_bridge():
    """Two GPUs joined by an NVLink bridge, with no PCIe cell and no NUMA id between them: nothing says they are
    on different sockets, so no SMP link is invented between them."""
    text = _without_affinity(topo("h100-pcie-nvlink-pair"))
    smi = lambda *a: (text, "") if a[:2] == ("topo", "-m") else (None, "")  # noqa: E731
    r = describe_host(SYSFS / "none", nvml=False, smi=smi)
    assert all(g.numa is None for g in r.gpus)
    nt = node(build_cluster([r]))
    assert _host_bridges(nt) == ["cpu0"] and not links(nt, "smp")


def _quad_nvml(pix: int, pxb: int) -> FakeNvml:
    """Four PCIe GPUs in two pairs (NVML's common ancestor ``pix`` inside a pair, ``pxb`` across), no NVLink."""
    gpus = [{"bus": f"0000:{0x21 + i:02x}:00.0", "name": "NVIDIA A10", "mem": 24 * 2**30, "numa": 0, "gen": 4,
             "links": []} for i in range(4)]
    return FakeNvml(gpus, lambda a, b: pix if a // 2 == b // 2 else pxb, 0)


def test_nvmls_single_and_multiple_ancestors_are_pix_and_pxb():
    """NVML's NVML_TOPOLOGY_SINGLE (10) is nvidia-smi's PIX and NVML_TOPOLOGY_MULTIPLE (20) its PXB: pairs on one
    switch each, both switches under one root switch."""
    r = describe_host(SYSFS / "none", nvml=_quad_nvml(10, 20), use_smi=False)
    assert r.pcie["GPU0"]["GPU1"] == "PIX" and r.pcie["GPU0"]["GPU2"] == "PXB"
    home = _homes(node(build_cluster([r])))
    assert home["gpu0"] == home["gpu1"] != home["gpu2"] == home["gpu3"]
    assert home[home["gpu0"]] == home[home["gpu2"]] == "pcie_root0" and home["pcie_root0"] == "cpu0"


def test_sysfs_paths_outrank_topo_cells():
    """Where sysfs's PCI path and topo -m disagree (here GPU0-mlx5_0: sysfs PXB, an edited topo -m PIX in both its
    row and its column), sysfs's level is the one the node is built from; the disagreement is a warning."""
    row = "GPU0\t X \tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\t"
    text = topo("dgx-h100").replace(row + "PXB", row + "PIX").replace("NIC0\tPXB\t", "NIC0\tPIX\t")
    smi = lambda *a: (text, "") if a[:2] == ("topo", "-m") else (None, "")  # noqa: E731
    r = describe_host(SYSFS / "ib-ndr", nvml=dgx_h100_nvml(), smi=smi)
    assert r.pcie["GPU0"]["mlx5_0"] == "PXB"
    assert any("GPU0-mlx5_0: sysfs PCI path gives PXB, topo -m says PIX" in w for w in r.warnings)


def test_devices_on_two_host_bridges_with_unknown_numa_are_sys(tmp_path):
    """NODE is "between host bridges within a NUMA node": two devices under different host bridges whose sysfs
    numa_node is -1 (a VM) are not known to share a NUMA node, so they are SYS (and on two sockets), as when their
    NUMA nodes differ."""
    devs = []
    for k, rc in enumerate(("pci0000:00", "pci0000:80")):
        d = tmp_path / "sys/devices" / rc / f"0000:{rc[-2:]}:01.0" / f"0000:{0x10 + k:02x}:00.0"
        d.mkdir(parents=True)
        (d / "numa_node").write_text("-1\n")
        devs.append(pci_device(d))
    assert [p.numa for p in devs] == [None, None]
    assert pci_level(*devs) == "SYS"


def test_phb_pairs_share_a_host_bridge():
    """PHB is "through a PCIe host bridge", one socket: four GPUs whose pairs meet only at the host bridge are two
    PCIe switches under one host bridge, with no SMP link."""
    text = topo("a10-4-pcie").replace("PXB", "PHB")
    smi = lambda *a: (text, "") if a[:2] == ("topo", "-m") else (None, "")  # noqa: E731
    nt = node(build_cluster([describe_host(SYSFS / "none", nvml=False, smi=smi)]))
    home = _homes(nt)
    assert _host_bridges(nt) == ["cpu0"] and not links(nt, "smp")
    assert home["gpu0"] == home["gpu1"] != home["gpu2"] == home["gpu3"]
    assert home[home["gpu0"]] == home[home["gpu2"]] == "cpu0"


def test_a_nic_behind_a_second_bridge_is_pxb(tmp_path):
    """Under one PCIe switch, a GPU on a downstream port and a NIC behind a further bridge on another downstream port:
    the path crosses several bridges, PXB; a GPU and a NIC on two downstream ports of the switch are PIX."""
    switch = tmp_path / "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"  # root port, switch upstream port
    gpu = switch / "0000:02:00.0/0000:03:00.0"
    near = switch / "0000:02:02.0/0000:06:00.0"
    far = switch / "0000:02:01.0/0000:04:00.0/0000:05:00.0"
    for d in (gpu, near, far):
        d.mkdir(parents=True)
    assert pci_level(pci_device(gpu), pci_device(near)) == "PIX"
    assert pci_level(pci_device(gpu), pci_device(far)) == "PXB"
