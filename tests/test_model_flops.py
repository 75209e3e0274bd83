"""Model FLOPs and MFU as a prediction reports them.

A step counts 2 FLOPs per weight per token over the blocks and the output head (the input embedding is a lookup),
plus 4 S^2 a d of attention per layer and sequence (a: query heads), half of it under a causal mask, all of it three
times to train (forward and a backward of twice its cost). A prediction turns its step time into tokens per second
(batch x sequence over the step) and MFU (model FLOPs over step x ranks x the device's datasheet peak, not the
calibrated one), and reports a second, full-causal MFU only where documents or a window mask the attention.
"""
from __future__ import annotations

import pytest

from sp_plan.planner import Candidate, Estimator, Workload
from sp_plan.planner.model import ModelSpec
from sp_plan.planner.params import Params
from sp_plan.profiles import load_cluster

# GQA, and heads x head_dim (8 x 96 = 768) unlike hidden (512): each size the count reads is a different number
MODEL = ModelSpec(layers=4, hidden=512, heads=8, kv_heads=2, head_dim=96, ffn_hidden=1024, gated_mlp=True,
                  vocab=1000)
#: one block's weights by hand: Q 512x768, K and V 512x192 each, O 768x512, three 512x1024 SwiGLU matrices
BLOCK = 512 * 768 + 2 * 512 * 192 + 768 * 512 + 3 * 512 * 1024
S, B = 4096, 2
LAYOUT = Candidate("usp", ulysses=8, order=("ulysses",))


def _dense(tokens: int) -> float:
    """2 per weight per token: 4 blocks and the 1000 x 512 output head."""
    return 2.0 * tokens * (4 * BLOCK + 1000 * 512)


def _attention(causal: bool) -> float:
    """4 S^2 x 8 query heads x 96 per layer and sequence, 4 layers, 2 sequences; half under a causal mask."""
    return 4.0 * S * S * 8 * 96 * 4 * B * (0.5 if causal else 1.0)


@pytest.fixture(scope="module")
def h100():
    return load_cluster("dgx-h100", 1)


def test_a_training_step_counts_blocks_head_and_causal_attention_three_times(h100):
    est = Estimator(h100, MODEL, Workload(seq_len=S, batch=B))
    assert est.model_flops() == pytest.approx(3 * (_dense(S * B) + _attention(causal=True)), rel=1e-12)


def test_inference_counts_the_forward_once(h100):
    est = Estimator(h100, MODEL, Workload(seq_len=S, batch=B, training=False))
    assert est.model_flops() == pytest.approx(_dense(S * B) + _attention(causal=True), rel=1e-12)


def test_attention_without_a_causal_mask_counts_every_pair(h100):
    causal = Estimator(h100, MODEL, Workload(seq_len=S, batch=B)).model_flops()
    full = Estimator(h100, MODEL, Workload(seq_len=S, batch=B, causal=False)).model_flops()
    assert full - causal == pytest.approx(3 * _attention(causal=True), rel=1e-9)


def test_mfu_and_tokens_per_second_come_from_the_step_time(h100):
    w = Workload(seq_len=S, batch=B)
    p = Estimator(h100, MODEL, w).predict(LAYOUT)
    peak = h100.device(0).peak_flops["bf16"]
    assert p.tokens_per_s == pytest.approx(S * B / p.step_time_s, rel=1e-12)
    assert p.mfu == pytest.approx(3 * (_dense(S * B) + _attention(True)) / (p.step_time_s * 8 * peak), rel=1e-12)
    assert p.mfu_causal is None


def test_mfu_is_over_the_datasheet_peak_whatever_the_calibrated_efficiency(h100):
    """A calibrated compute efficiency slows the step; MFU still divides by the device's datasheet peak."""
    w = Workload(seq_len=S, batch=B)
    p = Estimator(h100, MODEL, w, params=Params(compute_efficiency=0.5)).predict(LAYOUT)
    peak = h100.device(0).peak_flops["bf16"]
    assert p.mfu == pytest.approx(3 * (_dense(S * B) + _attention(True)) / (p.step_time_s * 8 * peak), rel=1e-12)


def test_documents_report_a_masked_mfu_and_the_full_causal_one(h100):
    """Four 1024-token documents a sequence attend a quarter of the causal pairs; mfu_causal counts them all."""
    w = Workload(seq_len=S, batch=B, documents=[1024])
    p = Estimator(h100, MODEL, w).predict(LAYOUT)
    peak = h100.device(0).peak_flops["bf16"]
    per_second = p.step_time_s * 8 * peak
    assert p.mfu_causal == pytest.approx(3 * (_dense(S * B) + _attention(True)) / per_second, rel=1e-12)
    assert p.mfu < p.mfu_causal


def test_a_window_covering_the_sequence_reports_one_mfu_as_without_it(h100):
    plain = Estimator(h100, MODEL, Workload(seq_len=S, batch=B)).predict(LAYOUT)
    covered = Estimator(h100, MODEL, Workload(seq_len=S, batch=B, window=2 * S)).predict(LAYOUT)
    assert covered.mfu_causal is None
    assert covered.mfu == pytest.approx(plain.mfu, rel=1e-12)
