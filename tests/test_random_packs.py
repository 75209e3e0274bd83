"""Seeded random plans and packs through the user's path, on worlds the fixed matrix leaves out.

``tests/test_masked_exact.py`` holds every algorithm x mask on one fixed pack at worlds 1, 2, 4 and 8. Balancer and
layout bugs hide in the packs and worlds nobody wrote down, so here each case draws a plan (data-parallel degree,
Ulysses x ring split, mesh order, token layout) and, per data-parallel replica, its own pack (document cuts, window,
causal or not), on 3, 6 and 8 ranks. Every rank runs what a training script runs: ``init(plan)``, ``ctx.shard`` of
the global q, k, v and upstream gradient, ``ctx.attention``, backward, and ``ctx.gather``; its shard and the
gathered tensors are compared in float64 with single-device masked attention. The seeds are fixed, so a failure
names a case that reruns.
"""
from __future__ import annotations

import random
import warnings

import pytest
import torch
import torch.distributed as dist

from exact import attention_terms, mismatches
from harness.worlds import run_world
from markers import shared_world
from sp_plan.planner.errors import PlanError
from sp_plan.planner.model import Workload
from sp_plan.planner.plan import Plan
from sp_plan.runtime import init
from test_masked_exact import reference

HEADS, HEAD_DIM = 8, 4
WORLDS = (3, 6, 8)
CASES_PER_WORLD = 12
NAMES = ("out", "dq", "dk", "dv")


def random_pack(rng: random.Random, causal: bool) -> tuple[int, bool, tuple[int, ...], int | None]:
    """(sequence length, causal, cu_seqlens, window): up to 9 documents of any length, no padding rule."""
    seq = rng.randint(8, 120)
    cuts = sorted(rng.sample(range(1, seq), k=rng.randint(0, 8)))
    window = rng.choice([None, None, 1, 3, rng.randint(1, seq + 4)])
    return seq, causal, (0, *cuts, seq), window


def random_plan(rng: random.Random, world: int, causal: bool) -> Plan:
    """A plan of an algorithm that honours masks on ``world`` ranks; drawn again where the plan refuses itself.
    Its workload says it packs documents (which ``balanced`` needs), and whether it is causal, as a model's does;
    each batch's own cu_seqlens and window come with the call."""
    packed = Workload(seq_len=64, documents=[16], causal=causal)
    while True:
        dp = rng.choice([d for d in range(1, world + 1) if world % d == 0])
        sp = world // dp
        algorithm = rng.choice(["ring", "ulysses", "usp", "allgather"])
        ulysses = {"ring": 1, "ulysses": sp}.get(algorithm) or rng.choice(
            [u for u in range(1, sp + 1) if sp % u == 0 and HEADS % u == 0])
        if HEADS % ulysses:  # Ulysses splits the heads: 8 over 3 or 6 ranks is the plan's error, not this test's
            continue
        layouts = ["contiguous"] if algorithm == "ulysses" else ["contiguous", "zigzag", "striped", "balanced"]
        degrees = {"ulysses": ulysses, "ring": sp // ulysses, "dp": dp}
        order = rng.sample(list(degrees), k=3)
        try:
            return Plan(algorithm=algorithm, degrees=degrees, order=order, token_layout=rng.choice(layouts),
                        workload=packed)
        except PlanError:  # a degree the algorithm cannot take (Ulysses over 3 of 8 heads, all-gather on ring 1)
            continue


def cases(world: int) -> list[tuple[Plan, list, int]]:
    """(plan, one pack per data-parallel replica, KV heads) for ``world``, from a seed of its own."""
    rng = random.Random(world)
    out = []
    for _ in range(CASES_PER_WORLD):
        causal = rng.random() < 0.7
        plan = random_plan(rng, world, causal)
        out.append((plan, [random_pack(rng, causal) for _ in range(plan.degrees["dp"])], rng.choice([8, 4, 2])))
    return out


def inputs(replica: int, pack, kv: int) -> list[torch.Tensor]:
    """A replica's global q, k, v and upstream gradient, the same on every rank that shares it."""
    g = torch.Generator().manual_seed(1000 * replica + pack[0])
    return [torch.randn(1, pack[0], h, HEAD_DIM, generator=g, dtype=torch.float64) for h in (HEADS, kv, kv, HEADS)]


def _run(rank: int, world: int, todo) -> list[list[str]]:
    """Per case, the mismatches of this rank's shards and of the gathered tensors."""
    found = []
    for i, (plan, packs, kv) in enumerate(todo):
        ctx = init(plan)
        replica = ctx.layout.coords(rank).get("dp", 0)
        seq, causal, cu, window = pack = packs[replica]
        q, k, v, do = inputs(replica, pack, kv)
        want = reference(q, k, v, do, seq, causal, cu, window)
        cu_seqlens = torch.tensor(cu, dtype=torch.int32)  # flash-attn's convention, as a data loader hands it
        ql, kl, vl = (ctx.shard(x, 1, cu_seqlens=cu_seqlens, window=window).requires_grad_() for x in (q, k, v))
        out = ctx.attention(ql, kl, vl, causal=causal, cu_seqlens=cu_seqlens, window=window)
        out.backward(ctx.shard(do, 1, cu_seqlens=cu_seqlens, window=window))
        got = [x.detach() for x in (out, ql.grad, kl.grad, vl.grad)]
        what = f"case {i} ({plan.summary()}, order {plan.order}, pack {pack}, {kv} KV heads) rank {rank}"
        terms = attention_terms(seq, HEAD_DIM, HEADS // kv)
        shards = [ctx.shard(w, 1, cu_seqlens=cu, window=window) for w in want]
        gathered = [ctx.gather(g, 1, cu_seqlens=cu, window=window) for g in got]
        found.append(mismatches(got, shards, NAMES, "float64", terms, what + " shard")
                     + mismatches(gathered, want, NAMES, "float64", terms, what + " gathered")
                     + through_gather(ctx, (q, k, v), do, pack, want, terms, what))
    return found


def through_gather(ctx, qkv, do, pack, want, terms, what) -> list[str]:
    """A model's path: shards of tensors that need their gradients, the attention, ``ctx.gather`` and a loss on the
    full sequence; each rank's gradients of the full tensors, summed over the sequence group, are single-device
    attention's."""
    seq, causal, cu, window = pack
    leaves = [x.clone().requires_grad_() for x in qkv]
    local = [ctx.shard(x, 1, cu_seqlens=cu, window=window) for x in leaves]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning on every rank at every gather is noise a user would see
        full = ctx.gather(ctx.attention(*local, causal=causal, cu_seqlens=cu, window=window), 1, cu_seqlens=cu,
                          window=window)
    (full * do).sum().backward()
    grads = [x.grad for x in leaves]
    if ctx.group("sp") is not None:
        for g in grads:
            dist.all_reduce(g, group=ctx.group("sp"))
    return mismatches([full.detach(), *grads], want, NAMES, "float64", terms, what + " through gather")


@shared_world("random_packs")
@pytest.mark.parametrize("world", WORLDS)
def test_random_plans_and_packs_match_single_device_attention(world):
    results = run_world(_run, world, cases(world), timeout=300)
    wrong = [line for per_rank in results for per_case in per_rank for line in per_case]
    assert not wrong, "\n".join(wrong[:20])


def test_the_draws_reach_every_algorithm_layout_and_replica_count():
    """The seeded cases are not all one kind: each world's draw holds several algorithms and layouts, and some
    case runs two or more replicas, each with its own pack."""
    for world in WORLDS:
        drawn = cases(world)
        assert len({p.algorithm for p, _, _ in drawn}) >= 3, world
        assert len({p.token_layout for p, _, _ in drawn}) >= 3, world
        assert any(not packs[0][1] for _, packs, _ in drawn), world  # bidirectional
        assert any(len(packs) > 1 and len(set(packs)) > 1 for _, packs, _ in drawn), world


def _whole(rank: int, world: int, plans) -> list[str]:
    """``through_gather`` of sequences without documents (sharded whole), per plan."""
    found = []
    for plan in plans:
        ctx = init(plan)
        pack = (48, True, None, None)
        q, k, v, do = inputs(0, pack, 2)
        want = reference(q, k, v, do, *pack)
        found += through_gather(ctx, (q, k, v), do, pack, want, attention_terms(48, HEAD_DIM, HEADS // 2),
                                f"{plan.summary()} rank {rank}")
    return found


def test_a_gathered_sequence_carries_its_gradient_back_to_every_shard():
    plans = [Plan(algorithm=a, degrees=d, token_layout=t) for a, d, t in (
        ("ring", {"ring": 4}, "zigzag"), ("ring", {"ring": 4}, "striped"), ("ulysses", {"ulysses": 4}, "contiguous"),
        ("usp", {"ulysses": 2, "ring": 2}, "zigzag"), ("allgather", {"ring": 4}, "contiguous"))]
    wrong = [line for per_rank in run_world(_whole, 4, plans, timeout=300) for line in per_rank]
    assert not wrong, "\n".join(wrong[:20])


def _rows_end_to_end(rank: int, world: int, plans) -> list:
    """Per plan: a batch of two rows, each packed its own way, with cu_seqlens over both laid end to end, through
    ``through_gather``; then the error of a pack whose document crosses the rows' boundary."""
    found = []
    rows, n, cu = 2, 32, (0, 10, 32, 33, 50, 64)  # row 0: 10 + 22; row 1: 1 + 17 + 14
    for plan in plans:
        ctx = init(plan)
        q, k, v, do = inputs(0, (rows * n,), 2)
        want = reference(q, k, v, do, rows * n, True, cu, None)
        batch = [x.reshape(rows, n, *x.shape[2:]) for x in (q, k, v)]
        leaves = [x.clone().requires_grad_() for x in batch]
        local = [ctx.shard(x, 1, cu_seqlens=cu) for x in leaves]
        full = ctx.gather(ctx.attention(*local, causal=True, cu_seqlens=cu), 1, cu_seqlens=cu)
        (full * do.reshape(rows, n, *do.shape[2:])).sum().backward()
        grads = [x.grad for x in leaves]
        if ctx.group("sp") is not None:
            for g in grads:
                dist.all_reduce(g, group=ctx.group("sp"))
        got = [t.reshape(1, rows * n, *t.shape[2:]) for t in (full.detach(), *grads)]
        found += mismatches(got, want, NAMES, "float64", attention_terms(rows * n, HEAD_DIM, HEADS // 2),
                            f"{plan.summary()} rank {rank}")
        found.append(tuple(full.shape[:2]))
        ids = torch.arange(rows * n).reshape(rows, n)  # token ids, (batch, seq) as a data loader hands them
        found.append(torch.equal(ctx.gather(ctx.shard(ids, 1, cu_seqlens=cu), 1, cu_seqlens=cu), ids))
    try:
        ctx.shard(batch[0], 1, cu_seqlens=(0, 10, 40, 64))
        found.append("a document across the rows ran")
    except PlanError as e:
        found.append((e.field, "crosses the end of row 0 (token 32)" in e.problem))
    return found


def test_rows_of_a_batch_with_cu_seqlens_over_all_of_them_run_as_one_row_and_gather_back():
    """flash-attn's varlen convention: cu_seqlens over the batch's sequences laid end to end. ctx.shard lays the rows
    end to end as one row, the attention reads it so, and ctx.gather hands back the rows; a document that crosses
    a row's end is refused."""
    plans = [Plan(algorithm=a, degrees=d, token_layout=t, workload=Workload(seq_len=64, documents=[16]))
             for a, d, t in (("ring", {"ring": 4}, "zigzag"), ("usp", {"ulysses": 2, "ring": 2}, "balanced"),
                             ("allgather", {"ring": 4}, "striped"))]
    for found in run_world(_rows_end_to_end, 4, plans, timeout=300):
        assert found[-1] == ("cu_seqlens", True), found[-1]
        assert found[:-1] == [(2, 32), True] * len(plans), found[:-1]
