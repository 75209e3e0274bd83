"""METP (seeds/002) in the planner: Tables 1-2, eq. 10, the full-overlap condition, and its schedule.

Closed forms (in elements, per device, b sequences of s tokens, hidden h, n heads, degree p):
``ffn_table1`` and ``mha_table2`` give the memory after the forward pass, the peak memory during
it and the communication volume of Megatron TP+SP, RSA, FSDP/ZeRO + Ulysses and METP for an FFN
(Table 1) and an MHA layer (Table 2), each as the sum of the parts the paper names; ``peak_ratio``
is eq. 10.

Schedule (``metp_steps``, the plan's ``tp`` group of p ranks, ulysses = ring = 1). Forward:
broadcast of the first head group's W_qkv, W_proj slices (a binomial tree: log2 p sends of the
slice, the paper's volume, priced as a shift of that volume); then p outer iterations of p inner
ring rounds (Algorithm 3: an attention block of s/p x s/p tokens on n/p heads, overlapped with
the K, V send), the next group's broadcast spread over the rounds of the current group; then
the FFN (Algorithm 1): p - 1 sends of the W_in, W_out slice pair. Backward: the broadcasts again
with the reduces of the previous group's weight gradients, the QKV recompute, the inner backward
(K, V, dK, dV sends, p - 1 each), and the FFN's p - 1 steps of [recompute X_i B | slice pair and
gradient pair sends]. Summed over a layer the volumes are Table 1's 24 (p-1)/p h^2 and Table 2's
12 log2(p) h^2 + 6 (p-1)/p b s h (tests check this).

The registry has no hook to replace TP-sp's linear phases, so METP's weight traffic (the FFN's
included) lives in these attention steps, while ``schedules.linear_steps`` still prices the
layer's linear FLOPs (the same for METP and TP) and, for tp > 1, TP-sp's all-gathers and
reduce-scatters, which METP does not run: until such a hook exists METP plans are priced with
that extra traffic (and TP-sp's activation memory), a pessimistic estimate.
"""
from __future__ import annotations

import math

from .algorithms import Algorithm, Variant, register
from .memory import layer_activation_bytes_per_token, logits_bytes
from .errors import PlanError
from .layout import round_work_runs
from .masks import has_mask, refuse_masks
from .schedules import Comm, Compute, Shape, Step, attention_flops

METHODS = ("megatron", "rsa", "fsdp_ulysses", "metp")


# ---------------------------------------------------------------- Tables 1-2, eq. 10, Sec. 3.3 / 4.3

def ffn_table1(method: str, b: float, s: float, h: float, p: int) -> dict[str, float]:
    """Table 1: FFN (h -> 4h -> h) memory after forward, peak memory, communication volume (elements)."""
    states = 4 * (h * 4 * h + 4 * h * h)  # weights, gradients, Adam momentum and variance: 32 h^2
    if method == "megatron":  # AG(X) then X W_in (b s 4h/p saved), RS(Z); saves X_i and Y
        return {"memory": states / p + b * s * h / p + 4 * b * s * h / p,
                "peak": states / p + 4 * b * s * h / p + b * s * h,  # gathered X (b s h) and Y
                "comm": (p - 1) / p * (3 * b * s * h + 2 * b * s * h)}  # Sec. 3.2.2: (p-1)/p (3 m k1 + 2 m n)
    if method == "rsa":  # replicated weights, sequence-split activations, no FFN communication
        return {"memory": states + 5 * b * s * h / p, "peak": states + 5 * b * s * h / p, "comm": 0.0}
    if method == "fsdp_ulysses":  # sharded states, AllGather of W_in / W_out, ReduceScatter of their grads
        return {"memory": (states + 5 * b * s * h) / p, "peak": 4 * h * h + (28 * h * h + 5 * b * s * h) / p,
                "comm": 3 * (p - 1) / p * 8 * h * h}
    if method == "metp":  # Sec. 3.1: X_i kept, T_ij = X_i B_j (b s/p 4h/p) at the peak, Sec. 3.2.1
        return {"memory": states / p + b * s * h / p, "peak": states / p + b * s * h / p + 4 * b * s * h / p ** 2,
                "comm": 3 * (p - 1) / p * 8 * h * h}
    raise ValueError(f"unknown method {method!r}; use one of {METHODS}")


def mha_table2(method: str, b: float, s: float, h: float, n: float, p: int, flash: bool = True) -> dict[str, float]:
    """Table 2: MHA layer memory after forward, peak memory (k = 0 with FlashAttention), communication (elements)."""
    k = 0.0 if flash else 1.0
    states = 4 * (3 * h * h + h * h)  # W_qkv and W_proj with gradients and Adam states: 16 h^2
    if method == "megatron":
        return {"memory": states / p + 5 * b * s * h / p,
                "peak": states / p + 4 * b * s * h / p + b * n * s * s / p * k + b * s * h,
                "comm": 5 * (p - 1) / p * b * s * h}
    if method == "rsa":
        return {"memory": states + 5 * b * s * h / p, "peak": states + 5 * b * s * h / p + b * n * s * s / p,
                "comm": 8 * (p - 1) / p * b * s * h}
    if method == "fsdp_ulysses":
        return {"memory": states / p + 5 * b * s * h / p,
                "peak": 3 * h * h + 13 * h * h / p + b * n * s * s / p * k + 5 * b * s * h / p,
                "comm": 12 * (p - 1) / p * h * h + 8 * (p - 1) / p ** 2 * b * s * h}
    if method == "metp":  # Sec. 4.1: X_i and A_i kept; Q, K, V of one head group and its scores at the peak
        lg = math.log2(p)
        return {"memory": states / p + 2 * b * s * h / p,
                "peak": states / p + 3 * b * s * h / p ** 2 + b * n * s * s / p ** 3 * k + 2 * b * s * h / p,
                "comm": 4 * lg * h * h + 2 * (p - 1) / p * b * s * h  # Sec. 4.2.1 forward
                + 8 * lg * h * h + 4 * (p - 1) / p * b * s * h}  # Sec. 4.2.2 backward
    raise ValueError(f"unknown method {method!r}; use one of {METHODS}")


def peak_ratio(p: int) -> float:
    """Eq. 10: METP's peak intermediate memory over TP's for an MHA layer with FlashAttention, (3 + 2p) / (p (4 + p))."""
    return (3 + 2 * p) / (p * (4 + p))


def overlap_bound(peak_flops: float, bandwidth: float) -> float:
    """Sec. 3.3: computation hides communication when the arithmetic intensity exceeds peak / bandwidth (FLOPs/byte)."""
    return peak_flops / bandwidth


def full_overlap_tokens(peak_flops: float, bandwidth: float, p: int, batch: int = 1) -> dict[str, float]:
    """Sequence lengths above which METP fully overlaps (eqs. 5, 13): FFN m / p > bound, MHA s / 3 > bound (p = 8)."""
    bound = overlap_bound(peak_flops, bandwidth)
    return {"ffn": bound * p / batch, "mha_outer": 3 * bound, "mha": max(bound * p / batch, 3 * bound)}


# ---------------------------------------------------------------- schedule

def _sizes(c: Shape) -> dict[str, float]:
    m, p = c.model, c.tp
    ffn_in = m.ffn_hidden * (2 if m.gated_mlp else 1)
    return {"w_attn": (m.hidden * (m.q_dim + 2 * m.kv_dim) + m.q_dim * m.hidden) / p,  # W_qkv_j and W_proj_j
            "w_ffn": (m.hidden * ffn_in + m.ffn_hidden * m.hidden) / p,  # B_j and C_j of Algorithm 1
            "ffn_in": ffn_in,
            "kv": c.b * (c.work.seq_len / p) * (m.kv_heads / p) * m.head_dim,  # one K (or V) block
            "tree": max(math.ceil(math.log2(p)), 1) if p > 1 else 0}


def metp_steps(c: Shape, backward: bool) -> list[Step]:
    """One layer's METP phases (module docstring): two-level MHA (Algorithms 3-6) and FFN (Algorithms 1-2)."""
    p, e, m = c.tp, c.e, c.model
    z = _sizes(c)
    s_p = c.work.seq_len / p
    dim = ("tp",)
    tag = "bwd" if backward else "fwd"
    bcast = z["tree"] * z["w_attn"] * e
    blk = attention_flops(s_p, s_p, m.heads / p, m.head_dim, c.b) * (2.5 if backward else 1.0)
    runs = [f for f, k in round_work_runs(c.token_layout, p, c.work.seq_len, c.work.causal) for _ in range(k)]
    kv = 2 * z["kv"] * e + (2 * z["kv"] * c.acc if backward else 0.0)  # K, V (and the dK, dV accumulators) a round
    steps: list[Step] = []
    if p > 1:
        steps.append(Step((Comm(f"metp broadcast w_qkv,w_proj {tag}", "shift", dim, bcast),)))
    for j in range(p):
        if backward:
            steps.append(Step((Compute("metp qkv recompute", 2 * c.b * s_p * m.hidden * (m.q_dim + 2 * m.kv_dim) / p,
                                       rows=c.b * s_p),)))
        for r in range(p):
            phases: list = [Compute(f"attention {tag}", blk * runs[r], "attention", s_p)]
            if r < p - 1:
                phases.append(Comm(f"metp inner k,v {tag}", "shift", dim, kv))
            if j < p - 1:
                phases.append(Comm(f"metp broadcast w_qkv,w_proj {tag}", "shift", dim, bcast / p))
            if backward and j >= 1:
                phases.append(Comm("metp reduce dw_qkv,dw_proj", "shift", dim, bcast / p))
            steps.append(Step(tuple(phases), 1, overlap=len(phases) > 1))
    if backward and p > 1:
        steps.append(Step((Comm("metp reduce dw_qkv,dw_proj", "shift", dim, bcast),)))
    # FFN, Algorithms 1-2 (linear FLOPs are in schedules.linear_steps, which adds no TP-sp collectives for METP)
    if p > 1 and not backward:
        steps.append(Step((Comm("metp ffn w_in,w_out p2p fwd", "shift_back", dim, z["w_ffn"] * e),), p - 1))
    elif p > 1:  # step j: recompute X_i B; the next slice pair arrives, the previous step's gradients move on
        recompute = Compute("metp ffn recompute", 2 * c.b * s_p * m.hidden * z["ffn_in"] / p, rows=c.b * s_p)
        for j in range(p):
            phases = [recompute]
            if j < p - 1:
                phases.append(Comm("metp ffn w_in,w_out p2p bwd", "shift_back", dim, z["w_ffn"] * e))
            if j >= 2:
                phases.append(Comm("metp ffn dw_in,dw_out p2p", "shift_back", dim, z["w_ffn"] * e))
            steps.append(Step(tuple(phases), 1, overlap=len(phases) > 1))
        steps.append(Step((Comm("metp ffn dw_in,dw_out p2p", "shift_back", dim, z["w_ffn"] * e),)))
    return _compress(steps)


def _compress(steps: list[Step]) -> list[Step]:
    out: list[Step] = []
    for st in steps:
        if st.repeat == 0:
            continue
        if out and out[-1].phases == st.phases and out[-1].overlap == st.overlap:
            out[-1] = Step(st.phases, out[-1].repeat + st.repeat, st.overlap)
        else:
            out.append(st)
    return out


def metp_buffers(c: Shape, training: bool) -> float:
    """Transient bytes: double-buffered weight slices, one head group's Q, K, V (3 b s h / p^2), the inner
    K, V double buffers, the attention accumulators and the FFN's T_ij (b s/p 4h/p); training adds the
    dK, dV and the weight-gradient accumulators in flight."""
    p, e, m = c.tp, c.e, c.model
    z = _sizes(c)
    s_p = c.work.seq_len / p
    qkv = c.b * s_p * (m.q_dim + 2 * m.kv_dim) / p * e
    acc = c.b * s_p * (m.heads / p) * (m.head_dim + 1) * 4
    t_ffn = c.b * s_p * z["ffn_in"] / p * e
    buf = 2 * (z["w_attn"] + z["w_ffn"]) * e + qkv + 2 * 2 * z["kv"] * e + acc + t_ffn
    if training:
        buf += 2 * 2 * z["kv"] * 4 + 2 * z["w_ffn"] * e + z["w_attn"] * e
    return buf


def metp_activations(c: Shape, checkpointing: str, training: bool) -> dict[str, float]:
    """Saved per layer (Tables 1-2): the FFN keeps X (b s h / p), the MHA X and its output (2 b s h / p) and
    the LSE; both recompute the rest in backward, so checkpointing adds nothing. One layer's transient
    activations (Korthikanti per token, over p) and the logits come on top."""
    m, p, e = c.model, c.tp, c.e
    tokens = c.b * c.work.seq_len / p
    transient = layer_activation_bytes_per_token(c) * tokens
    if not training:
        return {"activations": transient, "kv_cache": 2 * m.layers / c.pp * tokens * m.kv_dim / p * e}
    saved = c.layers_per_stage * tokens * (3 * m.hidden * e + 4.0 * m.heads / p)
    return {"activations": saved + transient, "logits": logits_bytes(tokens, m.vocab, p)}


def _variants(d, model, work) -> list[Variant]:
    """METP on a tp group of two or more alone, without documents or a window."""
    if d.tp < 2 or d.ulysses != 1 or d.ring != 1 or has_mask(work):
        return []
    if model is not None and model.kv_heads % d.tp:
        return []
    return [Variant("metp", layouts=("contiguous", "zigzag") if work is not None and work.causal else ("contiguous",))]


def _check(cand, model, work) -> None:
    """No documents or window, ulysses and ring 1, and tp dividing the KV heads."""
    refuse_masks(cand.algorithm, work)
    if cand.ulysses != 1 or cand.ring != 1:
        raise PlanError("degrees", f"metp splits tokens over its tp group alone, got ulysses {cand.ulysses} and "
                        f"ring {cand.ring}", "set ulysses and ring to 1 and give METP's degree as tp")
    if model is not None and model.kv_heads % cand.tp:
        raise PlanError("degrees.tp", f"tp {cand.tp} does not divide the {model.kv_heads} KV heads",
                        "choose a tp degree that divides the KV heads (METP gives each rank whole head groups)")


register(Algorithm("metp", metp_steps, metp_buffers, variants=_variants, check=_check, tp_sp=False, batch_linear=False,
                   activations=metp_activations))
