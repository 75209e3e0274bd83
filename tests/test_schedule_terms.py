"""Terms of a layer's schedule worked by hand: a ring merge's backward accumulates dQ over the query heads and dK, dV
over the KV heads alone (GQA); a layer's GEMMs and the LM head cost 2 FLOPs a weight a token over tp forward and
twice that backward; a micro-batch of k sequences is one sequence's schedule scaled by k (GEMM rows included); a
pipelined rank holds its stage's blocks and one embedding matrix; a pipeline stage sends b x N/sp x H / tp elements
each way; KV heads fewer than tp are replicated, one per rank, and KV heads fewer than ulysses up to one per Ulysses
rank; each ZeRO stage syncs USP Table 2's collectives; a variant's shape derived from another's schedules as one
made afresh; an attention block cut into shorter tiles reads the efficiency curve at the square block of as many
pairs as it computed; and the even-share attention floor the search prunes with is never above the attention a
layout's schedule prices."""
from __future__ import annotations

import math

import pytest

from sp_plan.planner import Estimator, ModelSpec, Workload
from sp_plan.planner.schedules import (Comm, Compute, Shape, attention_steps, grad_sync, head_steps, layer_schedule,
                                      linear_steps, merge_bytes, pipeline_p2p, scaled, shard_params, tile_phase)
from sp_plan.profiles import load_cluster, load_model

GQA = ModelSpec(name="gqa", layers=1, hidden=512, heads=8, kv_heads=2, head_dim=64, vocab=0)


def test_a_gqa_ring_merge_accumulates_dk_and_dv_over_the_kv_heads():
    """b 1, 4096 tokens over ring 4 (1024 per block), 8 query heads and 2 KV heads of 64, bf16: the backward
    accumulates dQ (1024 x 8 x 64 elements) and dK, dV (1024 x 2 x 64 each) into fp32: 2 + 4 + 4 B an element."""
    c = Shape(GQA, Workload(seq_len=4096), dp=1, ulysses=1, ring=4, token_layout="contiguous")
    dq, dkv = 1024 * 8 * 64, 1024 * 2 * 64
    assert merge_bytes(c, True) == (dq + 2 * dkv) * (2 + 4 + 4)


def test_a_part_filled_block_cut_into_shorter_tiles_reads_its_square_block_of_as_many_pairs():
    """A 4096-token block a quarter filled computes as many pairs as a full 2048 block; cut into tiles of 3000
    tokens, the tile is 3000 long and part-filled so that it still reads the curve at 2048."""
    block = Compute("attention fwd", 1e12, "attention", block=4096, fill=0.25)
    tile = tile_phase(block, 3000.0, 1.0)
    assert tile.block == 3000.0
    assert tile.block * math.sqrt(tile.fill) == pytest.approx(2048.0, rel=1e-12)
    assert tile_phase(block, 1024.0, 1.0).fill == 1.0  # shorter than 2048: a full tile, read at its own length


def _flops(steps) -> float:
    return sum(p.flops for st in steps for p in st.phases if type(p) is Compute)


def test_a_layers_gemms_are_two_flops_a_weight_a_token_over_tp_and_twice_that_backward():
    """8192 tokens over ulysses 2 x ring 2 (2048 a rank), tp 2: the forward's GEMMs are 2 x 2048 x (4 x 512^2 for
    Q, K, V, O plus 2 x 512 x 2048 for the MLP) / 2 FLOPs; the backward (input and weight gradients) twice that."""
    model = ModelSpec(name="t", layers=1, hidden=512, heads=8, head_dim=64, vocab=1000)
    c = Shape(model, Workload(seq_len=8192), dp=1, ulysses=2, ring=2, token_layout="contiguous", tp=2)
    weights = 4 * 512 * 512 + 2 * 512 * 2048
    assert _flops(linear_steps(c, False)) == 2 * 2048 * weights / 2
    assert _flops(linear_steps(c, True)) == 2 * _flops(linear_steps(c, False))
    logits = 2 * 2048 * 512 * 1000 / 2
    assert _flops(head_steps(c, False)) == logits and _flops(head_steps(c, True)) == 3 * logits


def test_a_stage_sends_its_micro_batchs_activations_split_over_tp_and_their_gradients_back():
    """llama3-8b (hidden 4096, bf16), 64k tokens over ulysses 4, tp 2: b 1 x 16384 tokens x 4096 x 2 B / 2 per rank
    forward to the next stage and the same back; inference sends only the activations."""
    c = Shape(load_model("llama3-8b"), Workload(seq_len="64k"), dp=1, ulysses=4, ring=1, token_layout="contiguous",
              tp=2, pp=2)
    sends = [p for st in pipeline_p2p(c, True) for p in st.phases if type(p) is Comm]
    each = 16384 * 4096 * 2 / 2
    assert [(p.pattern, p.nbytes) for p in sends] == [("shift", each), ("shift_back", each)]
    assert len(pipeline_p2p(c, False)) == 1


def test_the_most_loaded_rank_holds_its_stages_blocks_and_one_embedding_matrix_when_pipelined():
    """4 blocks of 4 x 512^2 + 2 x 512 x 2048 weights and a 1000 x 512 embedding (untied head): one stage holds every
    block, the embedding and the head; of two stages, the first holds 2 blocks and the embedding, the last 2 blocks
    and the head; tp 2 halves each."""
    model = ModelSpec(name="t", layers=4, hidden=512, heads=8, head_dim=64, vocab=1000)
    block, emb = 4 * 512 * 512 + 2 * 512 * 2048, 1000 * 512
    assert shard_params(model, 1, 1) == 4 * block + 2 * emb
    assert shard_params(model, 1, 2) == 2 * block + emb
    assert shard_params(model, 2, 2) == (2 * block + emb) / 2
    assert shard_params(model, 1, 2, (3, 1)) == 3 * block + emb
    assert shard_params(model, 1, 1, (4,)) == shard_params(model, 1, 1)


def test_each_zero_stage_syncs_its_gradients_and_weights_over_the_data_and_sequence_ranks():
    """USP Table 2's ZeRO rows, per step, each of the rank's weights in bf16 over dp x ulysses x ring: ZeRO-0 one
    all-reduce; ZeRO-1 and 2 a reduce-scatter of the gradients and an all-gather of the weights; ZeRO-3 an all-gather
    for the forward, another for the backward and a reduce-scatter."""
    c = Shape(load_model("llama3-8b"), Workload(seq_len="32k"), dp=2, ulysses=4, ring=2, token_layout="zigzag")
    g = 1e9 * 2
    dims = ("ulysses", "ring", "dp")
    expected = {0: ["all_reduce"], 1: ["reduce_scatter", "all_gather"], 2: ["reduce_scatter", "all_gather"],
                3: ["all_gather", "all_gather", "reduce_scatter"]}
    for zero, patterns in expected.items():
        syncs = grad_sync(c, zero, 1e9)
        assert [p.pattern for p in syncs] == patterns, zero
        assert all(p.dim == dims and p.nbytes == g for p in syncs), zero


def test_kv_heads_fewer_than_tp_are_replicated_one_per_tp_rank_in_the_ring_rounds():
    """llama3-8b has 8 KV heads: under tp 16 each rank still holds one whole KV head (Megatron replicates them), so a
    ring round of 2 passes K and V of 16384 tokens x 1 head x 128 x 2 B each."""
    c = Shape(load_model("llama3-8b"), Workload(seq_len="32k"), dp=1, ulysses=1, ring=2, token_layout="zigzag",
              tp=16, algorithm="ring")
    rounds = [p for st in attention_steps(c, False) for p in st.phases if type(p) is Comm]
    assert rounds and all(p.nbytes == 2 * 16384 * 1 * 128 * 2 for p in rounds)


def test_kv_heads_fewer_than_ulysses_are_replicated_up_to_one_per_ulysses_rank_in_the_all_to_all():
    """llama3-8b (32 heads of 128, 8 KV heads), 64k over ulysses 8, tp 2: 4 KV heads per tp rank, sent as 8 so that
    each Ulysses rank gets one. The forward all-to-all carries Q (8192 tokens x 4096 / 2) and K, V (8192 x 8 x 128
    each), bf16."""
    c = Shape(load_model("llama3-8b"), Workload(seq_len="64k"), dp=1, ulysses=8, ring=1, token_layout="contiguous",
              tp=2, algorithm="usp")
    a2a = [p for st in attention_steps(c, False) for p in st.phases if type(p) is Comm and "q,k,v" in p.name]
    assert [p.nbytes for p in a2a] == [(8192 * 4096 / 2 + 2 * 8192 * 8 * 128) * 2]


@pytest.mark.parametrize("algorithm, layout, team, kv_chunks", [("allgather", "zigzag", 1, 4), ("wallfacer", "zigzag", 2, 1),
                                                               ("usp", "striped", 1, 1)])
def test_a_sibling_shape_is_the_shape_made_afresh_for_its_variant(algorithm, layout, team, kv_chunks):
    """The search derives a variant's shape from another's of the same degrees (``Shape.sibling``): it schedules what
    the shape built directly for that variant schedules."""
    model, work = load_model("llama3-8b"), Workload(seq_len="32k")
    base = Shape(model, work, dp=1, ulysses=1, ring=8, token_layout="contiguous", algorithm="ring")
    sibling = base.sibling(layout, algorithm, team, None, kv_chunks)
    fresh = Shape(model, work, dp=1, ulysses=1, ring=8, token_layout=layout, algorithm=algorithm, team=team,
                  kv_chunks=kv_chunks)
    assert sibling.key == fresh.key
    for backward in (False, True):
        assert attention_steps(sibling, backward) == attention_steps(fresh, backward)


@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
def test_a_micro_batch_of_k_sequences_is_one_sequences_schedule_scaled_by_k(backward):
    """FLOPs, GEMM rows (which a measured GEMM curve reads) and bytes are linear in the micro-batch's sequences; block
    lengths and repeats are not: ``scaled`` of one sequence's layer is the layer of two."""
    model, work = load_model("llama3-8b"), Workload(seq_len="32k")
    one, two = (Shape(model, work, dp=1, ulysses=4, ring=2, token_layout="zigzag", tp=2, mbs=b) for b in (1, 2))
    assert scaled(layer_schedule(one, backward), 2) == layer_schedule(two, backward)


LAYOUTS = [("usp", 2, 4, 1), ("usp", 1, 8, 1), ("metp", 8, 1, 1), ("wallfacer", 1, 1, 8), ("usp", 1, 2, 4)]


@pytest.mark.parametrize("algorithm, tp, ulysses, ring", LAYOUTS)
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
def test_the_even_share_attention_floor_is_no_more_than_the_layouts_attention(algorithm, tp, ulysses, ring, backward):
    model, work = load_model("llama3-8b"), Workload(seq_len="32k")
    est = Estimator(load_cluster("dgx-h100"), model, work)
    c = Shape(model, work, dp=1, ulysses=ulysses, ring=ring, token_layout="zigzag" if ring > 1 else "contiguous",
              tp=tp, algorithm=algorithm)
    priced = sum(est.compute_time(p) * st.repeat for st in attention_steps(c, backward) for p in st.phases
                 if type(p) is Compute and p.kind == "attention")
    assert est.bounds.balanced_time(c, backward) <= priced * (1 + 1e-12)
