"""METP (seeds/002): exactness of the modules, and Tables 1-2, eq. 10 and the overlap condition in the planner.

Runtime: worlds of 4 and 8 gloo ranks; the two-level MHA (Algorithms 3-6; the paper's MHA, plus a
GQA case at world 4) causal and not, contiguous and zigzag tokens, and the FFN (Algorithms 1-2),
in float64, and each layer and token layout once in float32, against a single-device float64 layer, within the rounding bound of the layer's sums
(``exact.tolerance``): output, dX and the weight gradients (each rank's shard against the matching slice of the
full gradient). One world per world size runs every case.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from sp_plan.planner.algorithms import ALGORITHMS, load_all
from sp_plan.planner.errors import PlanError
from sp_plan.planner.layout import ring_tokens
from exact import DTYPES, attention_terms, mismatches, once
from harness.worlds import run_world
from markers import shared_world

BATCH, SEQ, HEADS, HEAD_DIM = 2, 64, 8, 8
HIDDEN = HEADS * HEAD_DIM
FFN = 4 * HIDDEN


@dataclass(frozen=True)
class Case:
    world: int
    layer: str  # mha | ffn
    token_layout: str
    causal: bool
    dtype: str
    kv_heads: int = HEADS

    @property
    def id(self) -> str:
        kv = f"-kv{self.kv_heads}" if self.kv_heads != HEADS else ""
        return f"w{self.world}-{self.layer}{kv}-{self.token_layout}-{'causal' if self.causal else 'full'}-{self.dtype}"


def cases(world: int) -> list[Case]:
    """MHA on both token layouts, causal and not, the FFN, and GQA at world 4, in float64; each layer on each token
    layout once in float32 (the code is the same in every dtype; the slice checks float32's rounding bound)."""
    out = [Case(world, "mha", t, c, "float64") for t in ("contiguous", "zigzag") for c in (False, True)]
    out += [Case(world, "ffn", "contiguous", False, dt) for dt in DTYPES]
    out += [Case(world, "mha", "contiguous", False, "float32"), Case(world, "mha", "zigzag", True, "float32")]
    if world == 4:
        out += [Case(world, "mha", "zigzag", True, "float64", kv_heads=4)]
    return out


ALL_CASES = [c for w in (4, 8) for c in cases(w)]


def _inputs(case: Case):
    """X, full weights and upstream gradient in float64 (weights of std 1/sqrt(fan-in))."""
    g = torch.Generator().manual_seed(11 + case.causal + 3 * case.kv_heads + (case.layer == "ffn"))
    x = torch.randn(BATCH, SEQ, HIDDEN, generator=g, dtype=torch.float64)
    dz = torch.randn(BATCH, SEQ, HIDDEN, generator=g, dtype=torch.float64)
    if case.layer == "ffn":
        w1 = torch.randn(HIDDEN, FFN, generator=g, dtype=torch.float64) / math.sqrt(HIDDEN)
        w2 = torch.randn(FFN, HIDDEN, generator=g, dtype=torch.float64) / math.sqrt(FFN)
    else:
        w1 = torch.randn(HIDDEN, (HEADS + 2 * case.kv_heads) * HEAD_DIM, generator=g, dtype=torch.float64)
        w1 /= math.sqrt(HIDDEN)
        w2 = torch.randn(HIDDEN, HIDDEN, generator=g, dtype=torch.float64) / math.sqrt(HIDDEN)
    return x, w1, w2, dz


def _module(case: Case, w1, w2):
    from sp_plan.runtime.variants.metp import METPAttention, METPFeedForward

    if case.layer == "ffn":
        mod = METPFeedForward.from_full(w1, w2, dist.group.WORLD)
        return mod, (torch.arange(mod.position * FFN // mod.size, (mod.position + 1) * FFN // mod.size),
                     slice(mod.position * FFN // mod.size, (mod.position + 1) * FFN // mod.size))
    mod = METPAttention.from_full(w1, w2, HEADS, dist.group.WORLD, kv_heads=case.kv_heads, causal=case.causal,
                                  token_layout=case.token_layout)
    return mod, (mod.shard_columns(), mod.shard_rows())


def _run_cases(rank: int, world: int, todo: list[Case]):
    results = []
    for case in todo:
        dt = DTYPES[case.dtype]
        x, w1, w2, dz = _inputs(case)
        tok = torch.as_tensor(np.array(ring_tokens(case.token_layout, world, SEQ)[rank]))
        mod, (cols, rows) = _module(case, w1.to(dt), w2.to(dt))
        xl = x[:, tok].to(dt).requires_grad_()
        out = mod(xl)
        saved = sum(t.numel() for t in out.grad_fn.saved_tensors if t.dim() != 2)  # activations, not weight shards
        out.backward(dz[:, tok].to(dt))
        p1, p2 = mod.parameters()
        results.append((tok.numpy(), cols, rows, out.detach(), xl.grad, p1.grad, p2.grad, saved))
    return results


@once
def world_results(world: int) -> dict[str, list]:
    todo = cases(world)
    per_rank = run_world(_run_cases, world, todo, timeout=300)
    out = {}
    for i, case in enumerate(todo):
        x, w1, w2, _ = _inputs(case)
        full = [torch.zeros_like(x), torch.zeros_like(x), torch.zeros_like(w1), torch.zeros_like(w2)]
        saved = []
        for rank in range(world):
            tok, cols, rows, o, dx, g1, g2, s = per_rank[rank][i]
            tok = torch.as_tensor(tok)
            full[0][:, tok] = o.double()
            full[1][:, tok] = dx.double()
            if case.layer == "ffn":
                full[2][:, cols] = g1.double()
            else:
                full[2][:, cols] = g1.double()
            full[3][rows] = g2.double()
            saved.append(s)
        out[case.id] = (full, saved)
    return out


@lru_cache(maxsize=None)
def reference(case: Case):
    """Single-device float64 layer: GeLU FFN, or MHA (QKV projection, softmax attention, output projection)."""
    x, w1, w2, dz = (t.clone().requires_grad_(i < 3) for i, t in enumerate(_inputs(case)))
    if case.layer == "ffn":
        z = F.gelu(x @ w1) @ w2
    else:
        qkv = x @ w1
        hk = case.kv_heads * HEAD_DIM
        q = qkv[..., :HIDDEN].view(BATCH, SEQ, HEADS, HEAD_DIM).transpose(1, 2)
        k = qkv[..., HIDDEN:HIDDEN + hk].view(BATCH, SEQ, case.kv_heads, HEAD_DIM).transpose(1, 2)
        v = qkv[..., HIDDEN + hk:].view(BATCH, SEQ, case.kv_heads, HEAD_DIM).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=case.causal, enable_gqa=True)
        z = a.transpose(1, 2).reshape(BATCH, SEQ, HIDDEN) @ w2
    z.backward(dz)
    return [z.detach(), x.grad, w1.grad, w2.grad]


@shared_world("metp")
@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.id)
def test_exact_against_single_device_layer(case: Case):
    (got, _), ref = world_results(case.world)[case.id], reference(case)
    wrong = mismatches(got, ref, ("out", "dX", "dW_in/dW_qkv", "dW_out/dW_proj"), case.dtype, layer_terms(case),
                       case.id)
    assert not wrong, "\n".join(wrong)


def layer_terms(case: Case) -> int:
    """Terms on the layer's longest chain: through both projections forward and back (their inner dimensions),
    attention's own chain for MHA, and the weight gradient's sum over every token of the batch."""
    if case.layer == "ffn":
        return 2 * (HIDDEN + FFN) + BATCH * SEQ
    return 4 * HIDDEN + attention_terms(SEQ, HEAD_DIM, HEADS // case.kv_heads) + BATCH * SEQ


@shared_world("metp")
@pytest.mark.parametrize("world", [4, 8])
def test_forward_keeps_table_memory(world: int):
    """What the forward keeps for the backward: FFN X_i (Table 1: b s h / p); MHA X_i, A_i (+ LSE) (Table 2: 2 b s h / p)."""
    res = world_results(world)
    s_p = SEQ // world
    for case in cases(world):
        _, saved = res[case.id]
        expect = BATCH * s_p * HIDDEN if case.layer == "ffn" else 2 * BATCH * s_p * HIDDEN + BATCH * HEADS * s_p
        assert saved == [expect] * world, case.id


# ---------------------------------------------------------------- planner: Tables 1-2, eq. 10

def _shape(p: int, b: int = 1, s: int = 32768, h: int = 4096, n: int = 32, causal: bool = False):
    from sp_plan.planner.model import ModelSpec, Workload
    from sp_plan.planner.schedules import Shape

    m = ModelSpec(name="table", layers=1, hidden=h, heads=n, kv_heads=n, ffn_hidden=4 * h, gated_mlp=False,
                  vocab=32000, dtype="bf16")
    w = Workload(seq_len=s, batch=b, causal=causal, training=True)
    return Shape(m, w, dp=1, ulysses=1, ring=1, token_layout="contiguous", tp=p, algorithm="metp", mbs=b)


def _volume(steps, which, e: float, acc: float) -> float:
    """Elements the METP sends of ``steps`` move: a backward inner round's K, V in the model's dtype, its dK, dV in
    the runtime's accumulators (e and acc bytes an element), every other send in the model's dtype."""
    from sp_plan.planner.schedules import Comm

    def elements(ph):
        return ph.nbytes * 2 / (e + acc) if ph.name == "metp inner k,v bwd" else ph.nbytes / e

    return sum(elements(ph) * st.repeat for st in steps for ph in st.phases
               if isinstance(ph, Comm) and which(ph.name))


@pytest.mark.parametrize("p", [2, 4, 8])
def test_schedule_volumes_are_table_1_and_table_2(p: int):
    """Sum of the schedule's METP sends (forward + backward, elements): FFN 24 (p-1)/p h^2 (Table 1),
    MHA 12 log2(p) h^2 + 6 (p-1)/p b s h (Table 2)."""
    from sp_plan.planner.metp import ffn_table1, metp_steps, mha_table2

    b, s, h, n = 2, 32768, 4096, 32
    c = _shape(p, b, s, h, n)
    steps = metp_steps(c, False) + metp_steps(c, True)
    assert (c.e, c.acc) == (2, 4)  # bf16, fp32 accumulators
    ffn = _volume(steps, lambda name: "ffn" in name, c.e, c.acc)
    mha = _volume(steps, lambda name: "ffn" not in name, c.e, c.acc)
    assert ffn == pytest.approx(24 * (p - 1) / p * h * h, rel=1e-12)
    assert ffn == pytest.approx(ffn_table1("metp", b, s, h, p)["comm"], rel=1e-12)
    assert mha == pytest.approx(12 * math.log2(p) * h * h + 6 * (p - 1) / p * b * s * h, rel=1e-12)
    assert mha == pytest.approx(mha_table2("metp", b, s, h, n, p)["comm"], rel=1e-12)


def test_table_1_entries():
    from sp_plan.planner.metp import ffn_table1

    b, s, h, p = 2, 8192, 1024, 4
    bsh = b * s * h
    rows = {"megatron": (32 * h * h / p + 5 * bsh / p, 32 * h * h / p + 4 * bsh / p + bsh, 5 * (p - 1) / p * bsh),
            "rsa": (32 * h * h + 5 * bsh / p, 32 * h * h + 5 * bsh / p, 0.0),
            "fsdp_ulysses": (32 * h * h / p + 5 * bsh / p, 4 * h * h + (28 * h * h + 5 * bsh) / p, 24 * (p - 1) / p * h * h),
            "metp": (32 * h * h / p + bsh / p, 32 * h * h / p + bsh / p + 4 * bsh / p ** 2, 24 * (p - 1) / p * h * h)}
    for method, (mem, peak, comm) in rows.items():
        t = ffn_table1(method, b, s, h, p)
        assert (t["memory"], t["peak"], t["comm"]) == pytest.approx((mem, peak, comm), rel=1e-12), method
    # eq. 3: METP's peak is below Megatron's for every p
    for p in (2, 4, 8, 16):
        assert ffn_table1("metp", b, s, h, p)["peak"] < ffn_table1("megatron", b, s, h, p)["peak"]


def test_table_2_entries():
    from sp_plan.planner.metp import mha_table2

    b, s, h, n, p = 1, 16384, 2048, 16, 8
    bsh, att = b * s * h, b * n * s * s
    for flash, k in ((True, 0), (False, 1)):
        rows = {"megatron": (16 * h * h / p + 5 * bsh / p, 16 * h * h / p + 4 * bsh / p + att / p * k + bsh,
                             5 * (p - 1) / p * bsh),
                "rsa": (16 * h * h + 5 * bsh / p, 16 * h * h + 5 * bsh / p + att / p, 8 * (p - 1) / p * bsh),
                "fsdp_ulysses": (16 * h * h / p + 5 * bsh / p, 3 * h * h + 13 * h * h / p + att / p * k + 5 * bsh / p,
                                 12 * (p - 1) / p * h * h + 8 * (p - 1) / p ** 2 * bsh),
                "metp": (16 * h * h / p + 2 * bsh / p, 16 * h * h / p + 3 * bsh / p ** 2 + att / p ** 3 * k + 2 * bsh / p,
                         12 * math.log2(p) * h * h + 6 * (p - 1) / p * bsh)}
        for method, (mem, peak, comm) in rows.items():
            t = mha_table2(method, b, s, h, n, p, flash=flash)
            assert (t["memory"], t["peak"], t["comm"]) == pytest.approx((mem, peak, comm), rel=1e-12), (method, flash)


def test_eq_10_saves_41_7_percent_at_p_2():
    """Eq. 10: peak intermediate memory of METP over TP (FlashAttention) is 7/12 at p = 2, i.e. 41.7 % saved,
    and smaller for larger p; it is also what Table 2's peaks give without the model states."""
    from sp_plan.planner.metp import mha_table2, peak_ratio

    assert peak_ratio(2) == pytest.approx(7 / 12)
    assert round(100 * (1 - peak_ratio(2)), 1) == 41.7
    assert all(peak_ratio(p) < peak_ratio(2) for p in (4, 8, 16))
    b, s, h, n = 1, 65536, 4096, 32
    for p in (2, 4, 8):
        states = 16 * h * h / p
        metp = mha_table2("metp", b, s, h, n, p)["peak"] - states
        tp = mha_table2("megatron", b, s, h, n, p)["peak"] - states
        assert metp / tp == pytest.approx(peak_ratio(p), rel=1e-12)


def test_full_overlap_condition():
    """Sec. 3.3 / 4.3 on A100 (312 TFLOP/s, NVLink 300 GB/s): 1040 FLOPs/byte; FFN needs s > 8320 at p = 8,
    b = 1; the MHA's outer loop s > 3120 (eq. 13)."""
    from sp_plan.planner.metp import full_overlap_tokens, overlap_bound

    assert overlap_bound(312e12, 300e9) == pytest.approx(1040)
    t = full_overlap_tokens(312e12, 300e9, 8)
    assert t["ffn"] == pytest.approx(8320) and t["mha_outer"] == pytest.approx(3120) and t["mha"] == pytest.approx(8320)


def test_registered_and_ranked_by_the_search():
    from sp_plan.planner.model import ModelSpec, Workload
    from sp_plan.planner.search import Degrees, grid_search
    from sp_plan.profiles import preset_cluster

    load_all()
    assert "metp" in ALGORITHMS
    m = ModelSpec(name="t", layers=8, hidden=4096, heads=32, kv_heads=32, ffn_hidden=16384, gated_mlp=False,
                  vocab=32000, dtype="bf16")
    w = Workload(seq_len="32k", batch=1, causal=True, training=True)
    vs = ALGORITHMS["metp"].variants(Degrees(1, 1, 8, 1, 1), m, w)
    assert [(v.algorithm, v.layouts) for v in vs] == [("metp", ("contiguous", "zigzag"))]
    assert ALGORITHMS["metp"].variants(Degrees(1, 1, 4, 1, 2), m, w) == []
    cl = preset_cluster("dgx-h100")
    res = grid_search(cl, m, w, keep=None)
    assert "metp" in {c.algorithm for _, c in res.ranked}


def test_metp_memory_lower_than_megatron_for_long_sequences_per_schedule_buffers():
    """The planner's METP buffers hold one head group (3 b s h / p^2) and the FFN's T_ij (4 b s h / p^2)."""
    from sp_plan.planner.metp import metp_buffers

    small, big = _shape(8, s=8192), _shape(8, s=65536)
    grow = metp_buffers(big, False) - metp_buffers(small, False)
    h, p, e = 4096, 8, 2
    per_token = (3 * h / p ** 2 + 4 * h / p ** 2 + 2 * 2 * h / p ** 2) * e + (32 / p) * (128 + 1) * 4 / p
    assert grow == pytest.approx((65536 - 8192) * per_token, rel=1e-9)


def test_check_rejects_ring_and_kv_heads():
    from sp_plan.planner.candidate import Candidate
    from sp_plan.planner.model import ModelSpec

    load_all()
    m = ModelSpec(name="t", layers=1, hidden=1024, heads=8, kv_heads=2, ffn_hidden=4096, vocab=100, dtype="bf16")
    with pytest.raises(PlanError, match="ring"):
        ALGORITHMS["metp"].check(Candidate("metp", tp=2, ring=2), m, None)
    with pytest.raises(PlanError, match="KV heads"):
        ALGORITHMS["metp"].check(Candidate("metp", tp=4), m, None)


def _attention_without_tp(rank, world):
    from sp_plan.runtime.attention import attention

    q = torch.randn(1, 4, 2, 4)
    try:
        attention(q, q, q, algorithm="metp", groups={"ring": None}, ranks={}, causal=False, token_layout="contiguous")
    except PlanError as e:
        return e.field
    return None


def test_metp_attention_entry_points_to_the_modules():
    assert run_world(_attention_without_tp, 2, timeout=30) == ["algorithm"] * 2
