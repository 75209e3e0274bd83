"""Datasheet figures for GPUs that discovery can name: dense peak FLOP/s, PCIe generation, NVLink per link."""
from __future__ import annotations

import re
from dataclasses import dataclass

NVLINK_LINK_BYTES = 25e9  # bytes/s per NVLink and direction, NVLink 2-4 (V100, A100, H100); used without NVML
PCIE_GEN1_X16 = 4e9  # bytes/s per direction of a Gen1 x16 link; each generation doubles it (Gen3 rounded)


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model's datasheet figures (dense, no sparsity)."""

    model: str
    bf16: float
    fp32: float
    pcie_gen: int
    fp16: float | None = None
    nvlink: float = NVLINK_LINK_BYTES  # bytes/s per NVLink and direction, where NVML gives none


# (pattern on NVML's name, spec). First match wins, so more specific names come first.
_SPECS: list[tuple[str, GpuSpec]] = [
    (r"H100.*(PCIe|PCIE)", GpuSpec("H100-PCIe-80GB", 756e12, 51e12, 5)),
    (r"H100 NVL", GpuSpec("H100-NVL-94GB", 835e12, 60e12, 5)),
    (r"H100", GpuSpec("H100-SXM5-80GB", 989e12, 67e12, 5)),
    (r"GH200", GpuSpec("GH200", 989e12, 67e12, 5)),  # the superchip's Hopper GPU: 96 or 144 GB
    (r"H200 NVL", GpuSpec("H200-NVL-141GB", 835e12, 60e12, 5)),
    (r"H200", GpuSpec("H200-SXM-141GB", 989e12, 67e12, 5)),
    (r"H800.*(PCIe|PCIE)", GpuSpec("H800-PCIe-80GB", 756e12, 51e12, 5)),
    (r"H800", GpuSpec("H800-SXM5-80GB", 989e12, 67e12, 5)),
    (r"H20\b", GpuSpec("H20-96GB", 148e12, 44e12, 5)),
    (r"A100.*(PCIe|PCIE)", GpuSpec("A100-PCIe", 312e12, 19.5e12, 4)),
    (r"A100\b", GpuSpec("A100-SXM4", 312e12, 19.5e12, 4)),  # not the RTX A1000
    (r"A800.*(PCIe|PCIE)", GpuSpec("A800-PCIe-80GB", 312e12, 19.5e12, 4)),
    (r"A800\b", GpuSpec("A800-SXM4-80GB", 312e12, 19.5e12, 4)),
    (r"L40S", GpuSpec("L40S-48GB", 362e12, 91.6e12, 4)),
    (r"L40\b", GpuSpec("L40-48GB", 181e12, 90.5e12, 4)),
    (r"L20\b", GpuSpec("L20-48GB", 119.5e12, 59.8e12, 4)),
    (r"L4\b", GpuSpec("L4-24GB", 121e12, 30.3e12, 4)),
    (r"A10\b", GpuSpec("A10-24GB", 125e12, 31.2e12, 4)),
    (r"A30\b", GpuSpec("A30-24GB", 165e12, 10.3e12, 4)),
    (r"A40\b", GpuSpec("A40-48GB", 149.7e12, 37.4e12, 4)),
    (r"RTX 4090", GpuSpec("RTX-4090-24GB", 165e12, 82.6e12, 4)),
    (r"V100S", GpuSpec("V100S", 0.0, 16.4e12, 3, fp16=130e12)),
    (r"V100.*(PCIe|PCIE)", GpuSpec("V100-PCIe", 0.0, 14e12, 3, fp16=112e12)),
    (r"V100", GpuSpec("V100", 0.0, 15.7e12, 3, fp16=125e12)),
    (r"B200", GpuSpec("B200-180GB", 2250e12, 80e12, 6, nvlink=50e9)),  # NVLink 5: 18 links, 1.8 TB/s both ways
]


def gpu_spec(name: str) -> GpuSpec | None:
    """The spec of an NVML/nvidia-smi GPU name (``NVIDIA H100 80GB HBM3``), or None if unknown."""
    for pat, spec in _SPECS:
        if re.search(pat, name):
            return spec
    return None


def model_name(name: str, memory_bytes: float) -> str:
    """A short model name: the spec's, with the memory actually present where the spec has none."""
    spec = gpu_spec(name)
    gb = round(memory_bytes / 2**30) if memory_bytes else 0  # NVML reports MiB: 81920 MiB is an 80 GB part
    if spec is None:
        base = re.sub(r"^(NVIDIA|Tesla)\s+", "", name).strip().replace(" ", "-") or "unknown-gpu"
        return f"{base}" if not gb or "GB" in base else f"{base}-{gb}GB"
    if re.search(r"\d+GB$", spec.model):
        return spec.model
    return f"{spec.model}-{gb}GB" if gb else spec.model


def peak_flops(spec: GpuSpec | None) -> dict[str, float]:
    """Peak dense FLOP/s per dtype for the Device model (placeholder 1e14 for unknown GPUs)."""
    if spec is None:
        return {"bf16": 1e14, "fp16": 1e14, "fp32": 1e13}
    out = {"fp32": spec.fp32, "fp16": spec.fp16 or spec.bf16}
    if spec.bf16:
        out["bf16"] = spec.bf16
    return out


def pcie_capacity(gen: int | None, width: int | None) -> float:
    """Bytes/s per direction of a PCIe link (gen 4 x16 when unknown): 4 GB/s x 2^(gen - 1) per 16 lanes."""
    per16 = PCIE_GEN1_X16 * 2 ** ((gen or 4) - 1)
    return per16 * (width or 16) / 16
