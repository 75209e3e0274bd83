"""WallFacer (seeds/000): rank arithmetic (Algorithms 2-3), the schedule's eqs. 2-4 and model M, the memory
of eqs. 6-7, the search's variants, and the runtime's exactness against single-process attention.

Exactness matrix: worlds 4 and 8, C = 1 (Ring) and C = 2 under both placements of eq. 8, contiguous,
zigzag and striped layouts, causal and not, MHA and GQA (8 query heads with 2 and 1 KV heads) in float64,
and each team size, placement and layout once in float32 (causal, GQA), against F.scaled_dot_product_attention in float64 within the rounding bound of attention's sums
(``exact.tolerance``); a world of 16 runs
P/C^2 = 4 sub-ring rounds and teams of 4. One gloo world per world size; cases loop inside it.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pytest
import torch
import torch.distributed as dist

from exact import DTYPES, assemble, attention_terms, mismatches, once, sdpa_reference
from sp_plan.planner import Candidate, Estimator, Plan, PlanError, Workload
from sp_plan.planner.algorithms import ALGORITHMS, variants
from sp_plan.planner.engine import LinkEngine
from sp_plan.planner.estimate import Orders
from sp_plan.planner.layout import (PLACEMENTS, TOKEN_LAYOUTS, Layout, busiest_team_block, init_recv, init_send,
                                    p2p_neighbours, sub_ring_positions, team_coords, team_positions, team_tokens,
                                    team_work, wallfacer_pairs, wallfacer_round_work)
from sp_plan.planner.memory import activation_bytes, layer_activation_bytes_per_token
from sp_plan.planner.schedules import Comm, Compute, Shape, attention_flops, attention_steps
from sp_plan.planner.search import Degrees, grid_search
from sp_plan.planner.wallfacer import buffer_parts, sizes
from sp_plan.profiles import load_cluster, load_model
from sp_plan.runtime.attention import attention
from harness.worlds import run_world
from markers import shared_world

GiB = 2**30


# ---------------------------------------------------------------- rank arithmetic (Sec. 3.3)

def _paper_init_send(r_t, r_a, d_t, d_a):
    """Algorithm 2 (get_init_send) as printed: inter-team rank r_t, intra-team rank r_a."""
    team_group_size = d_t // d_a
    target_team = r_a * team_group_size + r_t // d_a
    return target_team * d_a + r_t % d_a


def _paper_p2p(r_t, r_a, d_t, d_a):
    """Algorithm 3 (get_P2P_config) as printed."""
    tgs = d_t // d_a
    g = r_t // tgs
    nxt = (r_t + 1) % tgs + tgs * g
    last = (r_t - 1) % tgs + tgs * g
    return r_a + nxt * d_a, r_a + last * d_a


RINGS = [(4, 1), (4, 2), (8, 2), (16, 2), (16, 4), (32, 2), (64, 4), (64, 8)]


@pytest.mark.parametrize("P,C", RINGS)
def test_algorithms_2_and_3_as_printed_for_teams_inside_a_node(P, C):
    """collective_intra numbers members team-major (global rank = team * C + a), the paper's setting."""
    for p in range(P):
        t, a = team_coords(P, C, "collective_intra", p)
        assert p == t * C + a
        assert init_send(P, C, "collective_intra", p) == _paper_init_send(t, a, P // C, C)
        assert p2p_neighbours(P, C, "collective_intra", p) == _paper_p2p(t, a, P // C, C)


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("P,C", RINGS)
def test_teams_and_sub_rings_partition_the_ring(P, C, placement):
    teams, subs = team_positions(P, C, placement), sub_ring_positions(P, C, placement)
    assert sorted(p for t in teams for p in t) == list(range(P)) and all(len(t) == C for t in teams)
    assert sorted(p for s in subs for p in s) == list(range(P)) and all(len(s) == P // C**2 for s in subs)
    for s in subs:  # a sub-ring is one member index of P/C^2 distinct teams, linked by Algorithm 3
        assert len({team_coords(P, C, placement, p)[1] for p in s}) == 1
        assert len({team_coords(P, C, placement, p)[0] for p in s}) == len(s)
        for i, p in enumerate(s):
            assert p2p_neighbours(P, C, placement, p) == (s[(i + 1) % len(s)], s[(i - 1) % len(s)])
    # Algorithm 2 is a permutation; init_recv is its inverse
    send = [init_send(P, C, placement, p) for p in range(P)]
    assert sorted(send) == list(range(P))
    assert all(init_recv(P, C, placement, send[p]) == p for p in range(P))


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_figure_5_initial_placement_of_8_gpus_in_4_sub_rings(placement):
    """Fig. 5 (P=8, C=2): each team member holds a different shard, and no two teams of a sub-ring hold the same."""
    P, C = 8, 2
    holder_team = {init_send(P, C, placement, p): team_coords(P, C, placement, p)[0] for p in range(P)}
    for t in team_positions(P, C, placement):
        assert len({holder_team[p] for p in t}) == C
    for s in sub_ring_positions(P, C, placement):
        assert len({holder_team[p] for p in s}) == len(s)
    assert len(sub_ring_positions(P, C, placement)) == 4


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("P,C", RINGS)
def test_every_team_block_pair_is_computed_once_forward_and_backward(P, C, placement):
    """P/C^2 rounds on P ranks cover all (P/C)^2 (query team, K/V team) pairs exactly once (Sec. 3.2.1)."""
    for backward in (False, True):
        pairs = wallfacer_pairs(P, C, placement, backward).reshape(-1, 2)
        assert len({tuple(x) for x in pairs}) == len(pairs) == (P // C) ** 2
    # forward dynamics: round r holds the K, V that Algorithm 2 seeded r hops back along the sub-ring
    fwd = wallfacer_pairs(P, C, placement)
    for p in range(P):
        src = p
        for r in range(P // C**2):
            seeded_by = init_recv(P, C, placement, src)
            assert fwd[p, r, 1] == team_coords(P, C, placement, seeded_by)[0]
            assert fwd[p, r, 0] == team_coords(P, C, placement, p)[0]
            src = p2p_neighbours(P, C, placement, src)[1]


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_layout_groups_follow_the_placement_convention_of_the_estimator(placement):
    """Layout.groups(("team",)) is the estimator's team shape; sub-rings lie at its sub-ring stride."""
    lay = Layout({"ring": 16, "team": 2, "dp": 2}, ("dp", "ring"), "zigzag", placement)
    eng = LinkEngine(load_cluster("dgx-h100", 4))
    orders = Orders(eng, lay.degrees, [("dp", "ring")], placement)
    team_shape, sub_shape = orders.shape(0, ("team",)), orders.shape(0, ("sub_ring",))
    assert sorted(map(sorted, lay.groups("team"))) == sorted(sorted(team_shape.group_of(r)) for r in range(32)
                                                            if team_shape.locate(r)[1] == 0)
    (size, stride), = sub_shape.parts
    for g in lay.groups("sub_ring"):
        assert len(g) == 16 // 4 and all(b - a == stride for a, b in zip(g, g[1:]))
        assert set(g) <= set(sub_shape.group_of(g[0]))
    assert lay.all_groups()["team"] == lay.groups("team")
    # Plan.layout passes the placement through
    plan = Plan(algorithm="wallfacer", degrees={"ring": 16, "team": 2, "dp": 2}, order=["dp", "ring"],
                placement=placement)
    assert plan.layout().groups("sub_ring") == lay.groups("sub_ring")
    assert plan.with_groups().groups["sub_ring"] == lay.groups("sub_ring")


def test_estimator_sub_ring_has_P_over_C_squared_ranks():
    eng = LinkEngine(load_cluster("dgx-h100", 4))
    for placement in PLACEMENTS:
        lay = Layout({"ring": 16, "team": 2}, ("ring",), placement=placement)
        o = Orders(eng, {"ring": 16, "team": 2}, [("ring",)], placement)
        for name in ("sub_ring", "team"):
            sh = o.shape(0, (name,))
            assert sh.size == (16 // 4 if name == "sub_ring" else 2)
            assert [list(sh.group_of(g[0])) for g in lay.groups(name)] == lay.groups(name)


def test_layout_rejects_bad_teams():
    with pytest.raises(PlanError, match="degrees.team"):
        Layout({"ring": 8, "team": 4}, ("ring",), placement="collective_intra")
    with pytest.raises(PlanError, match="degrees.team"):  # teams of 4 in a ring of 8 are TokenRing's, not WallFacer's
        Layout({"ring": 8, "team": 4}, ("ring",)).groups("sub_ring")
    assert Layout({"ring": 8, "team": 4}, ("ring",)).groups("team") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(PlanError, match="placement"):
        Layout({"ring": 8, "team": 2}, ("ring",), placement="nowhere")
    # C = 1: teams of one, the sub-ring is the ring
    lay = Layout({"ring": 4}, ("ring",))
    assert lay.groups("team") == [[0], [1], [2], [3]] and lay.groups("sub_ring") == [[0, 1, 2, 3]]


@pytest.mark.parametrize("layout", TOKEN_LAYOUTS)
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_round_work_matches_brute_force_and_closed_form(layout, placement):
    P, C, S = 16, 2, 16 * 8
    tok = team_tokens(layout, P, C, placement, S)
    n = tok.shape[1]
    brute = np.array([[(tok[T][None, :] <= tok[t][:, None]).sum() / n**2 for T in range(P // C)]
                      for t in range(P // C)])
    for backward in (False, True):
        pairs = wallfacer_pairs(P, C, placement, backward)
        want = brute[pairs[..., 0], pairs[..., 1]].max(axis=0)
        assert np.allclose(wallfacer_round_work(layout, P, C, placement, S, True, backward), want)
    for P, C in ((64, 2), (64, 4), (256, 4), (64, 8)):
        S = P * 64
        assert max(wallfacer_round_work(layout, P, C, placement, S, True)) == pytest.approx(
            busiest_team_block(layout, P, C, placement, S))
    assert wallfacer_round_work(layout, 16, 2, placement, 256, causal=False) == [1.0] * 4


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_round_work_reads_the_team_orders_of_wallfacer_pairs(placement):
    """The round work reads which team orders each round's pairs hold without building ``wallfacer_pairs`` (the
    runtime's pairs): the same floats as indexing ``team_work`` with the pairs, for every ring and team."""
    for P in (4, 8, 16, 32, 64, 128):
        for C in (c for c in range(1, P + 1) if P % (c * c) == 0):
            for layout in TOKEN_LAYOUTS:
                w = team_work(layout, P, C, placement, P * 64)
                for backward in (False, True):
                    pairs = wallfacer_pairs(P, C, placement, backward)
                    want = [float(x) for x in w[pairs[..., 0], pairs[..., 1]].max(axis=0)]
                    assert wallfacer_round_work(layout, P, C, placement, P * 64, True, backward) == want


def test_zigzag_dataloader_balances_every_round():
    """Sec. 3.5 / Fig. 6: zigzag gives every rank about half a team block in every round; contiguous
    teams of adjacent ranks leave whole blocks to some rank."""
    zz = wallfacer_round_work("zigzag", 8, 2, "collective_intra", 8 * 64, True)
    assert all(0.5 <= f <= 0.5 + 1 / (2 * 64 * 2) + 1e-12 for f in zz)
    assert wallfacer_round_work("contiguous", 8, 2, "collective_intra", 8 * 64, True) == [1.0, 1.0]


# ---------------------------------------------------------------- schedule: eqs. 2-4, model M

def _model_m(C: int, algorithm: str = "wallfacer", causal=False, layout="contiguous", placement="collective_intra"):
    m = load_model("llama-30b")
    assert (m.hidden, m.layers) == (6656, 64)
    return Shape(m, Workload(seq_len=65536, batch=1, causal=causal), dp=1, ulysses=1, ring=64, token_layout=layout,
                 algorithm=algorithm, team=C, placement=placement)


def _comms(steps):
    return [(p, st.repeat) for st in steps for p in st.phases if isinstance(p, Comm)]


def _sent(p: Comm, n: int) -> float:
    """Bytes a rank sends in one phase: ring collectives send (n-1)/n of the gathered size, p2p all of it."""
    return p.nbytes * (n - 1) / n if p.pattern in ("all_gather", "reduce_scatter") else p.nbytes


def test_model_M_ring_volume_eq2():
    """Eq. 2: P rounds of 2BNH/P -> 2BNH = 1.625 GiB for model M."""
    c = _model_m(1, "ring")
    (send, k), = _comms(attention_steps(c, backward=False))
    assert send.nbytes == 2 * 65536 * 6656 * 2 / 64
    assert 64 * send.nbytes / GiB == pytest.approx(1.625)


def test_model_M_wallfacer_volumes_eqs_3_and_4():
    """Eq. 3: 4BNH(C-1)/P collective elements = 0.152 GiB in bf16; eq. 4: P/C^2 sends of 2CBNH/P = 0.406 GiB (model
    M, C=4). The runtime reduce-scatters the out's partials in its fp32 accumulators, 4 bytes an element."""
    c = _model_m(4)
    comms = _comms(attention_steps(c, backward=False))
    B, N, H, P, C, e = 1, 65536, 6656, 64, 4, 2
    team = [(p, k) for p, k in comms if p.dim == ("team",) and "lse" not in p.name]
    elements = sum(_sent(p, C) * k / (4 if "out" in p.name else e) for p, k in team)
    assert elements == 4 * B * N * H * (C - 1) / P
    assert elements * e / GiB == pytest.approx(0.152, abs=5e-4)
    collective = sum(_sent(p, C) * k for p, k in team)
    assert collective == B * N * H * (C - 1) / P * (3 * e + 4)  # Q, K, V in bf16, the out's partials in fp32
    lse = sum(_sent(p, C) * k for p, k in comms if "lse" in p.name)
    assert lse < 0.02 * collective  # the LSE the combine needs: 4-byte floats per head, not per channel
    p2p = [(p, k) for p, k in comms if p.dim != ("team",)]
    assert sum(k for _, k in p2p) == P // C**2  # Algorithm 2's placement + P/C^2 - 1 sub-ring hops
    assert all(p.nbytes == 2 * C * B * N * H / P * e for p, _ in p2p)
    assert sum(p.nbytes * k for p, k in p2p) / GiB == pytest.approx(0.406, abs=5e-4)
    ring = 2 * B * N * H * e
    assert ring / sum(p.nbytes * k for p, k in p2p) == C  # Ring sends C times more
    assert (elements * e + sum(p.nbytes * k for p, k in p2p)) / GiB == pytest.approx(0.558, abs=1e-3)


def test_eq3_collective_time_on_a_node():
    """Eq. 3 as time: team all-gather + reduce-scatter inside an NVSwitch node cost their bytes over W + latencies:
    Q, K, V's 3BNH(C-1)/P in bf16 and the out's BNH(C-1)/P in the runtime's fp32 accumulators."""
    c = _model_m(4)
    eng = LinkEngine(load_cluster("dgx-h100", 8))
    orders = Orders(eng, {"ring": 64, "team": 4}, [("ring",)], "collective_intra")
    W, L = 450e9, 4e-6
    phases = [p for p, _ in _comms(attention_steps(c, backward=False)) if p.dim == ("team",) and "lse" not in p.name]
    t = sum(float(orders.time(p)[0]) for p in phases)
    assert t == pytest.approx(65536 * 6656 * 3 / 64 * (3 * 2 + 4) / W + 2 * 3 * L)


def test_schedule_rounds_blocks_and_backward_phases():
    c = _model_m(4, causal=True, layout="zigzag")
    fwd, bwd = attention_steps(c, backward=False), attention_steps(c, backward=True)
    rounds = [st for st in fwd if any(isinstance(p, Compute) for p in st.phases)]
    assert sum(st.repeat for st in rounds) == 64 // 16  # P/C^2 rounds
    assert sum(st.repeat for st in rounds if st.overlap) == 64 // 16 - 1  # double-buffered, the last sends nothing
    attn = lambda p: isinstance(p, Compute) and p.kind == "attention"  # noqa: E731 (not the memory-bound merges)
    comp = [p for st in rounds for p in st.phases if attn(p)]
    # causal: a team block (C N/P tokens) reduced as its C^2 ring blocks of N/P, one kernel call each
    assert all(p.block == 65536 / 64 and p.calls == 16 for p in comp)
    nc_comp = [p for st in attention_steps(_model_m(4), False) for p in st.phases if attn(p)]
    assert all(p.block == 4 * 65536 / 64 and p.calls == 1 for p in nc_comp)  # full attention: one call
    full = attention_flops(4 * 1024, 4 * 1024, 52, 128, 1)
    want = wallfacer_round_work("zigzag", 64, 4, "collective_intra", 65536, True)
    got = [p.flops / full for st in rounds for p in st.phases if attn(p) for _ in range(st.repeat)]
    assert got == pytest.approx(want)
    # non-causal: the same attention FLOPs as Ring, in C^2 times fewer, C^2 times larger blocks
    nc = [p for st in attention_steps(_model_m(4), False) for p in st.phases if attn(p)
          for _ in range(st.repeat)]
    ring = [p for st in attention_steps(_model_m(1, "ring"), False) for p in st.phases if attn(p)
            for _ in range(st.repeat)]
    assert sum(p.flops for p in nc) == pytest.approx(sum(p.flops for p in ring))
    names = [p.name for st in bwd for p in st.phases if isinstance(p, Comm)]
    assert names == ["wallfacer all-gather q,k,v,out,dout", "wallfacer kv placement bwd", "wallfacer sub-ring p2p bwd",
                     "wallfacer sub-ring dq home", "wallfacer dk,dv return", "wallfacer reduce-scatter dq,dk,dv"]
    s = sizes(c)
    (hop,) = [p for p, _ in _comms(bwd) if p.name == "wallfacer sub-ring p2p bwd"]
    assert hop.nbytes == 3 * s["q"] + s["lse"] + 2 * s["q"]  # Q, O, dO and LSE ahead, fp32 dQ behind (K, V stay)


# ---------------------------------------------------------------- memory: eqs. 5-7

def test_peak_activations_eqs_6_and_7_model_M():
    """A = BNH/P (eq. 5). Y+1 checkpoints plus Q, K, V: Ring (Y+4)A = 68A, WallFacer (Y+3C+1)A = 77A."""
    ring, wall = _model_m(1, "ring"), _model_m(4)
    A = 1 * 65536 * 6656 / 64 * 2
    tokens = 65536 / 64
    per_layer = layer_activation_bytes_per_token(ring) * tokens
    checkpoints = activation_bytes(ring, "full", True)["activations"] - per_layer  # Y layer inputs
    assert checkpoints == 64 * A
    m = ring.model
    qkv = (m.q_dim + 2 * m.kv_dim) * tokens * ring.e  # the memory model's per-layer Q, K, V
    assert qkv == 3 * A
    copies = buffer_parts(wall, True)["forward"]["q,k,v team copies"]
    assert copies == 3 * (4 - 1) * A  # C copies of Q, K, V: the all-gather adds C-1
    assert buffer_parts(_model_m(1), True)["forward"]["q,k,v team copies"] == 0  # C = 1 gathers nothing
    pm_ring = (checkpoints + A + qkv) / A
    pm_wall = (checkpoints + A + qkv + copies) / A
    assert (pm_ring, pm_wall) == (68, 77)
    assert 9 / 68 < 0.1324  # "the extra memory cost compared with Ring Attention is less than 13.2%" (of activations)


def test_estimator_memory_counts_the_team_copies():
    cl = load_cluster("dgx-h100", 8)
    m = load_model("llama-30b")
    est = Estimator(cl, m, Workload(seq_len=65536, causal=True))
    base = dict(ring=64, order=("ring",), token_layout="zigzag", zero_stage=2, checkpointing="full")
    ring = est.memory(Candidate("ring", **base))
    wall = est.memory(Candidate("wallfacer", team=4, placement="collective_intra", **base))
    assert wall["attention buffers"] > ring["attention buffers"]
    assert {k: v for k, v in wall.items() if k != "attention buffers"} == \
        {k: v for k, v in ring.items() if k != "attention buffers"}


# ---------------------------------------------------------------- registry and search

def test_variants_cover_every_team_size_and_both_placements():
    m, w = load_model("gpt-7b"), Workload(seq_len=131072)
    got = lambda r, u=1: sorted((v.team, v.placement) for v in variants(Degrees(1, 1, 1, u, r), m, w)  # noqa: E731
                               if v.algorithm == "wallfacer")
    assert got(16) == sorted((C, p) for C in (2, 4) for p in PLACEMENTS)
    assert got(8) == got(4) == sorted((2, p) for p in PLACEMENTS)
    assert got(64) == sorted((C, p) for C in (2, 4, 8) for p in PLACEMENTS)
    assert got(2) == [] and got(8, u=2) == []
    check = ALGORITHMS["wallfacer"].check
    with pytest.raises(PlanError, match="degrees.team"):
        check(Candidate("wallfacer", ring=8, team=4), m, w)
    with pytest.raises(PlanError, match="degrees.ulysses"):
        check(Candidate("wallfacer", ring=4, ulysses=2, team=2), m, w)


def test_search_ranks_wallfacer_beside_ring():
    cl, m = load_cluster("a100-16-eth100", 4), load_model("gpt-7b")
    res = grid_search(cl, m, Workload(seq_len=131072), keep=None)
    found = {(c.team, c.placement) for _, c in res.ranked if c.algorithm == "wallfacer"}
    assert {(C, p) for C in (2, 4) for p in PLACEMENTS} <= found
    plan = next(c for _, c in res.ranked if c.algorithm == "wallfacer").to_plan()
    pred = res.estimator(plan)
    names = {ph.name for ph in pred.breakdown}
    assert "wallfacer all-gather q,k,v" in names and "wallfacer reduce-scatter out" in names


# ---------------------------------------------------------------- runtime exactness

BATCH, SEQ, HEADS, HEAD_DIM = 2, 64, 8, 8
KV_HEADS = (8, 2, 1)


@dataclass(frozen=True)
class Case:
    world: int
    team: int
    placement: str | None
    token_layout: str
    causal: bool
    kv_heads: int
    dtype: str
    dp: int = 1  # data-parallel replicas outside (or, dp_inner, inside) the ring
    dp_inner: bool = False
    via_context: bool = False  # through runtime.init(plan) and ctx.attention

    @property
    def ring(self) -> int:
        return self.world // self.dp

    @property
    def id(self) -> str:
        dp = f"-dp{self.dp}{'in' if self.dp_inner else 'out'}" if self.dp > 1 else ""
        ctx = "-ctx" if self.via_context else ""
        return (f"w{self.world}-C{self.team}-{self.placement or 'ring'}{dp}{ctx}-{self.token_layout}-"
                f"{'causal' if self.causal else 'full'}-kv{self.kv_heads}-{self.dtype}")

    @property
    def plan(self) -> Plan:
        order = ["dp", "ring"] if self.dp_inner else ["ring", "dp"]
        return Plan(algorithm="wallfacer", degrees={"ring": self.ring, "team": self.team, "dp": self.dp},
                    order=order, token_layout=self.token_layout, placement=self.placement)


def cases(world: int) -> list[Case]:
    teams = [(1, None), (2, "collective_intra"), (2, "p2p_intra")]
    out = [Case(world, C, pl, t, c, kv, "float64") for C, pl in teams for t in TOKEN_LAYOUTS for c in (False, True)
           for kv in KV_HEADS]
    out += [Case(world, C, pl, t, True, 2, "float32") for C, pl in teams for t in TOKEN_LAYOUTS]  # the float32 slice
    if world == 8:  # rings of 4 inside a world of 8, built by runtime.init from a plan
        out += [Case(8, 2, pl, "zigzag", True, kv, "float64", dp=2, dp_inner=inner, via_context=True)
                for pl in PLACEMENTS for inner in (False, True) for kv in (8, 1)]
    if world == 16:  # 4 sub-ring rounds (C=2) and teams of 4 (C=4, P/C^2 = 1)
        out = [Case(16, C, pl, t, True, 2, "float64") for C in (2, 4) for pl in PLACEMENTS
               for t in ("contiguous", "zigzag")]
    return out


WORLDS = (4, 8, 16)
ALL_CASES = [c for w in WORLDS for c in cases(w)]


def _inputs(case: Case, replica: int = 0):
    g = torch.Generator().manual_seed(1000 * case.kv_heads + 7 * SEQ + case.causal + 13 * replica)
    q = torch.randn(BATCH, SEQ, HEADS, HEAD_DIM, generator=g, dtype=torch.float64)
    k = torch.randn(BATCH, SEQ, case.kv_heads, HEAD_DIM, generator=g, dtype=torch.float64)
    v = torch.randn(BATCH, SEQ, case.kv_heads, HEAD_DIM, generator=g, dtype=torch.float64)
    dout = torch.randn(BATCH, SEQ, HEADS, HEAD_DIM, generator=g, dtype=torch.float64)
    return q, k, v, dout


def _run_cases(rank: int, world: int, todo: list[Case]):
    from sp_plan.runtime import init

    teams: dict[tuple[int, ...], dist.ProcessGroup] = {}
    for case in todo:  # every rank creates every team group, in the same order
        if case.via_context:
            continue
        for g in case.plan.layout().groups("team"):
            if len(g) > 1 and tuple(sorted(g)) not in teams:
                teams[tuple(sorted(g))] = dist.new_group(sorted(g))
    results = []
    for case in todo:
        dt = DTYPES[case.dtype]
        lay = case.plan.layout()
        replica = lay.coords(rank).get("dp", 0)
        tok = torch.as_tensor(np.array(lay.tokens(rank, SEQ)))
        q, k, v, dout = (x[:, tok].to(dt).requires_grad_(i < 3) for i, x in enumerate(_inputs(case, replica)))
        if case.via_context:
            ctx = init(case.plan)
            for name in ("team", "sub_ring"):
                pg = ctx.group(name)
                assert pg is None or dist.get_process_group_ranks(pg) == sorted(ctx.ranks(name))
            assert ctx.ranks("team") == lay.group_of("team", rank)
            out = ctx.attention(q, k, v, causal=case.causal)
        else:
            team = lay.group_of("team", rank)
            groups = {"ring": dist.group.WORLD, "team": teams.get(tuple(sorted(team)))}
            ranks = {"ring": lay.group_of("ring", rank), "team": team}
            out = attention(q, k, v, algorithm="wallfacer", groups=groups, ranks=ranks, causal=case.causal,
                            token_layout=case.token_layout)
        out.backward(dout)
        results.append((replica, tok.numpy(), out.detach(), q.grad, k.grad, v.grad))
    return results


@once
def world_results(world: int) -> dict[str, list]:
    """Run every case of ``world`` in one gloo world; per case and replica, global (out, dq, dk, dv)."""
    todo = cases(world)
    per_rank = run_world(_run_cases, world, todo, timeout=300)
    out = {}
    for i, case in enumerate(todo):
        fulls = []
        for replica in range(case.dp):
            q, k, v, _ = _inputs(case, replica)
            pieces = [(per_rank[rank][i][1], per_rank[rank][i][2:]) for rank in range(world)
                      if per_rank[rank][i][0] == replica]
            fulls.append(assemble([q, q, k, v], pieces, SEQ, case.id))
        out[case.id] = fulls
    return out


@lru_cache(maxsize=None)
def reference(case: Case, replica: int):
    q, k, v, dout = _inputs(case, replica)
    return sdpa_reference(q, k, v, dout, case.causal)


@shared_world("wallfacer")
@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.id)
def test_exact_against_single_process(case: Case):
    terms = attention_terms(SEQ, HEAD_DIM, HEADS // case.kv_heads)
    wrong = [line for replica, got in enumerate(world_results(case.world)[case.id])
             for line in mismatches(got, reference(case, replica), ("out", "dq", "dk", "dv"), case.dtype, terms,
                                    f"{case.id} replica {replica}")]
    assert not wrong, "\n".join(wrong)


def test_matrix_covers_the_contract():
    ids = {(c.world, c.team, c.placement, c.token_layout, c.causal, c.kv_heads, c.dtype) for c in ALL_CASES}
    for w in (4, 8):
        for C, pl in ((1, None), (2, "collective_intra"), (2, "p2p_intra")):
            for t in TOKEN_LAYOUTS:
                for causal in (False, True):
                    for kv in KV_HEADS:
                        assert (w, C, pl, t, causal, kv, "float64") in ids
                assert (w, C, pl, t, True, 2, "float32") in ids


def _bad_team(rank, world):
    from sp_plan.runtime.variants.wallfacer import wallfacer_attention

    q = torch.randn(1, 8, 2, 4)
    team = [rank - rank % 2, rank - rank % 2 + 1]
    try:
        wallfacer_attention(q, q, q, ring_ranks=[0, 1, 2, 3], team_ranks=team, team_group=None)
    except PlanError as e:
        return e.field
    return None


def test_missing_team_group_is_a_plan_error():
    assert run_world(_bad_team, 4, timeout=30) == ["groups.team"] * 4
