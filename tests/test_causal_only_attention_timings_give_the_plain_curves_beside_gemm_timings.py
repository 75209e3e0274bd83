"""A profile that timed attention under the causal mask only (older profiles) gives the plain attention curves, even
when it also timed GEMMs (never causal): the GEMM timings must not make the attention timings read as a dense/masked
split, which would file them under attention_*_masked and leave the plain curves unset."""
import pytest

from sp_plan.planner.calibration import kernel_curves
from sp_plan.planner.profile import KernelSample

PEAK = 1e12


def _attention(kind, seconds):
    flops = 4.0 * 256 * 256 * 4 * 16 / 2  # causal block
    return KernelSample(kind=kind, size=256, heads=4, head_dim=16, causal=True, flops=flops, seconds=seconds)


def test_causal_only_attention_with_gemms_fills_the_plain_curves():
    gemm_flops = 2.0 * 1024 * 4096 * 4096
    samples = [_attention("attention_fwd", 1e-4), _attention("attention_bwd", 2.5e-4),
               KernelSample(kind="matmul", size=1024, heads=1, head_dim=1, causal=False, flops=gemm_flops,
                            seconds=gemm_flops / (0.5 * PEAK), gemm=(1024, 4096, 4096))]
    curves = kernel_curves(samples, PEAK)
    assert set(curves) == {"attention_fwd", "attention_bwd", "matmul"}
    fwd = samples[0].flops / (1e-4 * PEAK)
    assert curves["attention_fwd"].points == ((256.0, pytest.approx(fwd)),)
    assert curves["matmul"].points == ((1024.0, pytest.approx(0.5)),)
