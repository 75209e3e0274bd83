"""TokenRing (seeds/001) and TokenRing x Ring: exactness of the runtime, and the planner's schedule.

Runtime: worlds of 4 and 8 gloo ranks, TokenRing on every token layout and the hybrid with teams
of 2 (and 4 at world 8), causal and not, MHA and GQA (8 query heads with 2 and 1 KV heads) in float64,
and each of them once in float32 (causal, GQA), against F.scaled_dot_product_attention in float64 on the full sequence within the rounding
bound of attention's sums (``exact.tolerance``), output and every gradient. One world per world size runs every case.
Planner: the step schedule (Q one way, block out + LSE the other, final hop), its volumes, and
how the HCCS full mesh, the NVSwitch and the PCIe tree price it differently.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pytest
import torch
import torch.distributed as dist

from exact import DTYPES, gathered_attention, attention_terms, mismatches, once, sdpa_reference
from sp_plan.planner.algorithms import ALGORITHMS, load_all
from sp_plan.planner.errors import PlanError
from sp_plan.planner.layout import TOKEN_LAYOUTS, ring_tokens
from sp_plan.runtime.attention import attention
from harness.worlds import run_world
from markers import shared_world

BATCH, SEQ, HEADS, HEAD_DIM = 2, 64, 8, 8
KV_HEADS = (8, 2, 1)


@dataclass(frozen=True)
class Case:
    world: int
    algorithm: str  # tokenring | tokenring_ring
    team: int
    token_layout: str
    causal: bool
    kv_heads: int
    dtype: str
    ring_order: tuple[int, ...] | None = None

    @property
    def id(self) -> str:
        t = f"-team{self.team}" if self.algorithm == "tokenring_ring" else ""
        ro = "" if self.ring_order is None else "-order" + "".join(map(str, self.ring_order))
        return (f"w{self.world}-{self.algorithm}{t}-{self.token_layout}{ro}-{'causal' if self.causal else 'full'}-"
                f"kv{self.kv_heads}-{self.dtype}")


def _variants(world: int):
    out = [("tokenring", world, t, None) for t in TOKEN_LAYOUTS]
    out += [("tokenring_ring", c, t, None) for c in (2, 4) if c < world for t in TOKEN_LAYOUTS]
    if world == 4:  # a ring order other than sorted
        out += [("tokenring", 4, "zigzag", (0, 2, 3, 1)), ("tokenring_ring", 2, "zigzag", (3, 1, 0, 2))]
    return out


def cases(world: int) -> list[Case]:
    """Every variant x {causal, full} x KV heads in float64, and every variant once in float32 (causal, GQA): the
    code is the same in every dtype, the slice checks float32's rounding bound."""
    out = [Case(world, a, team, t, c, kv, "float64", ro) for a, team, t, ro in _variants(world)
           for c in (False, True) for kv in KV_HEADS]
    return out + [Case(world, a, team, t, True, 2, "float32", ro) for a, team, t, ro in _variants(world)]


ALL_CASES = [c for w in (4, 8) for c in cases(w)]


def _inputs(case: Case):
    g = torch.Generator().manual_seed(1000 * case.kv_heads + 7 * SEQ + case.causal)
    q = torch.randn(BATCH, SEQ, HEADS, HEAD_DIM, generator=g, dtype=torch.float64)
    k = torch.randn(BATCH, SEQ, case.kv_heads, HEAD_DIM, generator=g, dtype=torch.float64)
    v = torch.randn(BATCH, SEQ, case.kv_heads, HEAD_DIM, generator=g, dtype=torch.float64)
    dout = torch.randn(BATCH, SEQ, HEADS, HEAD_DIM, generator=g, dtype=torch.float64)
    return q, k, v, dout


def _tokens(case: Case, rank: int) -> np.ndarray:
    order = case.ring_order or tuple(range(case.world))
    return ring_tokens(case.token_layout, case.world, SEQ)[order.index(rank)]


def _run_cases(rank: int, world: int, todo: list[Case]):
    results = []
    for case in todo:
        dt = DTYPES[case.dtype]
        tok = torch.as_tensor(np.array(_tokens(case, rank)))
        q, k, v, dout = (x[:, tok].to(dt).requires_grad_(i < 3) for i, x in enumerate(_inputs(case)))
        ranks = {"ring": list(case.ring_order or range(world))}
        if case.algorithm == "tokenring_ring":
            ranks["team"] = case.team
        out = attention(q, k, v, algorithm=case.algorithm, groups={"ring": dist.group.WORLD}, ranks=ranks,
                        causal=case.causal, token_layout=case.token_layout)
        out.backward(dout)
        results.append((tok.numpy(), out.detach(), q.grad, k.grad, v.grad))
    return results


@once
def world_results(world: int) -> dict[str, list]:
    """Run every case of ``world`` in one gloo world; per case, global (out, dq, dk, dv)."""
    return gathered_attention(_run_cases, world, cases(world), _inputs, SEQ)


@lru_cache(maxsize=None)
def reference(case: Case):
    q, k, v, dout = _inputs(case)
    return sdpa_reference(q, k, v, dout, case.causal)


@shared_world("tokenring")
@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.id)
def test_exact_against_single_process(case: Case):
    got = world_results(case.world)[case.id]
    wrong = mismatches(got, reference(case), ("out", "dq", "dk", "dv"), case.dtype,
                       attention_terms(SEQ, HEAD_DIM, HEADS // case.kv_heads), case.id)
    assert not wrong, "\n".join(wrong)


# ---------------------------------------------------------------- the runtime's schedule

def test_schedule_q_one_way_partials_to_owner_and_zigzag_drops_early_chunks():
    """Step i of position p computes Q_(p+i) on its own K, V; zigzag stops sending a Q's early chunk after position 0."""
    from sp_plan.runtime.variants.tokenring import tokenring_schedule

    P, S = 4, 64
    n = S // P
    for p in range(P):
        steps = tokenring_schedule("zigzag", P, P, S, p, True)
        assert [s.owner for s in steps] == [(p + i) % P for i in range(P)]
        assert all(s.kv == p for s in steps)
        for s in steps[:-1]:
            o = s.owner
            later_positions_before_o = any((o - i) % P < o for i in range(s.i + 1, P))
            assert s.send_q == ((0, n) if later_positions_before_o else (n // 2, n))
        assert steps[-1].send_q is None
    # contiguous causal: Q_o is needed only by positions <= o, so once it has passed position 0 it stops
    steps = tokenring_schedule("contiguous", P, P, S, 0, True)  # position 0 holds K_0, every Q sees it
    assert [s.send_q for s in steps] == [None, None, None, None]
    assert [s.mask is None for s in steps] == [False, False, False, False]
    steps = tokenring_schedule("contiguous", P, P, S, 3, True)  # holds K_3 and Q_3, Q_0, Q_1, Q_2 in turn
    assert [s.mask is None for s in steps] == [False, True, True, True]
    assert [s.send_q for s in steps] == [(0, n), None, None, None]


def test_hybrid_schedule_holds_outer_ring_blocks():
    from sp_plan.runtime.variants.tokenring import tokenring_schedule

    steps = tokenring_schedule("contiguous", 8, 2, 64, 5, False)  # node 2, inner 1, N = 4 rounds of 2 steps
    assert [(s.j, s.i, s.owner, s.kv) for s in steps] == [
        (0, 0, 5, 5), (0, 1, 4, 5), (1, 0, 5, 3), (1, 1, 4, 3), (2, 0, 5, 1), (2, 1, 4, 1), (3, 0, 5, 7), (3, 1, 4, 7)]


def _bad_team(rank, world):
    from sp_plan.runtime.variants.tokenring import tokenring_ring_attention

    q = torch.randn(1, 4, 2, 4)
    try:
        tokenring_ring_attention(q, q, q, None, team=3)
    except PlanError as e:
        return e.field
    return None


def test_team_not_dividing_the_ring_is_a_plan_error():
    assert run_world(_bad_team, 4, timeout=30) == ["degrees.team"] * 4


# ---------------------------------------------------------------- planner

def _priced(cluster: str, algorithm: str, ring: int, team: int = 1, seq: str = "64k", model: str = "llama2-7b",
            causal: bool = False):
    from sp_plan.planner.estimate import Estimator
    from sp_plan.planner.model import ModelSpec, Workload
    from sp_plan.planner.plan import Plan
    from sp_plan.profiles import preset_cluster

    cl = preset_cluster(cluster)
    mspec = ModelSpec.load(_model_path(model))
    work = Workload(seq_len=seq, batch=1, causal=causal, training=False)
    est = Estimator(cl, mspec, work)
    degrees = {"ring": ring, "dp": cl.world_size // ring, "team": team}
    plan = Plan(algorithm=algorithm, degrees=degrees, order=["ring", "dp"] if ring < cl.world_size else ["ring"],
                token_layout="zigzag" if causal else "contiguous")
    total, phases = est.attention_time(plan)
    comm = sum(p.seconds for p in phases if p.kind == "communication")
    return total, comm, phases


def _model_path(name: str):
    from pathlib import Path

    import sp_plan.profiles as profiles

    return Path(profiles.__file__).parent / "models" / f"{name}.yaml"


def test_registered_with_variants_and_checks():
    load_all()
    assert {"tokenring", "tokenring_ring"} <= set(ALGORITHMS)
    from sp_plan.planner.search import Degrees

    vs = ALGORITHMS["tokenring_ring"].variants(Degrees(1, 1, 1, 1, 8), None, None)
    assert sorted(v.team for v in vs if v.algorithm == "tokenring_ring") == [2, 4]
    assert [v.algorithm for v in ALGORITHMS["tokenring"].variants(Degrees(1, 1, 1, 2, 4), None, None)] == []


def test_steps_carry_q_one_way_and_out_lse_the_other():
    """Per step: Q (b n h d e) to one neighbour and the previous step's (out, lse) the other way, overlapped."""
    from sp_plan.planner.model import ModelSpec, Workload
    from sp_plan.planner.schedules import Comm, Shape
    from sp_plan.planner.tokenring import tokenring_steps

    m = ModelSpec.load(_model_path("llama2-7b"))
    w = Workload(seq_len="32k", batch=1, causal=False, training=True)
    c = Shape(m, w, dp=1, ulysses=1, ring=8, token_layout="contiguous", algorithm="tokenring")
    n, e = 32768 // 8, 2
    qb = n * 32 * 128 * e
    ob = qb + n * 32 * 4
    steps = tokenring_steps(c, backward=False)
    flat = [(st, p) for st in steps for p in st.phases if isinstance(p, Comm)]
    by = {}
    for st, p in flat:
        by.setdefault((p.pattern, p.nbytes), 0)
        by[(p.pattern, p.nbytes)] += st.repeat
    # steps 0, 1: Q only; steps 2..6: Q one way and out+lse the other; step 7: out only; then the final hop
    assert by == {("shift_back", qb): 2, ("shift_bi", ob): 5, ("shift", ob): 2}
    assert sum(st.repeat for st in steps if any(isinstance(p, Comm) for p in st.phases) and st.overlap) == 8
    bwd = tokenring_steps(c, backward=True)
    vols = {p.pattern for st in bwd for p in st.phases if isinstance(p, Comm)}
    assert vols == {"shift_back", "shift_bi", "shift"}


def test_topologies_price_tokenring_differently():
    """Ring sends K, V (2 blocks) P - 1 times one way. TokenRing sends Q (1 block) in steps 0, 1, Q one way
    and out + LSE (1 block + LSE) the other in steps 2 .. P - 2, out + LSE in step P - 1 and the final hop.
    HCCS full mesh: the two directions use different links, so a bidirectional step costs one block and
    TokenRing's communication is (P + 1) / (2 (P - 1)) of Ring's (9/14 at P = 8). NVSwitch port and PCIe
    uplink: Q and out leave the device on the same link direction, a bidirectional step costs two blocks
    and TokenRing is no cheaper than Ring (ratio about 1)."""
    from sp_plan.profiles import preset_cluster

    lse = 4 / (128 * 2)  # LSE (fp32 per head and token) over a bf16 block row of head dim 128
    ratio, expect = {}, {}
    for cluster in ("ascend-910b-8", "dgx-h100", "a10-4-pcie"):
        P = preset_cluster(cluster).world_size
        _, ring_comm, _ = _priced(cluster, "ring", P)
        _, tr_comm, _ = _priced(cluster, "tokenring", P)
        ratio[cluster] = tr_comm / ring_comm
        both = P - 3  # steps 2 .. P - 2
        shared_port = cluster != "ascend-910b-8"
        expect[cluster] = (2 + (2 if shared_port else 1) * both * (1 + lse) + 2 * (1 + lse)) / (2 * (P - 1))
    for cluster in ratio:
        assert ratio[cluster] == pytest.approx(expect[cluster], rel=5e-3), cluster  # + link latency
    assert ratio["ascend-910b-8"] == pytest.approx(9 / 14 * (1 + lse * 7 / 9), rel=2e-3)
    assert ratio["dgx-h100"] > 1.0 and ratio["a10-4-pcie"] > 1.0
    # what it means for a whole attention layer on the full mesh: TokenRing is faster than Ring when
    # communication dominates (inference prefill, 64k tokens of Llama-2-7B, no compute hiding it all)
    t_ring, _, _ = _priced("ascend-910b-8", "ring", 8, seq="16k")
    t_tr, _, _ = _priced("ascend-910b-8", "tokenring", 8, seq="16k")
    assert t_tr < t_ring


def test_hybrid_uses_team_and_team_ring_groups_and_search_ranks_it():
    from sp_plan.planner.model import ModelSpec, Workload
    from sp_plan.planner.search import grid_search
    from sp_plan.profiles import preset_cluster

    _, _, phases = _priced("ascend-910b-8", "tokenring_ring", 8, team=4)
    groups = {p.group for p in phases if p.kind == "communication"}
    assert groups == {"team", "team_ring"}
    cl = preset_cluster("ascend-910b-8")
    m = ModelSpec.load(_model_path("llama2-7b"))
    w = Workload(seq_len="128k", batch=1, causal=True, training=True)
    res = grid_search(cl, m, w, keep=None)
    algs = {c.algorithm for _, c in res.ranked}
    assert {"tokenring", "tokenring_ring", "ring"} <= algs


@pytest.mark.parametrize("ring,team", [(4, 2), (8, 2), (8, 4)])
def test_layout_team_ring_groups_are_the_runtimes_rings_across_teams(ring, team):
    """The ``team_ring`` a breakdown row names (and `show` lists) is the ring the runtime shifts K, V over: member a
    of every team of consecutive positions, ``team`` positions apart, in each ring group."""
    from sp_plan.planner.layout import Layout, ring_split

    lay = Layout({"tp": 2, "ring": ring, "team": team}, ("tp", "ring"), "zigzag")
    across = lay.groups("team_ring")
    assert sorted(r for g in across for r in g) == list(range(2 * ring))
    for g in lay.groups("ring"):
        expect = [[g[a + t * team] for t in range(ring // team)] for a in range(team)]
        assert all(e in across for e in expect)
    size, step = ring_split(ring, team, None, "team_ring")
    assert all(len(g) == size and {b - a for a, b in zip(g, g[1:])} == {step * 2} for g in across)


def test_tokenring_plan_needs_ulysses_one():
    from sp_plan.planner.candidate import Candidate

    load_all()
    with pytest.raises(PlanError, match="ulysses"):
        ALGORITHMS["tokenring"].check(Candidate("tokenring", ulysses=2, ring=4), None, None)
    with pytest.raises(PlanError, match="team"):
        ALGORITHMS["tokenring_ring"].check(Candidate("tokenring_ring", ring=4, team=3), None, None)
    for ring in (1, 2):  # no team size lies in [2, ring / 2]: the ring is what to change
        with pytest.raises(PlanError, match="set ring to 4 or more") as e:
            ALGORITHMS["tokenring_ring"].check(Candidate("tokenring_ring", ring=ring, team=1), None, None)
        assert e.value.field == "degrees.ring"


def test_team_size_from_ranks_entry():
    from sp_plan.runtime.variants.tokenring import _team_from

    assert _team_from({"ring": [0, 1, 2, 3], "team": 2}, None) == 2
    assert _team_from({"ring": [0, 1, 2, 3], "team": [2, 3]}, None) == 2


def _through_context(rank, world, plans):
    from sp_plan.runtime import init

    g = torch.Generator().manual_seed(4)
    q, k, v, dout = (torch.randn(2, 32, h, 8, generator=g, dtype=torch.float64) for h in (4, 2, 2, 4))
    out = []
    for p in plans:
        ctx = init(p)
        ql, kl, vl = (ctx.shard(x).requires_grad_() for x in (q, k, v))
        o = ctx.attention(ql, kl, vl, causal=True)
        o.backward(ctx.shard(dout))
        out.append([ctx.gather(t.detach()) for t in (o, ql.grad, kl.grad, vl.grad)])
    return out


def test_plans_run_through_init_and_context_attention():
    """Plans with algorithm tokenring / tokenring_ring, ring groups inside dp: ctx.attention is exact."""
    from sp_plan.planner.plan import Plan

    plans = [Plan(algorithm="tokenring", degrees={"ring": 4, "dp": 2}, order=["ring", "dp"], token_layout="zigzag"),
             Plan(algorithm="tokenring_ring", degrees={"ring": 4, "team": 2, "dp": 2}, order=["dp", "ring"],
                  token_layout="striped")]
    res = run_world(_through_context, 8, plans, timeout=120)
    g = torch.Generator().manual_seed(4)
    q, k, v, dout = (torch.randn(2, 32, h, 8, generator=g, dtype=torch.float64) for h in (4, 2, 2, 4))
    refs = sdpa_reference(q, k, v, dout, causal=True)
    for rank_res in res:
        for per_plan in rank_res:
            for got, r in zip(per_plan, refs):
                assert (got - r).abs().max().item() < 1e-10
