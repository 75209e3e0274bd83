"""Discovery on recorded fixtures: `nvidia-smi topo -m` outputs, fake sysfs trees, a mocked NVML."""
from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from sp_plan.cli.app import app
from sp_plan.pipeline import PlanResponse
from sp_plan.planner.cluster import NET, Cluster
from sp_plan.profiles.discover import build_cluster, describe_host, nic_names, parse_topo
from sp_plan.profiles.discover.calibrate import Sample, apply_fits, bus_factor, fit_alpha_beta, fit_samples
from sp_plan.profiles.discover.report import RankInfo
from sp_plan.profiles.discover.sysfs import norm_bdf, pci_level, pci_of, read_gpus, read_nics
from sp_plan.planner.errors import PlanError

FIX = Path(__file__).parent / "fixtures"
TOPO = FIX / "topo"
SYSFS = FIX / "sysfs"


def topo(name: str) -> str:
    return (TOPO / f"{name}.txt").read_text()


# ---------------------------------------------------------------- a mocked NVML (pynvml's API subset)
class NVMLError(Exception):
    pass


class FakeNvml:
    """pynvml as discovery calls it; GPUs given as dicts (bus, name, mem, numa, links: remote bus per link)."""

    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 18
    NVML_P2P_CAPS_INDEX_READ = 0
    NVML_P2P_STATUS_OK = 0
    NVMLError = NVMLError

    def __init__(self, gpus, ancestor, speed_mbps, per_link_fields=True, fail_init=False, p2p_ok=True, switches=()):
        self.gpus, self.ancestor, self.speed = gpus, ancestor, speed_mbps
        self.per_link, self.fail_init, self.p2p_ok, self.switches = per_link_fields, fail_init, p2p_ok, set(switches)

    def nvmlInit(self):
        if self.fail_init:
            raise NVMLError("Driver Not Loaded")

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetPciInfo(self, h):
        b = self.gpus[h]["bus"]
        return SimpleNamespace(busId=f"0000{b.upper()}".encode())  # NVML's 00000000:1B:00.0 form

    def nvmlDeviceGetName(self, h):
        return self.gpus[h]["name"]

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h:08d}-fake"

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=self.gpus[h]["mem"])

    def nvmlDeviceGetNumaNodeId(self, h):
        return self.gpus[h]["numa"]

    def nvmlDeviceGetMigMode(self, h):
        mig = self.gpus[h].get("mig", 0)
        return [mig, mig]  # (current, pending)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self.gpus[h].get("gen", 5)

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return 16

    def nvmlDeviceGetNvLinkState(self, h, link):
        if link >= len(self.gpus[h]["links"]):
            raise NVMLError("Not Supported")
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        return SimpleNamespace(busId=f"0000{self.gpus[h]['links'][link].upper()}".encode())

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):
        return 2 if self.gpus[h]["links"][link] in self.switches else 0

    def nvmlDeviceGetFieldValues(self, h, ids):
        out = []
        for fid in ids:
            fid_n, scope = fid if isinstance(fid, tuple) else (fid, None)
            ok = (fid_n == 90) or (self.per_link and (84 <= fid_n <= 89 or 132 <= fid_n <= 137 or fid_n == 164))
            out.append(SimpleNamespace(nvmlReturn=0 if ok else 3, valueType=1, value=SimpleNamespace(uiVal=self.speed)))
        return out

    def nvmlDeviceGetP2PStatus(self, a, b, idx):
        return 0 if self.p2p_ok else 4

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        return self.ancestor(a, b)


H100_BUS = ["0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0",
            "0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0"]
NVSW = [f"0000:0{i}:00.0" for i in range(5, 9)]  # the four NVSwitch chips


def dgx_h100_nvml(**kw) -> FakeNvml:
    gpus = [{"bus": b, "name": "NVIDIA H100 80GB HBM3", "mem": 81559 * 2**20, "numa": i // 4,
             "links": [NVSW[k % 4] for k in range(18)]} for i, b in enumerate(H100_BUS)]
    return FakeNvml(gpus, lambda a, b: 40 if a // 4 == b // 4 else 50, 26562, switches=NVSW, **kw)


def dgx_a100_nvml() -> FakeNvml:
    gpus = [{"bus": f"0000:{b}:00.0", "name": "NVIDIA A100-SXM4-80GB", "mem": 81920 * 2**20, "numa": n, "gen": 4,
             "links": [f"0000:c{4 + k % 6}:00.0" for k in range(12)]}
            for b, n in zip(["07", "0f", "47", "4e", "87", "90", "b7", "bd"], [3, 3, 1, 1, 7, 7, 5, 5])]
    return FakeNvml(gpus, lambda a, b: 20 if a // 2 == b // 2 else 50, 25000, per_link_fields=False,
                    switches=[f"0000:c{4 + k}:00.0" for k in range(6)])


def h100_pair_nvml(**kw) -> FakeNvml:
    bus = ["0000:17:00.0", "0000:ca:00.0"]
    gpus = [{"bus": bus[i], "name": "NVIDIA H100 PCIe", "mem": 81559 * 2**20, "numa": i, "links": [bus[1 - i]] * 12}
            for i in range(2)]
    return FakeNvml(gpus, lambda a, b: 50, 26562, **kw)


def fake_smi(topo_name: str | None, query: str | None = None):
    """An nvidia-smi that prints a recorded topo -m and, optionally, a --query-gpu CSV."""
    def smi(*args):
        if args[:2] == ("topo", "-m"):
            return (topo(topo_name), "") if topo_name else (None, "nvidia-smi not found on PATH")
        return (query, "") if query else (None, "not recorded")
    return smi


def node(cluster: Cluster, k: int = 0):
    return cluster.node_type(k)


def links(nt, kind=None, src=None, dst=None):
    return [l for l in nt.links if (kind is None or l.kind == kind) and (src is None or l.src == src)
            and (dst is None or l.dst == dst)]


# ---------------------------------------------------------------- topo -m parser
@pytest.mark.parametrize("name,gpus,nics,cell", [
    ("dgx-h100", 8, 12, ("GPU0", "GPU7", "NV18")),
    ("dgx-a100", 8, 10, ("GPU0", "mlx5_0", "PXB")),
    ("l20-8-pcie", 8, 0, ("GPU0", "GPU4", "SYS")),
    ("a10-4-pcie", 4, 0, ("GPU0", "GPU2", "PXB")),
    ("h100-pcie-nvlink-pair", 2, 2, ("GPU0", "GPU1", "NV12")),
])
def test_topo_fixtures_parse(name, gpus, nics, cell):
    t = parse_topo(topo(name))
    assert len(t.gpus) == gpus and len(t.nics) == nics
    a, b, v = cell
    assert t.cells[(a, b)] == v and t.cells[(b, a)] == v
    assert all(lbl in t.cpu_affinity for lbl in t.gpus)
    assert all(t.numa[lbl] is not None for lbl in t.gpus)
    spaced = parse_topo(topo(name).replace("\t", "    "))  # as pasted in issues: spaces instead of tabs
    assert spaced.cells == t.cells and spaced.nics == t.nics


def test_topo_details():
    t = parse_topo(topo("dgx-h100"))
    assert t.nics[0] == "mlx5_0" and t.nics[11] == "mlx5_11"  # NIC# names through the NIC legend
    assert t.nvlinks("GPU3", "GPU4") == 18 and t.pcie("GPU3", "GPU4") is None
    assert t.pcie("GPU1", "mlx5_3") == "PXB" and t.pcie("mlx5_1", "mlx5_2") == "PIX"
    assert t.numa["GPU5"] == 1 and t.cpu_affinity["GPU0"] == "0-55,112-167"
    a = parse_topo(topo("dgx-a100"))  # older format: no "GPU NUMA ID" column
    assert [a.numa[f"GPU{i}"] for i in range(8)] == [3, 3, 1, 1, 7, 7, 5, 5]


def test_topo_rejects_garbage():
    with pytest.raises(PlanError, match="GPU0"):
        parse_topo("No devices were found\n")
    with pytest.raises(PlanError, match="cells"):
        parse_topo("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV4\nGPU1\n")


# ---------------------------------------------------------------- sysfs
def test_sysfs_infiniband_ndr():
    nics = {n.name: n for n in read_nics(SYSFS / "ib-ndr")}
    ib = [n for n in nics.values() if n.kind == "ib"]
    assert len(ib) == 8 and all(n.rate == 50e9 and n.up for n in ib)
    assert nics["mlx5_0"].netdev == "ibp24s0"
    assert nics["mlx5_1"].kind == "roce" and nics["mlx5_1"].rate == 25e9
    assert not nics["mlx5_7"].up and nics["eno3"].rate == 1.25e9 and nics["eno3"].physical
    assert not nics["docker0"].physical
    gpus = read_gpus(SYSFS / "ib-ndr")  # the NVSwitch bridge is not a GPU
    assert [g.bdf for g in gpus] == H100_BUS
    g0, g4 = gpus[0].pci, gpus[4].pci
    assert pci_level(g0, nics["mlx5_0"].pci) == "PXB" and pci_level(g0, nics["mlx5_3"].pci) == "NODE"
    assert pci_level(g0, g4) == "SYS" and pci_level(nics["mlx5_1"].pci, nics["mlx5_2"].pci) == "PIX"
    assert g0.gen == 5 and g0.width == 16 and g0.numa == 0


def test_sysfs_roce_and_ethernet():
    roce = {n.name: n for n in read_nics(SYSFS / "roce")}
    assert roce["mlx5_0"].kind == "roce" and roce["mlx5_0"].rate == 12.5e9 and roce["mlx5_0"].netdev == "enp49s0f0np0"
    eth = {n.name: n for n in read_nics(SYSFS / "eth100")}
    assert eth["ens1f0"].kind == "ethernet" and eth["ens1f0"].rate == 12.5e9 and eth["ens1f0"].up
    assert not eth["ens1f1"].up and not eth["veth3f2a1b0"].physical and "lo" not in eth
    assert norm_bdf("00000000:1B:00.0") == "0000:1b:00.0"
    assert pci_of(SYSFS / "eth100", "0000:1a:00.0").numa == 0


# ---------------------------------------------------------------- expected graphs
def test_dgx_h100_nvml_topo_ndr():
    r = describe_host(SYSFS / "ib-ndr", nvml=dgx_h100_nvml(), smi=fake_smi("dgx-h100"), hostname="dgx")
    assert r.sources["nvml"].startswith("ok") and r.sources["topo"].startswith("ok")
    c = build_cluster([r])
    nt = node(c)
    assert [d.model for d in nt.devices] == ["H100-SXM5-80GB"] * 8
    assert nt.devices[0].peak_flops["bf16"] == 989e12 and nt.devices[0].memory_bytes == 81559 * 2**20
    sw = links(nt, "nvswitch")
    assert len(sw) == 8 and all(l.capacity == pytest.approx(18 * 26562e6) for l in sw)  # 18 links x NVML speed
    nics = [s for s in nt.switches if s.kind == "nic"]
    assert len(nics) == 8 and all(s.rate == 50e9 and s.network == "ib" for s in nics)
    assert [d.nic for d in nt.devices] == [f"nic{i}" for i in range(8)]  # rail-optimized: one NIC per GPU
    assert "nic1=mlx5_3" in c.source and "nic7=mlx5_11" in c.source  # the provenance line, for people
    assert nic_names(r)["nic1"] == "mlx5_3" and nic_names(r)["nic7"] == "mlx5_11"  # the same, as data
    assert len(links(nt, "ib", dst=NET)) == 8
    assert {s.name for s in nt.switches if s.kind == "host_bridge"} == {"cpu0", "cpu1"}
    home = {l.src: l.dst for l in links(nt, "pcie") if l.src.startswith(("gpu", "nic"))}
    assert home["gpu0"] == home["nic0"] != home["gpu1"]  # GPU and its NIC share a PCIe tree
    assert all(l.capacity == 64e9 for l in links(nt, "pcie"))  # gen 5 x16
    assert not [w for w in c.warnings if "NVLink" in w or "topo -m says" in w]  # the three sources agree
    assert any("mlx5_7" in w and "not active" in w for w in c.warnings)
    two = Cluster.model_validate(c.model_dump() | {"nodes": c.nodes * 2, "network": "ib"})
    assert two.world_size == 16


def test_dgx_h100_topo_only_infers_nvswitch():
    r = describe_host(SYSFS / "ib-ndr", nvml=False, smi=fake_smi("dgx-h100"))
    c = build_cluster([r])
    assert "inferred" in r.sources["nvswitch"]
    assert all(l.capacity == 18 * 25e9 for l in links(node(c), "nvswitch"))  # default per-link speed
    assert any("NVML not used" in w for w in c.warnings)
    assert [d.nic for d in node(c).devices] == [f"nic{i}" for i in range(8)]


def test_dgx_a100_nvml_and_topo_without_sysfs(tmp_path):
    r = describe_host(tmp_path, nvml=dgx_a100_nvml(), smi=fake_smi("dgx-a100"))
    c = build_cluster([r])
    nt = node(c)
    assert [d.model for d in nt.devices] == ["A100-SXM4-80GB"] * 8
    assert all(l.capacity == 12 * 25000e6 for l in links(nt, "nvswitch"))  # COMMON speed field (old driver)
    nics = [s for s in nt.switches if s.kind == "nic"]
    assert len(nics) == 8 and all(s.network == "ib" for s in nics)  # storage mlx5_8/9 left out
    assert [d.nic for d in nt.devices] == [f"nic{i}" for i in range(8)]  # two NICs per GPU pair, spread
    assert len([s for s in nt.switches if s.kind == "host_bridge"]) == 4  # NPS4: four NUMA nodes
    assert any("not in /sys/class/infiniband" in w for w in c.warnings)
    assert any("mlx5_8" in w and "left out" in w for w in c.warnings)


def test_l20_pcie_server_on_100gbe():
    query = "\n".join(f"{i}, NVIDIA L20, 46068, 00000000:{b}:00.0" for i, b in
                      enumerate(["1A", "1B", "1C", "1D", "9A", "9B", "9C", "9D"]))
    r = describe_host(SYSFS / "eth100", nvml=False, smi=fake_smi("l20-8-pcie", query))
    c = build_cluster([r])
    nt = node(c)
    assert [d.model for d in nt.devices] == ["L20-48GB"] * 8 and nt.devices[0].peak_flops["bf16"] == 119.5e12
    assert not links(nt, "nvlink") and not links(nt, "nvswitch")
    home = {l.src: l.dst for l in links(nt, "pcie")}
    assert len({home[f"gpu{i}"] for i in range(4)}) == 1 and home["gpu0"] != home["gpu4"]  # a switch per socket
    assert home[home["gpu0"]] == "cpu0" and home[home["gpu4"]] == "cpu1" and home["nic0"] == "cpu0"
    assert links(nt, "smp")
    assert [s.rate for s in nt.switches if s.kind == "nic"] == [12.5e9] and "nic0=ens1f0" in c.source
    assert nic_names(r) == {"nic0": "ens1f0"}
    assert all(d.nic == "nic0" for d in nt.devices)
    assert any("eno1" in w and "left out" in w for w in c.warnings)


def test_a10_four_gpus_topo_only(tmp_path):
    r = describe_host(tmp_path, nvml=False, smi=fake_smi("a10-4-pcie"))
    nt = node(build_cluster([r]))
    home = {l.src: l.dst for l in links(nt, "pcie")}
    assert home["gpu0"] == home["gpu1"] != home["gpu2"] == home["gpu3"]  # PIX pairs
    assert home[home["gpu0"]] == home[home["gpu2"]] == "pcie_root0" and home["pcie_root0"] == "cpu0"  # PXB


def test_h100_pair_nvlink_bridge_on_roce():
    r = describe_host(SYSFS / "roce", nvml=h100_pair_nvml(), smi=fake_smi("h100-pcie-nvlink-pair"))
    c = build_cluster([r])
    nt = node(c)
    assert [d.model for d in nt.devices] == ["H100-PCIe-80GB"] * 2
    (nv,) = links(nt, "nvlink")
    assert (nv.src, nv.dst) == ("gpu0", "gpu1") and nv.capacity == pytest.approx(12 * 26562e6)
    assert [s.network for s in nt.switches if s.kind == "nic"] == ["roce", "roce"]
    assert [d.nic for d in nt.devices] == ["nic0", "nic1"]
    assert not [w for w in c.warnings if "NVLink" in w]


# ---------------------------------------------------------------- cross-checks and fallbacks
def test_nvml_nvlink_missing_from_topo_is_a_warning():
    text = topo("h100-pcie-nvlink-pair").replace("NV12", "SYS")
    smi = lambda *a: (text, "") if a[:2] == ("topo", "-m") else (None, "")  # noqa: E731
    c = build_cluster([describe_host(SYSFS / "roce", nvml=h100_pair_nvml(), smi=smi)])
    assert any("NVML sees 12 active NVLink(s) between GPU0 and GPU1" in w for w in c.warnings)
    assert links(node(c), "nvlink")  # NVML wins; the contradiction is kept in Cluster.warnings


def test_a_gpu_partitioned_by_mig_is_a_warning_naming_it():
    nvml = dgx_h100_nvml()
    nvml.gpus[3]["mig"] = 1
    c = build_cluster([describe_host(SYSFS / "ib-ndr", nvml=nvml, smi=fake_smi("dgx-h100"))])
    mig = [w for w in c.warnings if "MIG" in w]
    assert len(mig) == 1 and "GPU3: MIG is enabled" in mig[0] and "memory_bytes and peak_flops" in mig[0]
    plain = build_cluster([describe_host(SYSFS / "ib-ndr", nvml=dgx_h100_nvml(), smi=fake_smi("dgx-h100"))])
    assert not any("MIG" in w for w in plain.warnings)


def test_slow_nic_is_reported_and_kept(tmp_path):
    root = tmp_path / "sys-root"
    shutil.copytree(SYSFS / "ib-ndr", root, symlinks=True)
    (root / "sys/class/infiniband/mlx5_4/ports/1/rate").write_text("200 Gb/sec (4X HDR)\n")
    c = build_cluster([describe_host(root, nvml=dgx_h100_nvml(), smi=fake_smi("dgx-h100"))])
    assert any("mlx5_4 (ib) runs at 200 Gb/s, below its peers (400 Gb/s)" in w for w in c.warnings)
    rates = [s.rate for s in node(c).switches if s.kind == "nic"]
    assert sorted(rates)[0] == 25e9 and rates.count(50e9) == 7


def test_topo_and_sysfs_disagree_on_nic_placement():
    text = topo("dgx-h100").replace("GPU0\t X \tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tPXB",
                                    "GPU0\t X \tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tPIX")
    smi = lambda *a: (text, "") if a[:2] == ("topo", "-m") else (None, "")  # noqa: E731
    r = describe_host(SYSFS / "ib-ndr", nvml=dgx_h100_nvml(), smi=smi)
    assert any("GPU0-mlx5_0: sysfs PCI path gives PXB, topo -m says PIX" in w for w in r.warnings)


@pytest.mark.parametrize("nvml", [dgx_h100_nvml(fail_init=True), None])
def test_nvml_missing_or_failing_falls_back(nvml, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` fails as if not installed
    r = describe_host(SYSFS / "ib-ndr", nvml=nvml, smi=fake_smi("dgx-h100"))
    assert r.sources["nvml"].startswith(("unavailable", "failed"))
    assert len(r.gpus) == 8 and r.gpus[0].pci_bus == H100_BUS[0]  # bus ids from sysfs, in bus order
    c = build_cluster([r])
    assert any("NVML not used" in w for w in c.warnings) and len(links(node(c), "nvswitch")) == 8


def test_p2p_disabled_is_a_warning():
    r = describe_host(SYSFS / "roce", nvml=h100_pair_nvml(p2p_ok=False), smi=fake_smi("h100-pcie-nvlink-pair"))
    assert any("P2P reads not supported between GPU0 and GPU1" in w for w in r.warnings)


def test_nothing_at_all_is_a_cpu_host(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal:       16000000 kB\n")
    r = describe_host(tmp_path, nvml=False, use_smi=False, hostname="box")
    assert not r.gpus and r.cpu.memory_bytes == 16000000 * 1024
    r.ranks = [RankInfo(rank=i, world_size=4, local_rank=i, local_world_size=4, node_rank=0, hostname="box")
               for i in range(4)]
    c = build_cluster([r])
    nt = node(c)
    assert [d.kind for d in nt.devices] == ["cpu"] * 4 and nt.devices[0].memory_bytes == 16000000 * 1024 / 4
    assert {l.kind for l in nt.links if NET not in (l.src, l.dst)} == {"shm"}
    assert any("placeholder" in w for w in c.warnings) and c.network == "none"
    cpu = [w for w in c.warnings if "CPU rank slots" in w]
    assert cpu and "`sp-plan tune`" in cpu[0]  # names the command that measures them, which exists
    from sp_plan.cli.app import app
    assert "tune" in {cmd.name for cmd in app.registered_commands}


# ---------------------------------------------------------------- several nodes
def _node(root, nvml, topo_name, node_rank, host, per_node=8, first=0):
    r = describe_host(root, nvml=nvml, smi=fake_smi(topo_name), hostname=host, node_rank=node_rank)
    r.ranks = [RankInfo(rank=first + i, world_size=16, local_rank=i, local_world_size=per_node, node_rank=node_rank,
                        hostname=host, gpu=i) for i in range(per_node)]
    return r


def test_two_dgx_nodes_make_one_ib_cluster():
    hosts = [_node(SYSFS / "ib-ndr", dgx_h100_nvml(), "dgx-h100", k, f"dgx{k}", first=8 * k) for k in (1, 0)]
    c = build_cluster(hosts)
    assert c.num_nodes == 2 and c.homogeneous and c.network == "ib" and c.world_size == 16
    assert c.warnings[0].startswith("node 0 (dgx0)")  # ordered by node rank
    assert not any("differ" in w for w in c.warnings)


def test_unlike_nodes_are_reported():
    a = _node(SYSFS / "ib-ndr", dgx_h100_nvml(), "dgx-h100", 0, "dgx")
    b = _node(SYSFS / "roce", h100_pair_nvml(), "h100-pcie-nvlink-pair", 1, "pair", per_node=2, first=8)
    c = build_cluster([a, b])
    assert c.network == "roce" and len(c.node_types) == 2
    assert any("nodes differ" in w for w in c.warnings) and any("different networks" in w for w in c.warnings)
    assert any("below its peers" in w and "node 1 (pair)" in w for w in c.warnings)


def test_ranks_on_a_subset_of_gpus():
    r = _node(SYSFS / "ib-ndr", dgx_h100_nvml(), "dgx-h100", 0, "dgx", per_node=2)
    nt = node(build_cluster([r]))
    assert len(nt.devices) == 2 and [d.nic for d in nt.devices] == ["nic0", "nic1"]
    assert len([s for s in nt.switches if s.kind == "nic"]) == 2  # only the rails these GPUs use


# ---------------------------------------------------------------- fits
def test_alpha_beta_fit_and_bus_factors():
    alpha, beta = 20e-6, 12.5e9
    x = [2.0**k for k in range(12, 26, 2)]
    a, b = fit_alpha_beta(x, [alpha + s / beta for s in x])
    assert a == pytest.approx(alpha, rel=1e-6) and b == pytest.approx(beta, rel=1e-6)
    assert bus_factor("all_gather", 8) == 7 / 8 and bus_factor("all_reduce", 4) == 1.5 and bus_factor("p2p", 2) == 1
    s = [Sample("inter:ib", "all_gather", 4, n, 1e-5 + n * 0.75 / 10e9) for n in (2**16, 2**20, 2**24)]
    (f,) = fit_samples(s + [Sample("inter:ib", "all_gather", 4, 2**28, None, "timeout")])
    assert f.busbw == pytest.approx(10e9, rel=1e-6) and f.points == 3


def test_apply_fits_scales_the_bottleneck_kind():
    r = describe_host(SYSFS / "eth100", nvml=False, smi=fake_smi("l20-8-pcie"))
    one = build_cluster([r])
    c = Cluster.model_validate(one.model_dump() | {"nodes": one.nodes * 2, "network": "ethernet"})
    from sp_plan.profiles.discover.calibrate import Fit
    fits = [Fit("inter:ethernet", "p2p", 2, 30e-6, 10e9, 9e9, 4), Fit("intra:pcie", "p2p", 2, 8e-6, 20e9, 19e9, 4)]
    new, applied = apply_fits(c, fits, {"inter:ethernet": (0, 8), "intra:pcie": (0, 1)})
    nt = node(new)
    assert applied["ethernet"]["scale"] == pytest.approx(10e9 / 12.5e9)
    assert links(nt, "ethernet")[0].capacity == pytest.approx(10e9)
    assert [s.rate for s in nt.switches if s.kind == "nic"] == [pytest.approx(10e9)]
    assert all(l.capacity == pytest.approx(20e9) for l in links(nt, "pcie"))  # 32 GB/s -> 20 GB/s everywhere


# ---------------------------------------------------------------- CLI
def test_cli_discover_alone_writes_the_cluster(tmp_path, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    out = tmp_path / "c.yaml"
    res = CliRunner().invoke(app, ["discover", "-o", str(out), "--no-nvml", "--topo-file", str(TOPO / "dgx-h100.txt"),
                                   "--sysfs-root", str(SYSFS / "ib-ndr")])
    assert res.exit_code == 0, res.output
    assert "nvswitch: 8 x 450 GB/s" in res.output and "nic0 = mlx5_0: ib" in res.output and "warnings" in res.output
    c = Cluster.load(out)
    assert c.world_size == 8 and c.warnings
    plan = CliRunner().invoke(app, ["plan", "--cluster", str(out), "--model", "gpt-3b", "--seq-len", "32k", "--top", "2",
                                    "--json"])
    assert plan.exit_code == 0, plan.output
    res = PlanResponse.model_validate_json(plan.stdout)  # the discovered cluster is the one planned for
    assert (res.cluster.fingerprint, res.cluster.world_size) == (c.fingerprint(), 8)
    assert res.winner.cluster_fingerprint == c.fingerprint()


def test_cli_bad_input_is_one_line_exit_2(tmp_path, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    bad = tmp_path / "topo.txt"
    bad.write_text("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")
    res = CliRunner().invoke(app, ["discover", "--topo-file", str(bad)])
    assert res.exit_code == 2 and "error" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(app, ["profile", "links"])
    assert res.exit_code == 2 and "torchrun" in res.output


def test_a_pinned_socket_interface_does_not_drop_the_rdma_ports_nccl_sends_over(monkeypatch):
    """NCCL_SOCKET_IFNAME pins NCCL's bootstrap socket (often the management port on an InfiniBand cluster); its data
    goes over the RDMA ports: they stay the node's NICs, with a warning. With NCCL_IB_DISABLE=1 NCCL sends over
    the socket, which is then the one NIC."""
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eno3")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    for disabled in ("0", "1"):
        monkeypatch.setenv("NCCL_IB_DISABLE", disabled)
        c = build_cluster([describe_host(SYSFS / "ib-ndr", nvml=dgx_h100_nvml(), smi=fake_smi("dgx-h100"))])
        nics = [s for s in node(c).switches if s.kind == "nic"]
        if disabled == "0":
            assert len(nics) == 8 and all(s.network == "ib" for s in nics)
            assert any("'eno3' carries NCCL's bootstrap only" in w for w in c.warnings)
        else:
            assert [s.network for s in nics] == ["ethernet"] and "nic0=eno3" in c.source


def test_without_nvml_a_known_models_nvlink_generation_prices_its_links():
    """NVML gives each NVLink's speed; without it the per-link speed is the model's NVLink generation where the spec
    table knows it (B200's NVLink 5: 50 GB/s per link and direction, 18 links: 900 GB/s), 25 GB/s otherwise."""
    from sp_plan.profiles.discover.specs import gpu_spec

    assert gpu_spec("NVIDIA B200").nvlink == 50e9 and gpu_spec("NVIDIA H100 80GB HBM3").nvlink == 25e9
    query = "\n".join(f"{i}, NVIDIA B200, 183359, 00000000:{0x10 + i:02X}:00.0" for i in range(8))
    r = describe_host(SYSFS / "ib-ndr", nvml=False, smi=fake_smi("dgx-h100", query))
    sw = links(node(build_cluster([r])), "nvswitch")
    assert len(sw) == 8 and all(l.capacity == 18 * 50e9 for l in sw), [l.capacity for l in sw]


def test_a_devices_pcie_link_trains_to_the_lesser_of_it_and_its_port(tmp_path):
    """Without NVML a device's PCIe generation and width come from sysfs: a Gen5 x16 card in a Gen4 x8 slot runs
    Gen4 x8 (it was priced at the card's own Gen5 x16); a faster port leaves the card's own."""
    from sp_plan.profiles.discover.sysfs import pci_device

    def tree(name: str, port: tuple[str, int], card: tuple[str, int]):
        root = tmp_path / name / "sys/devices/pci0000:00"
        for d, (speed, width) in ((root / "0000:00:01.0", port), (root / "0000:00:01.0/0000:01:00.0", card)):
            d.mkdir(parents=True, exist_ok=True)
            (d / "max_link_speed").write_text(f"{speed} PCIe\n")
            (d / "max_link_width").write_text(f"{width}\n")
        return pci_device(root / "0000:00:01.0/0000:01:00.0")

    slow = tree("slow", ("16.0 GT/s", 8), ("32.0 GT/s", 16))
    assert (slow.gen, slow.width) == (4, 8)
    fast = tree("fast", ("32.0 GT/s", 16), ("16.0 GT/s", 16))
    assert (fast.gen, fast.width) == (4, 16)


def test_nvlink_cells_do_not_put_each_gpu_on_a_socket_of_its_own():
    """A DGX-1V's hybrid cube mesh from `nvidia-smi topo -m` alone: NVLink cells (NV1, NV2) say nothing of PCIe, and
    filling them by the ultrametric rule with SYS (true of any pair) made eight host bridges and 28 SMP links; the
    NUMA column places GPUs 0-3 and 4-7 on the node's two sockets."""
    r = describe_host(SYSFS / "none", nvml=False, smi=fake_smi("dgx-1v"))
    nt = node(build_cluster([r]))
    home = {l.src: l.dst for l in links(nt, "pcie") if l.src.startswith("gpu")}
    assert home == {f"gpu{i}": f"cpu{i // 4}" for i in range(8)}
    assert len(links(nt, "smp")) == 1


@pytest.mark.parametrize("name, model, bf16", [
    ("NVIDIA A100-SXM4-80GB", "A100-SXM4", 312e12),
    ("NVIDIA A100 80GB PCIe", "A100-PCIe", 312e12),
    ("NVIDIA H200", "H200-SXM-141GB", 989e12),
    ("NVIDIA H200 NVL", "H200-NVL-141GB", 835e12),   # 1,671 TFLOP/s BF16 with sparsity
    ("NVIDIA GH200 480GB", "GH200", 989e12),
    ("NVIDIA H800 PCIe", "H800-PCIe-80GB", 756e12),  # 1,513 TFLOP/s BF16 with sparsity
    ("NVIDIA H800", "H800-SXM5-80GB", 989e12),
    ("NVIDIA A800 80GB PCIe", "A800-PCIe-80GB", 312e12),
])
def test_a_gpu_names_its_own_row_of_the_spec_table(name, model, bf16):
    """A name falls in the row of its own form factor (PCIe and NVL cards are slower than SXM), dense peaks."""
    from sp_plan.profiles.discover.specs import gpu_spec

    spec = gpu_spec(name)
    assert (spec.model, spec.bf16) == (model, bf16)


def test_a_name_that_only_contains_a_known_model_is_unknown():
    """An RTX A1000 is not an A100: an unknown GPU gets the placeholder peak and its own name, not a datasheet row."""
    from sp_plan.profiles.discover.specs import gpu_spec, model_name

    assert gpu_spec("NVIDIA RTX A1000") is None and gpu_spec("NVIDIA RTX A8000") is None
    assert model_name("NVIDIA RTX A1000", 8 * 2**30) == "RTX-A1000-8GB"


def test_pcie_capacity_doubles_each_generation_from_gen1():
    """x16 per direction: Gen1 4 GB/s, Gen2 8, Gen3 16 (15.75 rounded), ... Gen7 256; by lanes; Gen4 x16 unknown."""
    from sp_plan.profiles.discover.specs import pcie_capacity

    assert [pcie_capacity(g, 16) for g in range(1, 8)] == [4e9, 8e9, 16e9, 32e9, 64e9, 128e9, 256e9]
    assert pcie_capacity(2, 8) == 4e9 and pcie_capacity(None, None) == 32e9 and pcie_capacity(5, None) == 64e9


@pytest.mark.parametrize("name, model, fp16", [("Tesla V100-SXM2-32GB", "V100", 125e12),
                                               ("Tesla V100-PCIE-32GB", "V100-PCIe", 112e12),
                                               ("Tesla V100S-PCIE-32GB", "V100S", 130e12)])
def test_v100_form_factors_have_their_own_fp16_peaks(name, model, fp16):
    """The V100 has no bf16; its fp16 tensor peak is 125 TFLOP/s on SXM2, 112 on PCIe and 130 on the V100S."""
    from sp_plan.profiles.discover.specs import gpu_spec, peak_flops

    spec = gpu_spec(name)
    assert spec.model == model and peak_flops(spec)["fp16"] == fp16 and "bf16" not in peak_flops(spec)
