"""Published kernel curves (profiles/kernels.yaml ``kernels:``): FlashAttention-3's paper figures load with their
source, the estimate prices attention with them when a benchmark ran that kernel, and the presets' own curves stay
as they are."""
import pytest
from sp_plan.planner import Estimator, Workload
from sp_plan.profiles import load_cluster
from sp_plan.profiles.kernels import default_params, kernel_curves, kernel_data, kernel_names

H100_PEAK = 989.0


@pytest.fixture(scope="module")
def bf(script):
    return script("benchmarks/bench_fidelity.py")


def test_flash_attention_3_curve_is_the_papers_figures():
    """Forward 467-648 and backward-alone 316-561 TFLOP/s at 512-16k tokens (arXiv 2407.08608, Sec. 4.1's
    forward and backward figures, head dim 128, non-causal), as efficiencies of the H100's 989 TFLOP/s; flat past 16k."""
    assert "flash-attention-3" in kernel_names()
    fwd, bwd = kernel_curves("flash-attention-3")
    assert [x for x, _ in fwd.points] == [512, 1024, 2048, 4096, 8192, 16384]
    assert fwd.at(8192) == pytest.approx(646 / H100_PEAK) and fwd.at(16384) == pytest.approx(648 / H100_PEAK)
    assert bwd.at(512) == pytest.approx(316 / H100_PEAK) and bwd.at(16384) == pytest.approx(561 / H100_PEAK)
    assert fwd.at(65536) == fwd.at(16384)
    assert all(a[1] <= b[1] for a, b in zip(fwd.points, fwd.points[1:]))  # never falls with the length
    entry = kernel_data()["kernels"]["flash-attention-3"]
    assert entry["device"] == "H100" and all(part in entry["source"] for part in (
        "2407.08608", "Fig. 5", "Attention backward speed, head dim 128"))  # the figures named as the paper titles them


def test_unknown_kernel_names_the_field_and_the_known_ones():
    with pytest.raises(ValueError, match=r"kernel 'flash-attention-9'.*flash-attention-3"):
        kernel_curves("flash-attention-9")


def test_presets_h100_curve_is_unchanged():
    """The dgx-h100 preset keeps its measured SDPA-flash table (367 TFLOP/s at 8k, 346 at 32k): the published kernel
    is chosen per benchmark, not per device."""
    p = default_params(load_cluster("dgx-h100", 1))
    assert p.attention_fwd.at(8192) == pytest.approx(367 / H100_PEAK)
    assert p.attention_fwd.at(32768) == pytest.approx(346 / H100_PEAK)


def test_estimate_prices_attention_with_the_benchmarks_kernel(bf):
    """MagiAttention's setups take FlashAttention-3's curves: the estimator reads them at a block's length, and a
    dense 8k x 8k block's forward costs its FLOPs at 646 TFLOP/s (plus the round's fixed cost); ring-flash-attention
    (flash-attn 2) and ``--kernel presets`` keep the cluster's curve."""
    cl = load_cluster("dgx-h100", 1)
    base = default_params(cl)
    fa3 = bf.kernel_params(base, "magi_attention", "papers")
    assert fa3.attention_fwd == kernel_curves("flash-attention-3")[0]
    assert fa3.model_copy(update={"attention_fwd": base.attention_fwd, "attention_bwd": base.attention_bwd}) == base
    assert bf.kernel_params(base, "magi_attention", "presets") == base
    assert bf.kernel_params(base, "ring_flash_attention", "papers") == base
    model = bf.attention_layer(64, 8, 128, "t")
    work = Workload(seq_len=65536, causal=False, training=False)
    est, old = Estimator(cl, model, work, params=fa3), Estimator(cl, model, work, params=base)
    assert est.attention_efficiency(False, 8192) == pytest.approx(646 / H100_PEAK)
    assert est.attention_efficiency(True, 8192) == pytest.approx(559 / H100_PEAK)
    ring = bf.cp_plan("ring", "zigzag", 8)
    assert bf.pass_seconds(est, ring, "fwd") < 0.7 * bf.pass_seconds(old, ring, "fwd")


def test_magi_full_forward_ranked_as_measured_only_with_its_kernel(bf):
    """Full forward at CP 8: measured all-gather 607 > ring P2P 512 TFLOP/s. With FlashAttention-3's curve, which
    never falls with the length, the all-gather's one long call is as efficient as the ring's 8k blocks and the
    ring's merges and round costs put it behind; the presets' SDPA-flash table dips past 8k (367 -> 351 TFLOP/s at the
    all-gather's call) and ranks the ring first."""
    magi = bf.load_mask_truths()["magi_attention"]
    ran = bf.magi_setup(magi, "full", "fwd", 8)
    preset = bf.magi_setup(magi, "full", "fwd", 8, kernel="presets")
    assert bf.ranking(ran.layouts, ran.meas) == "ring_allgather > ring_p2p"
    assert bf.ranking(ran.layouts, ran.pred) == "ring_allgather > ring_p2p"
    assert bf.ranking(preset.layouts, preset.pred) == "ring_p2p > ring_allgather"
    assert all(0.9 < p / m < 1.25 for p, m in zip(ran.pred, ran.meas))  # dense levels within 25 % of measured
