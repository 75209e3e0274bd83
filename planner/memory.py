"""Memory per rank: weights, gradients and Adam states by ZeRO stage; activations; algorithm buffers.

Mixed-precision Adam (Megatron / ZeRO paper): 2 B bf16 weights + 4 B fp32 gradients + 12 B fp32
master weights, momentum and variance = 18 B/param. ZeRO over the dp x sp group of N ranks
(USP Table 2): stage 1 shards the 12 B of optimizer states, stage 2 also the gradients, stage 3
everything. Activations per layer follow Korthikanti et al. (2022) Sec. 4 with flash attention
(no N^2 scores) and no dropout masks, on this rank's tokens.
"""
from __future__ import annotations

from .algorithms import ALGORITHMS
from .schedules import Shape

WEIGHT_B, GRAD_B, ADAM_B = 2, 4, 12


def weight_bytes(params: float, zero_stage: int, shard: int, training: bool) -> dict[str, float]:
    """Bytes per rank of weights, gradients and optimizer states (USP Table 2 memory columns)."""
    if not training:
        return {"weights": WEIGHT_B * params}
    w, g, o = WEIGHT_B * params, GRAD_B * params, ADAM_B * params
    if zero_stage >= 1:
        o /= shard
    if zero_stage >= 2:
        g /= shard
    if zero_stage >= 3:
        w /= shard
    return {"weights": w, "gradients": g, "optimizer": o}


def layer_activation_bytes_per_token(c: Shape) -> float:
    """Saved activations of one block per token (Korthikanti et al. Sec. 4, flash attention, no dropout)."""
    m = c.model
    e = c.e
    per = m.hidden  # input of the first norm
    per += m.q_dim + 2 * m.kv_dim  # Q, K, V
    per += m.q_dim  # attention output (input of the O projection)
    per += m.hidden  # input of the second norm
    per += (3 if m.gated_mlp else 2) * m.ffn_hidden  # MLP: gate and up outputs and activation, or fc1 and GeLU
    return per * e + 4.0 * m.heads  # + fp32 log-sum-exp per head


#: bytes per token and vocabulary entry that the loss holds at its peak, the start of the backward: cross entropy
#: on logits cast to fp32 (what transformers' models and the measured stack compute) keeps its fp32 log-softmax,
#: and the backward makes the log-softmax's gradient and then the fp32 logits' gradient beside it, three fp32
#: tensors of tokens x vocabulary (the forward's peak, the half logits, their fp32 copy and the log-softmax, is
#: lower: 2 + 4 + 4 B)
LOSS_BYTES = 12.0


def logits_bytes(tokens: float, vocab: int, shards: int) -> float:
    """Peak bytes of the LM head's loss on ``tokens`` tokens, its vocabulary split ``shards`` ways (``LOSS_BYTES``)."""
    return tokens * vocab / shards * LOSS_BYTES


def in_flight_micro_batches(c: Shape, virtual_stages: int = 1) -> float:
    """Micro-batches whose activations the first stage holds, in whole stages' worth. 1F1B: min(pp, m) (Megatron).
    Interleaved over v chunks a rank (groups of pp micro-batches): the first rank warms up 2 (pp - 1) + (v - 1) pp
    chunk passes and holds one more before its first backward, at most all m v (Megatron's
    get_pp_rank_microbatches, core/pipeline_parallel/schedules.py), each chunk 1/v of the stage's layers: min(pp +
    (pp - 1) / v, m) stages, pp (1 + (pp - 1) / (pp v)) for m > pp as Korthikanti et al. (2022) §4.2.3 count it."""
    if c.pp == 1:
        return 1
    p, m, v = c.pp, c.micro_batches, virtual_stages
    if v == 1:
        return min(p, m)
    return min(2 * (p - 1) + (v - 1) * p + 1, m * v) / v


def activation_bytes(c: Shape, checkpointing: str, training: bool, virtual_stages: int = 1) -> dict[str, float]:
    """Activations held at the peak on the most loaded stage (``virtual_stages``: its model chunks, interleaved
    1F1B, ``in_flight_micro_batches``); TP-sp divides them by tp.

    none: every layer's saved tensors; full: each layer's input plus one layer recomputed;
    attention_boundary (DistFlashAttn / WallFacer): each layer's input, attention output and LSE
    are kept, so recomputation never reruns attention.
    """
    hook = ALGORITHMS[c.algorithm].activations
    if hook is not None:
        return hook(c, checkpointing, training)
    tokens = c.b * c.n_local
    m = c.model
    layer = layer_activation_bytes_per_token(c) * tokens / c.tp
    Lp = c.layers_per_stage
    if not training:
        kv_cache = 2 * m.layers / c.pp * tokens * c.kv_tp * m.head_dim * c.e
        return {"activations": layer, "kv_cache": kv_cache}
    if checkpointing == "full":
        saved = Lp * tokens * m.hidden * c.e / c.tp + layer
    elif checkpointing == "attention_boundary":
        saved = Lp * tokens * ((m.hidden + m.q_dim) * c.e + 4.0 * m.heads) / c.tp + layer
    else:
        saved = Lp * layer
    return {"activations": saved * in_flight_micro_batches(c, virtual_stages),
            "logits": logits_bytes(tokens, m.vocab, c.tp)}


def attention_buffer_bytes(c: Shape, training: bool) -> float:
    """Transient buffers of the layer's attention algorithm (planner/algorithms.py)."""
    return ALGORITHMS[c.algorithm].buffers(c, training)
