"""The presets' default cost parameters: what `sp-plan plan` prices with before a cluster is tuned.

Every term comes from a kernel or link measurement or from first principles, never from the papers' tables
(benchmarks/bench_fidelity.py judges them against those): attention efficiency curves by block length
(profiles/kernels.yaml), achieved device-memory bandwidth for the memory-bound passes, a fixed cost per ring
round, collective efficiencies per fabric, and imperfect overlap. `sp-plan tune` replaces any of them.
"""
from __future__ import annotations

import math
import re
from functools import lru_cache
from pathlib import Path

from sp_plan.planner.cluster import NET, Cluster
from sp_plan.planner.params import CommFit, Curve, Params
from sp_plan.planner.yamlio import yaml_load

DATA = Path(__file__).parent / "kernels.yaml"

#: a streaming device-to-device copy reaches ~85 % of the datasheet bandwidth (BabelStream copy on A100/H100)
COPY_EFFICIENCY = 0.85
#: PyTorch eager dispatch + CUDA launch of one small op, ~5 us (CPU-bound launch rate of eager PyTorch)
OP_LAUNCH_S = 5e-6
#: ops of one ring round besides the attention kernel: the out/LSE merge (ring-flash-attention
#: update_out_and_lse: sub, sigmoid, mul, add, logsigmoid, neg) and the send/recv launch
ROUND_OPS = 7
#: stream synchronisation with the communication stream once per round (event record + wait), ~10 us
ROUND_SYNC_S = 10e-6
#: a double-buffered round's send and receive run as NCCL kernels beside the attention kernel: one CTA per
#: channel, 2 channels per peer (NCCL's default for point-to-point), so 4 SMs are lost to the compute while
#: they run; the exposed share of the shorter side is 4 / SMs (overlap = 1 - 4 / SMs)
NCCL_P2P_CTAS = 4
#: the overlap when the device's SM count is unknown
OVERLAP = 0.95
#: achieved / link rate of large transfers per fabric (the link model's capacities are per direction):
#: PCIe P2P writes reach ~89 % of the x16 rate (CUDA p2pBandwidthLatencyTest, 56 of 63 GB/s, Gen5, public
#: rtx6kpro pcie-bandwidth notes); InfiniBand / RoCE ~96 % (nccl-tests: 48-49 of 50 GB/s per ConnectX-7 NDR
#: NIC, NVIDIA/nccl-tests#267). NVLink / NVSwitch, HCCS, shared memory and TCP Ethernet: no public figure
#: per collective kind at hand (an all_reduce busbw says nothing of all-to-all or send/recv), left at the
#: presets' rates until `profile links` measures them.
FABRIC_EFFICIENCY = {"pcie": 0.89, "ib": 0.96, "roce": 0.96}
#: an all-to-all whose busiest link is the CPU's (link class "host": PCIe into a host bridge, the socket link) on a
#: PCIe box: "CPUs make very poor PCI switches and A2A performance is bad when P2P is used across CPUs" (NCCL's
#: maintainers, NVIDIA/nccl#1603: 4 x RTX 4090, PCIe Gen4 x16 to one CPU, no switch, nccl-tests alltoall busbw
#: 2 GB/s where the link model gives the 32 GB/s of a GPU's link; all_reduce on the same box 22); "A2A performance
#: of most CPU interconnects falls drastically under load" (NVIDIA/nccl#1163). Other kinds on those links keep
#: the fabric's figure (all_reduce busbw 22 of 32 there: PCIe's 0.89 is the nearer public figure)
HOST_A2A_EFFICIENCY = 2.0 / 32.0
PATTERN_CLASSES = ("p2p", "p2p_bidir", "all_gather", "reduce_scatter", "all_reduce", "all_to_all")


@lru_cache(maxsize=1)
def kernel_data() -> dict:
    """profiles/kernels.yaml, parsed once."""
    return yaml_load(DATA.read_text())


def device_key(model: str, keys) -> str | None:
    """The longest of ``keys`` that starts the device model at a word boundary, vendor name dropped
    (``H100`` for ``H100-SXM5-80GB`` and ``NVIDIA H100 80GB HBM3``; ``A10`` not for ``A100``)."""
    name = re.sub(r"^(NVIDIA|Huawei)[ _-]+", "", model.strip())
    hits = [k for k in keys if name.startswith(k) and (len(name) == len(k) or not name[len(k)].isalnum())]
    return max(hits, key=len) if hits else None


def _match(table: dict, model: str) -> dict | None:
    """The entry of ``table`` for the device model (``device_key``), or None."""
    key = device_key(model, table)
    return table[key] if key else None


def measured_curves(key: str) -> tuple[Curve, Curve]:
    """(forward, backward) efficiency curves of a measured table of profiles/kernels.yaml; backward = 2.5 F over the
    forward + backward time less the forward time (the tables count backward as 2.5 x forward)."""
    h = kernel_data()["attention"][key]
    peak = h["peak_flops"] / 1e12
    fwd, bwd = [], []
    for s, f, fb in zip(h["seq"], h["fwd_tflops"], h["fwd_bwd_tflops"]):
        fwd.append((s, f / peak))
        bwd.append((s, 2.5 / (3.5 / fb - 1.0 / f) / peak))
    return Curve(points=tuple(fwd)), Curve(points=tuple(bwd))


def kernel_names() -> list[str]:
    """The published kernels of profiles/kernels.yaml (``kernels:``), by name."""
    return list(kernel_data().get("kernels", {}))


def kernel_curves(name: str) -> tuple[Curve, Curve]:
    """(forward, backward) efficiency curves of a published kernel of profiles/kernels.yaml (``kernels:``), its
    backward figures counted alone (2.5 x the forward's FLOPs over the backward's time)."""
    known = kernel_data().get("kernels", {})
    if name not in known:
        raise ValueError(f"kernel {name!r}: not a published kernel of profiles/kernels.yaml; one of {sorted(known)}")
    h = known[name]
    peak = h["peak_flops"] / 1e12
    fwd = tuple((s, f / peak) for s, f in zip(h["seq"], h["fwd_tflops"]))
    bwd = tuple((s, b / peak) for s, b in zip(h["seq"], h["bwd_tflops"]))
    return Curve(points=fwd), Curve(points=bwd)


def h100_curves() -> tuple[Curve, Curve]:
    """(forward, backward) efficiency curves of the measured H100 table: the shape other devices borrow."""
    return measured_curves("H100")


def attention_plateaus(model: str, plateau: float) -> tuple[float, float]:
    """(forward, backward) plateau efficiency, where ``attention_curves`` puts the H100 curve's 16k-token level: the
    published figures of profiles/kernels.yaml for the device (FlashAttention-2's at 16k for A100-class), else
    the preset's ``attn_efficiency`` (``plateau``) for both."""
    pub = _match({k: v for k, v in kernel_data()["attention"].items() if "fwd_plateau" in v}, model)
    return (pub["fwd_plateau"], pub["bwd_plateau"]) if pub else (plateau, plateau)


def attention_curves(model: str, plateau: float, peak: float) -> tuple[Curve, Curve]:
    """The device's (forward, backward) curves: its measured table if it has one (H100, H200); else the H100's
    shape, its 16k-token efficiency moved to the device's plateau (``attention_plateaus``) and its sizes shrunk by
    sqrt(H100 plateau FLOP/s / this device's): what makes short blocks slow (fixed per-call costs, the last
    partial wave) is time, so a block reaches a given fraction of the plateau when its plateau-rate time
    does, and a block's FLOPs grow as its length squared."""
    measured = device_key(model, [k for k, v in kernel_data()["attention"].items() if "fwd_tflops" in v])
    if measured:
        return measured_curves(measured)
    fwd, bwd = h100_curves()
    h100 = kernel_data()["attention"]["H100"]["peak_flops"]
    out = []
    for c, level in zip((fwd, bwd), attention_plateaus(model, plateau)):
        top = c.at(16384)
        k = math.sqrt(h100 * top / (peak * level))
        out.append(Curve(points=tuple((s / k, e * level / top) for s, e in c.points)))
    return out[0], out[1]


def fabric_kinds(cluster: Cluster) -> tuple[str | None, str | None]:
    """(intra-node fabric, network) link kinds of node 0: the device-side link kind and the NIC-to-net kind."""
    node = cluster.node_type(0)
    devs = {d.name for d in node.devices}
    intra = next((l.kind for l in node.links if l.src in devs or l.dst in devs), None)
    net = next((l.kind for l in node.links if NET in (l.src, l.dst)), None)
    return intra, net


def comm_defaults(cluster: Cluster) -> dict[str, CommFit]:
    """CommFits per pattern class for the cluster's intra-node fabric and network (FABRIC_EFFICIENCY), and on a
    PCIe box the all-to-all through the CPU (HOST_A2A_EFFICIENCY)."""
    out = {}
    for link_class, kind in zip(("intra", "inter"), fabric_kinds(cluster)):
        eff = FABRIC_EFFICIENCY.get(kind)
        if eff is not None:
            out.update({f"{p}/{link_class}": CommFit(efficiency=eff) for p in PATTERN_CLASSES})
        if link_class == "intra" and kind == "pcie":
            out["all_to_all/host"] = CommFit(efficiency=HOST_A2A_EFFICIENCY)
    return out


def hbm_figure(model: str) -> dict | None:
    """The device's datasheet memory figures in profiles/kernels.yaml (``bandwidth`` bytes/s, ``sms``), or None."""
    return _match(kernel_data()["hbm"], model)


def default_params(cluster: Cluster) -> Params:
    """The uncalibrated model's parameters for ``cluster`` (neutral Params for CPU ranks: no kernel data)."""
    dev = cluster.device(0)
    if dev.kind == "cpu":
        return Params()
    dtype = "bf16" if "bf16" in dev.peak_flops else next(iter(dev.peak_flops))
    fwd, bwd = attention_curves(dev.model, dev.attn_efficiency, dev.peak_flops[dtype])
    hbm = hbm_figure(dev.model)
    overlap = 1.0 - NCCL_P2P_CTAS / hbm["sms"] if hbm else OVERLAP
    return Params(attention_fwd=fwd, attention_bwd=bwd, comm=comm_defaults(cluster), overlap=overlap,
                  round_overhead_s=ROUND_OPS * OP_LAUNCH_S + ROUND_SYNC_S,
                  hbm_bandwidth=hbm["bandwidth"] * COPY_EFFICIENCY if hbm else None)
