"""Parameter counts a model spec gives the memory and FLOP formulas.

A block holds its Q, K, V and O projections (K and V at the KV heads' width under GQA, Q and O at heads x head_dim,
which need not be the hidden size) and its MLP (two matrices, three when gated); the model adds an input embedding
and an untied output head. Norms and biases are not counted. Defaults: as many KV heads as query heads, head_dim
hidden / heads, an FFN of 4 x hidden.
"""
from __future__ import annotations

from sp_plan.planner.model import ModelSpec
from sp_plan.profiles import load_model

#: Meta-Llama-3-8B's published parameter count (its safetensors' total), norms included: 2 RMSNorm weights of 4096
#: a layer over 32 layers and the final norm
LLAMA3_8B_PUBLISHED = 8_030_261_248
LLAMA3_8B_NORMS = (2 * 32 + 1) * 4096


def test_llama3_8b_is_its_published_count_less_the_norms():
    assert load_model("llama3-8b").params() == LLAMA3_8B_PUBLISHED - LLAMA3_8B_NORMS


def test_a_gqa_block_with_a_head_dim_of_its_own_counts_each_projection():
    m = ModelSpec(layers=3, hidden=512, heads=8, kv_heads=2, head_dim=96, ffn_hidden=1024, gated_mlp=True, vocab=1000)
    q = o = 512 * 8 * 96
    k = v = 512 * 2 * 96
    mlp = 3 * 512 * 1024
    assert m.layer_params() == q + k + v + o + mlp
    assert m.params() == 3 * (q + k + v + o + mlp) + 2 * 1000 * 512


def test_an_ungated_mlp_has_two_matrices_and_the_defaults_fill_in():
    m = ModelSpec(layers=1, hidden=64, heads=4, vocab=0)  # kv heads 4, head_dim 16, ffn 256
    assert (m.kv_heads, m.head_dim, m.ffn_hidden) == (4, 16, 256)
    assert m.layer_params() == 4 * 64 * 64 + 2 * 64 * 256


def test_a_gated_mlp_adds_a_third_matrix():
    plain = ModelSpec(layers=1, hidden=64, heads=4, ffn_hidden=128, vocab=0)
    gated = ModelSpec(layers=1, hidden=64, heads=4, ffn_hidden=128, vocab=0, gated_mlp=True)
    assert gated.layer_params() - plain.layer_params() == 64 * 128
