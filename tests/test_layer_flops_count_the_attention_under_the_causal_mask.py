"""A layer's forward FLOPs per token (``stages.layer_flops``, what the stage balancer weighs against the LM head):
2 x its weights, plus with a workload the attention's 4 x S x heads x head_dim (QK^T and PV) times the mask's share
of the S^2 pairs, (S + 1) / 2S under a causal mask and all of them without one; and the balanced split reads it."""
from __future__ import annotations

import pytest

from sp_plan.planner.model import Workload
from sp_plan.planner.stages import balanced_stage_layers, layer_flops, resolve_stage_layers
from sp_plan.profiles import load_model


@pytest.mark.parametrize("seq", [4096, 131072])
def test_the_attention_term_is_4_s_heads_head_dim_times_the_masks_share(seq):
    m = load_model("llama3-8b")
    weights = layer_flops(m)
    assert weights == 2.0 * m.layer_params()
    full = layer_flops(m, Workload(seq_len=seq, batch=1, causal=False)) - weights
    causal = layer_flops(m, Workload(seq_len=seq, batch=1, causal=True)) - weights
    assert full == pytest.approx(4.0 * seq * m.heads * m.head_dim, rel=1e-12)
    assert causal == pytest.approx(full * (seq + 1) / (2 * seq), rel=1e-12)


def test_a_long_sequence_moves_layers_back_onto_the_last_stage():
    """llama3-8b on 3 stages: at 128k the attention makes a layer outweigh the LM head, so the last stage holds one
    layer fewer than the others, where the weights alone leave it three fewer than the busiest."""
    m = load_model("llama3-8b")
    long = Workload(seq_len=131072, batch=8)
    assert balanced_stage_layers(m, 3) == (11, 12, 9)
    assert balanced_stage_layers(m, 3, long) == (11, 11, 10)
    assert resolve_stage_layers(m, 3, None, long) == (11, 11, 10)
