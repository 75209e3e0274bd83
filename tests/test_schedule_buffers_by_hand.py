"""Transient attention buffers and the KV cache of the papers' schedules, by hand from the sizes of one layer.

Ring and USP (seeds/003): K, V double buffers, the fp32 output and LSE accumulators, and in training fp32 dK, dV
double buffers and an fp32 dQ accumulator; Ulysses adds the head-sharded Q and output and K, V after the all-to-all.

WallFacer inference (seeds/000 Algorithm 1, eq. 7): the team's gathered Q, K, V beyond the rank's own shard, K, V
double buffers for the sub-ring, the fp32 output accumulator, the fp32 LSE and the team's C LSEs for the combine.
WallFacer training adds the backward set (Sec. 3.2.1), which never coexists with the forward one: the team's
gathered Q, K, V, O, dO beyond the own shard, K, V in Algorithm 2's places, the travelling Q bundle (Q, O, dO and the
fp32 LSE), fp32 dQ (held and carried) and fp32 dK, dV (held and returned to their team).
METP inference (seeds/002 Tables 1-2): double-buffered weight slices (gated W_in holds gate and up), one head group's
Q, K, V, the inner K, V double buffers, the fp32 attention accumulators (output and LSE) and the FFN's T_ij of
b s/p tokens by the gated width over p. METP training (Algorithms 2-6): on top of the inference set, the fp32 dK, dV double buffers of the inner
ring and the weight gradients in flight (the FFN's gradient pair double-buffered, one W_qkv, W_proj slice).
METP inference keeps K and V of its b s / p tokens and its head group per layer."""
from __future__ import annotations

import pytest

from sp_plan.planner.memory import attention_buffer_bytes
from sp_plan.planner.metp import metp_activations
from sp_plan.planner.model import ModelSpec, Workload
from sp_plan.planner.schedules import Shape

B, N, HIDDEN, HEADS, KV, D, FFN, E = 1, 65536, 4096, 32, 8, 128, 14336, 2


def _model(layers: int = 1) -> ModelSpec:
    return ModelSpec(name="t", layers=layers, hidden=HIDDEN, heads=HEADS, kv_heads=KV, head_dim=D, ffn_hidden=FFN,
                     gated_mlp=True, vocab=0, dtype="bf16")


def _wallfacer(P: int, C: int, training: bool = False) -> Shape:
    return Shape(_model(), Workload(seq_len=N, causal=True, training=training), dp=1, ulysses=1, ring=P,
                 token_layout="zigzag", algorithm="wallfacer", team=C, placement="collective_intra")


def _metp(p: int, training: bool, layers: int = 1) -> Shape:
    return Shape(_model(layers), Workload(seq_len=N, causal=True, training=training), dp=1, ulysses=1, ring=1,
                 token_layout="contiguous", tp=p, algorithm="metp")


@pytest.mark.parametrize("U,R", [(1, 8), (4, 4), (8, 2)])
@pytest.mark.parametrize("training", [False, True])
def test_ring_and_usp_buffers_by_hand(U, R, training):
    c = Shape(_model(), Workload(seq_len=N, causal=True, training=training), dp=1, ulysses=U, ring=R,
              token_layout="zigzag", algorithm="usp" if U > 1 else "ring")
    block = N / R  # tokens of one ring block
    heads, kv = HEADS / U, max(KV, U) / U  # per rank after the all-to-all (KV heads replicated up to U)
    q_el, k_el = B * block * heads * D, B * block * kv * D
    want = 2 * 2 * k_el * E + q_el * 4 + B * block * heads * 4  # K, V double buffers; fp32 out and LSE
    if training:
        want += 2 * 2 * k_el * 4 + q_el * 4  # fp32 dK, dV double buffers; fp32 dQ
    if U > 1:
        want += (2 * q_el + 2 * k_el) * E  # Ulysses: Q and the output, K and V, head-sharded
    assert attention_buffer_bytes(c, training) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("P,C", [(16, 2), (16, 4), (64, 4)])
def test_wallfacer_inference_buffers_by_hand(P, C):
    team_tokens = C * N / P  # the team block
    q = B * team_tokens * HEADS * D * E
    k = B * team_tokens * KV * D * E
    lse = B * team_tokens * HEADS * 4  # fp32
    gathered = (C - 1) / C * (q + 2 * k)  # the all-gather's output holds the rank's own shard
    sub_ring = 2 * (2 * k)  # K and V, double-buffered
    accumulators = B * team_tokens * HEADS * D * 4 + lse + C * lse  # fp32 out, its LSE, the team's C LSEs
    want = gathered + sub_ring + accumulators
    assert attention_buffer_bytes(_wallfacer(P, C), False) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("P,C", [(16, 2), (16, 4), (64, 4)])
def test_wallfacer_training_buffers_are_the_backward_set_by_hand(P, C):
    team_tokens = C * N / P
    q = B * team_tokens * HEADS * D * E
    k = B * team_tokens * KV * D * E
    lse = B * team_tokens * HEADS * 4
    backward = ((C - 1) / C * (3 * q + 2 * k)  # gathered Q, K, V, O, dO beyond the own shard
                + 2 * k  # K, V in Algorithm 2's places
                + 3 * q + lse  # the Q bundle in flight: Q, O, dO and the LSE
                + 2 * (q / E * 4)  # fp32 dQ, held and carried
                + 2 * (2 * k / E * 4))  # fp32 dK, dV, held and returned
    assert attention_buffer_bytes(_wallfacer(P, C, True), True) == pytest.approx(backward, rel=1e-12)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_metp_inference_buffers_by_hand(p):
    tokens = B * N / p
    k_block = tokens * (KV / p) * D
    w_attn = (HIDDEN * (HEADS * D + 2 * KV * D) + HEADS * D * HIDDEN) / p
    w_ffn = (HIDDEN * 2 * FFN + FFN * HIDDEN) / p
    want = (2 * (w_attn + w_ffn) * E  # this slice and the next
            + tokens * (HEADS * D + 2 * KV * D) / p * E  # one head group's Q, K, V
            + 2 * 2 * k_block * E  # inner K, V double buffers
            + tokens * (HEADS / p) * (D + 1) * 4  # fp32 output and LSE accumulators
            + tokens * 2 * FFN / p * E)  # T_ij = X_i B_j over the gated width
    assert attention_buffer_bytes(_metp(p, False), False) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_metp_training_adds_fp32_dk_dv_and_weight_gradients_in_flight(p):
    k_block = B * (N / p) * (KV / p) * D  # one inner round's K (or V) block, elements
    w_attn = (HIDDEN * (HEADS * D + 2 * KV * D) + HEADS * D * HIDDEN) / p  # W_qkv_j and W_proj_j, elements
    w_ffn = (HIDDEN * 2 * FFN + FFN * HIDDEN) / p  # gated W_in (gate and up) and W_out slices, elements
    extra = 2 * 2 * k_block * 4 + 2 * w_ffn * E + w_attn * E
    got = attention_buffer_bytes(_metp(p, True), True) - attention_buffer_bytes(_metp(p, False), False)
    assert got == pytest.approx(extra, rel=1e-12)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_metp_inference_kv_cache_holds_k_and_v_of_each_layer(p):
    layers = 4
    tokens = B * N / p
    want = 2 * layers * tokens * (KV * D / p) * E  # K and V of the head group, every layer
    assert metp_activations(_metp(p, False, layers), "none", False)["kv_cache"] == pytest.approx(want, rel=1e-12)
