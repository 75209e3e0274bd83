"""Exactness matrix of the attention runtime against single-process PyTorch attention.

Every variant (ring x {contiguous, zigzag, striped}, Ulysses, USP x {ulysses inner, ring inner} x
token layouts) on worlds of 1, 2, 4 and 8 gloo ranks, causal and not, MHA and GQA (8 query heads
with 2 and with 1 KV heads) in float64, and every variant once in float32 (causal, GQA). Each rank takes its tokens of a global
sequence (``sp_tokens`` / ``ring_tokens``), runs forward and backward, and returns output and
gradients of its tokens; the parent puts them back at their global positions and compares with
F.scaled_dot_product_attention in float64 on the full sequence, within the rounding bound of attention's sums in
the case's dtype (``exact.tolerance``). One world is launched per world size; the configurations loop inside it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from sp_plan.planner.errors import PlanError
from sp_plan.planner.layout import TOKEN_LAYOUTS, Layout, ring_tokens, sp_tokens
from sp_plan.runtime.attention import attention
from sp_plan.runtime.variants.ring import ring_attention
from exact import DTYPES, gathered_attention, attention_terms, mismatches, once, sdpa_reference
from harness.worlds import WorldError, run_world
from markers import shared_world
from sp_plan.runtime.variants.ulysses import ulysses_attention

BATCH, SEQ, HEADS, HEAD_DIM = 2, 64, 8, 8
KV_HEADS = (8, 2, 1)
WORLDS = (1, 2, 4, 8)


@dataclass(frozen=True)
class Case:
    world: int
    algorithm: str  # ring | ulysses | usp
    ulysses: int
    ring: int
    order: tuple[str, ...]  # mesh order, innermost first
    token_layout: str
    causal: bool
    kv_heads: int
    dtype: str
    ring_order: tuple[int, ...] | None = None  # ring attention: global ranks in ring order

    @property
    def id(self) -> str:
        place = "" if self.algorithm != "usp" else f"{self.ulysses}x{self.ring}-{self.order[0]}_inner-"
        ro = "" if self.ring_order is None else "-order" + "".join(map(str, self.ring_order))
        return (f"w{self.world}-{self.algorithm}-{place}{self.token_layout}{ro}-"
                f"{'causal' if self.causal else 'full'}-kv{self.kv_heads}-{self.dtype}")

    @property
    def layout(self) -> Layout:
        return Layout({"ulysses": self.ulysses, "ring": self.ring}, self.order, self.token_layout)


def _variants(world: int):
    """(algorithm, ulysses, ring, order, token_layout, ring_order) valid on ``world`` ranks."""
    out = [("ring", 1, world, ("ring",), t, None) for t in TOKEN_LAYOUTS]
    out.append(("ulysses", world, 1, ("ulysses",), "contiguous", None))
    if world == 4:
        out.append(("ring", 1, 4, ("ring",), "zigzag", (0, 2, 3, 1)))  # a ring order other than sorted
    for u in range(1, world + 1):
        if world % u:
            continue
        r = world // u
        if world > 2 and (u == 1 or r == 1):
            continue  # pure ring / Ulysses are covered above; degree-1 USP sides are tested on small worlds
        orders = [("ulysses", "ring"), ("ring", "ulysses")] if u > 1 and r > 1 else [("ulysses", "ring")]
        layouts = TOKEN_LAYOUTS if r > 1 else ("contiguous",)
        out += [("usp", u, r, o, t, None) for o in orders for t in layouts]
    return out


#: the float32 slice: every variant runs once in float32, causal with GQA (the runtime's code is the same in every
#: dtype; the slice checks that its sums stay within float32's rounding bound), the full matrix runs in float64
FLOAT32_SLICE = (True, 2)


def cases(world: int) -> list[Case]:
    """Every variant x {causal, full} x KV heads in float64, and every variant in the float32 slice."""
    out = [Case(world, a, u, r, o, t, c, kv, "float64", ro)
           for (a, u, r, o, t, ro) in _variants(world) for c in (False, True) for kv in KV_HEADS]
    return out + [Case(world, a, u, r, o, t, *FLOAT32_SLICE, "float32", ro) for (a, u, r, o, t, ro) in _variants(world)]


ALL_CASES = [c for w in WORLDS for c in cases(w)]


def _inputs(case: Case):
    """Global q, k, v and upstream gradient in float64, the same in parent and children."""
    g = torch.Generator().manual_seed(1000 * case.kv_heads + 7 * SEQ + case.causal)
    q = torch.randn(BATCH, SEQ, HEADS, HEAD_DIM, generator=g, dtype=torch.float64)
    k = torch.randn(BATCH, SEQ, case.kv_heads, HEAD_DIM, generator=g, dtype=torch.float64)
    v = torch.randn(BATCH, SEQ, case.kv_heads, HEAD_DIM, generator=g, dtype=torch.float64)
    dout = torch.randn(BATCH, SEQ, HEADS, HEAD_DIM, generator=g, dtype=torch.float64)
    return q, k, v, dout


def _tokens(case: Case, rank: int) -> np.ndarray:
    """Global token indices rank ``rank`` holds for this case."""
    if case.algorithm == "ring":
        order = case.ring_order or tuple(range(case.world))
        return ring_tokens(case.token_layout, case.world, SEQ)[order.index(rank)]
    if case.algorithm == "ulysses":
        return sp_tokens("contiguous", case.world, 1, SEQ)[0, rank]
    return case.layout.tokens(rank, SEQ)


def _group_ranks(case: Case) -> list[tuple[int, ...]]:
    """Every group of size > 1 that this case's world needs (all ranks create all of them)."""
    if case.algorithm != "usp":
        return []
    lay = case.layout
    return [tuple(g) for dim in ("ulysses", "ring") for g in lay.groups(dim) if len(g) > 1]


def _run_cases(rank: int, world: int, todo: list[Case]):
    groups: dict[tuple[int, ...], dist.ProcessGroup] = {}
    for case in todo:  # same order on every rank: new_group is collective
        for ranks in _group_ranks(case):
            if ranks not in groups and ranks != tuple(range(world)):
                groups[ranks] = dist.new_group(list(ranks))
    groups[tuple(range(world))] = dist.group.WORLD
    results = []
    for case in todo:
        dt = DTYPES[case.dtype]
        tok = torch.as_tensor(np.array(_tokens(case, rank)))
        q, k, v, dout = (x[:, tok].to(dt).requires_grad_(i < 3) for i, x in enumerate(_inputs(case)))
        if case.algorithm == "usp":
            lay = case.layout
            pg = {d: groups[tuple(lay.group_of(d, rank))] if lay.degree(d) > 1 else None for d in ("ulysses", "ring")}
            ranks = {d: lay.group_of(d, rank) for d in ("ulysses", "ring")}  # as runtime.context passes them
        else:
            pg = {case.algorithm: dist.group.WORLD}
            ranks = {"ring": list(case.ring_order)} if case.ring_order else None
        out = attention(q, k, v, algorithm=case.algorithm, groups=pg, ranks=ranks, causal=case.causal,
                        token_layout=case.token_layout)
        out.backward(dout)
        results.append((tok.numpy(), out.detach(), q.grad, k.grad, v.grad))
    return results


@once
def world_results(world: int) -> dict[str, tuple]:
    """Run every case of ``world`` in one gloo world; per case, global (out, dq, dk, dv)."""
    return gathered_attention(_run_cases, world, cases(world), _inputs, SEQ)


@lru_cache(maxsize=None)
def reference(case: Case):
    """F.scaled_dot_product_attention on the full sequence in float64, with its gradients."""
    q, k, v, dout = _inputs(case)
    return sdpa_reference(q, k, v, dout, case.causal)


@shared_world("runtime_exact")
@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.id)
def test_exact_against_single_process(case: Case):
    got = world_results(case.world)[case.id]
    ref = reference(case)
    wrong = mismatches(got, ref, ("out", "dq", "dk", "dv"), case.dtype,
                       attention_terms(SEQ, HEAD_DIM, HEADS // case.kv_heads), case.id)
    assert not wrong, "\n".join(wrong)


def test_matrix_covers_every_variant():
    ids = {(c.world, c.algorithm, c.order[0] if c.algorithm == "usp" and c.ulysses > 1 and c.ring > 1 else "",
            c.token_layout) for c in ALL_CASES}
    for w in (2, 4, 8):
        for t in TOKEN_LAYOUTS:
            assert (w, "ring", "", t) in ids
        assert (w, "ulysses", "", "contiguous") in ids
    for w in (4, 8):
        for t in TOKEN_LAYOUTS:
            assert (w, "usp", "ulysses", t) in ids and (w, "usp", "ring", t) in ids
    for dtype in DTYPES:  # every variant in both dtypes, the full causal x KV heads product in float64
        assert {_variant(c) for c in ALL_CASES if c.dtype == dtype} == {_variant(c) for c in ALL_CASES}
    full = {(_variant(c), c.causal, c.kv_heads) for c in ALL_CASES if c.dtype == "float64"}
    assert len(full) == len({_variant(c) for c in ALL_CASES}) * 2 * len(KV_HEADS)


def _variant(c: Case) -> tuple:
    """What a case runs, whatever its mask, heads and dtype."""
    return c.world, c.algorithm, c.ulysses, c.ring, c.order, c.token_layout, c.ring_order


# ---------------------------------------------------------------- failures end in time

def _ring_with_dead_peer(rank, world, mode):
    q = torch.randn(1, 16, 2, 8)
    if rank == 1:
        if mode == "dead":
            import os
            os._exit(3)
        time.sleep(120)
    return ring_attention(q, q, q, None, causal=True).sum().item()


@pytest.mark.parametrize("mode", ["dead", "hung"])
def test_dead_or_hung_peer_in_ring_ends_with_world_error(mode):
    timeout = 4
    t0 = time.monotonic()
    with pytest.raises(WorldError):
        run_world(_ring_with_dead_peer, 3, mode, timeout=timeout)
    assert time.monotonic() - t0 < 120  # ended by the world's timeout or the death, not by the hung rank's 120 s


# ---------------------------------------------------------------- bad input

def _ulysses_bad_heads(rank, world):
    q = torch.randn(1, 8, 6, 8)
    try:
        ulysses_attention(q, q, q, None)
    except PlanError as e:
        return e.field
    return None


def test_ulysses_heads_not_divisible_is_a_plan_error():
    assert run_world(_ulysses_bad_heads, 4, timeout=30) == ["ulysses"] * 4


def test_unknown_algorithm_is_a_plan_error():
    q = torch.randn(1, 8, 2, 4)
    with pytest.raises(PlanError, match="algorithm"):
        attention(q, q, q, algorithm="wallfacer-typo", groups={}, ranks=None, causal=False, token_layout="contiguous")


@pytest.mark.parametrize("algorithm", ["ring", "ulysses", "usp"])
def test_degree_one_is_local_attention_without_a_process_group(algorithm):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 16, 4, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = attention(q, k, v, algorithm=algorithm, groups={}, ranks=None, causal=True, token_layout="zigzag")
    ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    assert torch.allclose(out, ref.transpose(1, 2), atol=1e-12)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    refs = torch.autograd.grad(ref.sum(), (q, k, v))
    for a, b in zip(grads, refs):
        assert torch.allclose(a, b, atol=1e-12)


def _ulysses_uneven_kv(rank, world, q, k, v, dout):
    s = q.shape[1] // world
    part = [x[:, rank * s:(rank + 1) * s].clone().requires_grad_(i < 3) for i, x in enumerate((q, k, v, dout))]
    out = ulysses_attention(*part[:3], None, causal=True)
    out.backward(part[3])
    return out.detach(), part[0].grad, part[1].grad, part[2].grad


def test_ulysses_gqa_kv_heads_that_split_neither_way():
    """12 query heads, 3 KV heads, degree 4: each rank gets one KV head per query head (replicated)."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 16, 12, 4, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 16, 3, 4, generator=g, dtype=torch.float64) for _ in range(2))
    dout = torch.randn(1, 16, 12, 4, generator=g, dtype=torch.float64)
    res = run_world(_ulysses_uneven_kv, 4, q, k, v, dout, timeout=30)
    got = [torch.cat([r[i] for r in res], dim=1) for i in range(4)]
    for a, b in zip(got, sdpa_reference(q, k, v, dout, causal=True)):
        assert (a - b).abs().max().item() < 1e-10
