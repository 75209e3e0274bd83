"""What discovery says a GPU is: the datasheet figures of the model NVML or nvidia-smi names (dense BF16 peak per
model, so neighbouring names do not borrow each other's), and its memory in bytes from nvidia-smi's MiB."""
from __future__ import annotations

import pytest

from sp_plan.profiles.discover.specs import gpu_spec, peak_flops
from sp_plan.profiles.discover.topo import parse_query_gpu


@pytest.mark.parametrize("name,model,bf16", [
    ("NVIDIA L40", "L40-48GB", 181e12),  # datasheet: 362 TFLOPS BF16 with sparsity
    ("NVIDIA L40S", "L40S-48GB", 362e12),  # 733 with sparsity
    ("NVIDIA H100 NVL", "H100-NVL-94GB", 835e12),  # 1,671 with sparsity
    ("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB", 989e12),  # 1,979 with sparsity
    ("NVIDIA H100 PCIe", "H100-PCIe-80GB", 756e12),  # 1,513 with sparsity
])
def test_each_name_gets_its_own_models_dense_peak(name, model, bf16):
    spec = gpu_spec(name)
    assert spec.model == model and peak_flops(spec)["bf16"] == bf16


def test_nvidia_smi_memory_is_mib():
    """``--query-gpu=memory.total --format=csv,nounits`` prints MiB: 46068 is 46068 x 2^20 bytes."""
    (row,) = parse_query_gpu("0, NVIDIA L20, 46068, 00000000:1A:00.0")
    assert row["memory_bytes"] == 46068 * 1024 * 1024

