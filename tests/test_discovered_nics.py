"""Which NICs a discovered node gets and at what rate: each GPU's nearest NIC on PCIe, management Ethernet ports
left out, a virtual interface's reported speed not trusted, a driver's ``unknown`` operstate read as up, the first
interface of a pinned list; and which GPUs CUDA_VISIBLE_DEVICES leaves a node's ranks."""
from __future__ import annotations

from pathlib import Path

from test_discover import SYSFS, dgx_h100_nvml, fake_smi, node

from sp_plan.profiles.discover import build_cluster, describe_host, nic_names
from sp_plan.profiles.discover.host import socket_ifname, visible_gpus
from sp_plan.profiles.discover.report import GpuInfo, HostReport, NicInfo
from sp_plan.profiles.discover.sysfs import read_nics


def _two_socket_host() -> HostReport:
    """Four GPUs, two per socket, and one NIC per socket: PXB inside a socket, SYS across."""
    gpus = [GpuInfo(index=i, name="NVIDIA H100 80GB HBM3", model="H100-SXM5-80GB", memory_bytes=80 * 2**30,
                    numa=i // 2, pcie_capacity=64e9) for i in range(4)]
    nics = [NicInfo(name=f"mlx5_{k}", kind="ib", rate=50e9, numa=k, pcie_capacity=64e9) for k in range(2)]
    labels = [f"GPU{i}" for i in range(4)] + ["mlx5_0", "mlx5_1"]
    socket = {lb: (int(lb[3:]) // 2 if lb.startswith("GPU") else int(lb[-1])) for lb in labels}
    pcie = {a: {b: ("PXB" if socket[a] == socket[b] else "SYS") for b in labels if b != a} for a in labels}
    return HostReport(hostname="h", gpus=gpus, nics=nics, pcie=pcie)


def test_gpus_share_their_sockets_nic_rather_than_cross_to_an_idle_one():
    """Two GPUs per socket and one NIC per socket: both GPUs of a socket use that socket's NIC (the nearest on PCIe);
    spreading over the less used NIC would send half the GPUs across the SMP link."""
    r = _two_socket_host()
    real = nic_names(r)
    devices = node(build_cluster([r])).devices
    assert [real[d.nic] for d in devices] == ["mlx5_0", "mlx5_0", "mlx5_1", "mlx5_1"]


def _netdevs(root: Path, ports: dict[str, tuple[str, str, bool]]) -> Path:
    """Ethernet netdevs ``name -> (speed Mb/s, operstate, physical)`` under ``root``/sys."""
    for k, (name, (speed, oper, physical)) in enumerate(ports.items()):
        d = root / "sys/class/net" / name
        d.mkdir(parents=True)
        for f, v in (("type", "1"), ("speed", speed), ("operstate", oper)):
            (d / f).write_text(v + "\n")
        if physical:
            dev = root / f"sys/devices/pci0000:00/0000:00:0{k + 1}.0/0000:0{k + 1}:00.0"
            dev.mkdir(parents=True)
            (d / "device").symlink_to(dev)
    return root


def _cpu_nics(root: Path) -> list[tuple[str, float]]:
    c = build_cluster([describe_host(root, nvml=False, use_smi=False, hostname="box")])
    return [(s.name, s.rate) for s in node(c).switches if s.kind == "nic"]


def test_a_management_port_at_a_tenth_of_the_data_port_is_left_out(tmp_path):
    """A 10 GbE port beside a 100 GbE one is management, not a peer: the node has one NIC at 100 Gb/s."""
    root = _netdevs(tmp_path, {"ens1f0": ("100000", "up", True), "eno1": ("10000", "up", True)})
    assert _cpu_nics(root) == [("nic0", 100e9 / 8)]


def test_a_virtual_interfaces_speed_is_a_placeholder(tmp_path):
    """In a container the only interface is virtual (a veth reports whatever speed it was given): the NIC gets the
    10 Gb/s placeholder, not the 25,000 Mb/s the veth reports."""
    root = _netdevs(tmp_path, {"eth0": ("25000", "up", False)})
    query = "\n".join(f"{i}, NVIDIA L20, 46068, 00000000:{0x1a + i:02X}:00.0" for i in range(8))
    c = build_cluster([describe_host(root, nvml=False, smi=fake_smi("l20-8-pcie", query))])
    rates = {s.rate for s in node(c).switches if s.kind == "nic"}
    assert rates == {10e9 / 8}


def test_an_unknown_operstate_is_up(tmp_path):
    """Some drivers never report carrier: operstate ``unknown`` with a speed is a working port."""
    root = _netdevs(tmp_path, {"eth0": ("25000", "unknown", True)})
    (nic,) = read_nics(root)
    assert nic.up and nic.rate == 25000e6 / 8


def test_a_pinned_interface_list_pins_its_first_interface():
    """NCCL_SOCKET_IFNAME=eth0,eth1 (a list): the interface sockets use first is eth0; an exclusion list pins none."""
    assert socket_ifname({"NCCL_SOCKET_IFNAME": "eth0,eth1"}) == "eth0"
    assert socket_ifname({"GLOO_SOCKET_IFNAME": "=ib0,eth0", "NCCL_SOCKET_IFNAME": "eth1"}) == "ib0"
    assert socket_ifname({"NCCL_SOCKET_IFNAME": "^docker0,lo"}) == ""


def test_cuda_visible_devices_stops_at_the_first_invalid_entry():
    """CUDA makes visible the devices listed before the first invalid index: ``0,9,1`` on an 8-GPU host is GPU 0
    alone."""
    r = describe_host(SYSFS / "ib-ndr", nvml=dgx_h100_nvml(), smi=fake_smi("dgx-h100"))
    assert visible_gpus(r, {"CUDA_VISIBLE_DEVICES": "0,9,1"}) == [0]
    assert visible_gpus(r, {"CUDA_VISIBLE_DEVICES": "3,1"}) == [3, 1]
