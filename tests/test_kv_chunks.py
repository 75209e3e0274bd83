"""kv_chunks, all-gather's chunks of KV heads, as a plan field: the file round trip (absent when 1, as before), its
checks, the planner's price of the chunked gather and its choice of a chunk count, and init(plan)'s attention
running the plan's chunks."""
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from typer.testing import CliRunner

from sp_plan.cli.app import app
from sp_plan.planner import Estimator, Plan, PlanError, Workload
from sp_plan.planner import allgather as ag
from sp_plan.planner.candidate import Candidate
from sp_plan.planner.params import Params
from sp_plan.planner.plan import local_kv_heads
from sp_plan.planner.schedules import Comm, Compute
from sp_plan.profiles import load_cluster, load_model
from sp_plan.runtime import init
from harness.worlds import run_world

OLD = Path(__file__).parent / "fixtures" / "plans" / "usp-16-with-groups.yaml"
LLAMA = load_model("llama3-8b")  # 32 query heads, 8 KV heads


def allgather_plan(**kw) -> Plan:
    return Plan(algorithm="allgather", degrees={"ring": 8}, token_layout="zigzag", model=LLAMA, **kw)


# ---------------------------------------------------------------- the plan file

@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_plan_with_kv_chunks_round_trips_and_one_without_writes_no_key(tmp_path, suffix):
    chunked, plain = allgather_plan(kv_chunks=4), allgather_plan()
    chunked.save(tmp_path / f"chunked{suffix}")
    plain.save(tmp_path / f"plain{suffix}")
    assert Plan.load(tmp_path / f"chunked{suffix}") == chunked and chunked.kv_chunks == 4
    assert Plan.load(tmp_path / f"plain{suffix}") == plain and plain.kv_chunks is None
    assert "kv_chunks" in (tmp_path / f"chunked{suffix}").read_text()
    assert "kv_chunks" not in (tmp_path / f"plain{suffix}").read_text()
    # 1 is one gather, written as absent: the file is the one a plan without the field writes
    allgather_plan(kv_chunks=1).save(tmp_path / f"one{suffix}")
    assert (tmp_path / f"one{suffix}").read_text() == (tmp_path / f"plain{suffix}").read_text()


def test_an_older_plan_file_loads_unchanged_and_is_written_without_the_key(tmp_path):
    p = Plan.load(OLD)
    assert p.kv_chunks is None
    p.save(tmp_path / "again.yaml")
    assert "kv_chunks" not in (tmp_path / "again.yaml").read_text()
    assert Plan.load(tmp_path / "again.yaml").model_dump() == p.model_dump()  # (groups: never written)


@pytest.mark.parametrize("kw, match", [
    ({"kv_chunks": 0}, r"kv_chunks: 0 chunks .* fewer than one; use 1"),
    ({"kv_chunks": 3}, r"kv_chunks: 3 chunks do not split the 8 KV heads .*; use one of \[1, 2, 4, 8\]"),
    ({"kv_chunks": 4, "degrees": {"ring": 4, "tp": 4}}, r"the 2 KV heads .* tp 4 x ulysses 1\); use one of \[1, 2\]"),
    ({"kv_chunks": 2, "algorithm": "ring"}, r"kv_chunks: .*ring gathers none; drop kv_chunks, or use algorithm"),
])
def test_a_bad_kv_chunks_is_a_plan_error_naming_it_and_the_fix(kw, match):
    args = {"algorithm": "allgather", "degrees": {"ring": 8}, "token_layout": "zigzag", "model": LLAMA, **kw}
    with pytest.raises(PlanError, match=match) as e:
        Plan(**args)
    assert e.value.field == "kv_chunks"


def test_show_prints_a_bad_kv_chunks_as_one_line_and_a_good_one_in_the_summary(tmp_path):
    good = tmp_path / "good.yaml"
    allgather_plan(kv_chunks=2).save(good)
    r = CliRunner().invoke(app, ["show", str(good)])
    assert r.exit_code == 0 and "kv_chunks:2" in r.output
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**json.loads(allgather_plan().model_dump_json(exclude_none=True)), "kv_chunks": 3}))
    r = CliRunner().invoke(app, ["show", str(bad)])
    assert r.exit_code == 2 and "kv_chunks: 3 chunks do not split" in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_the_kv_heads_a_rank_attends_follow_tp_then_ulysses_as_the_runtime_splits_them():
    from sp_plan.runtime.variants.ulysses import kv_split

    for heads, kv, tp, u in [(32, 8, 1, 1), (32, 8, 2, 2), (32, 8, 1, 8), (32, 8, 2, 8), (24, 3, 1, 2), (32, 32, 4, 2)]:
        assert local_kv_heads(heads, kv, tp, u) == kv_split(heads // tp, kv // tp, u)[0], (heads, kv, tp, u)


# ---------------------------------------------------------------- the price

def priced(S: int, nodes: int = 1, params: Params | None = None):
    """An Estimator and an all-gather candidate over every rank of dgx-h100 nodes, one sequence of S tokens a rank."""
    cluster = load_cluster("dgx-h100", nodes)
    est = Estimator(cluster, LLAMA, Workload(seq_len=S, batch=cluster.world_size), params=params)
    return est, Candidate("allgather", ring=cluster.world_size, order=("ring",), token_layout="zigzag")


def layer_seconds(est, cand, n: int) -> float:
    c = est.shape(cand)
    steps = ag.allgather_steps(c, False, n) + ag.allgather_steps(c, True, n)
    return float(est.price(steps, est.orders(cand.degrees, [cand.order])).seconds[0])


def test_the_chunked_gather_is_priced_as_a_pipeline_of_its_chunks():
    est, cand = priced(32768, params=Params(round_overhead_s=2e-5))
    c = est.shape(cand)
    orders = est.orders(cand.degrees, [cand.order])
    for n in (2, 4, 8):
        steps = ag.allgather_steps(c, False, n)
        gathers = [p for st in steps for p in st.phases if isinstance(p, Comm)]
        attends = [p for st in steps for p in st.phases if isinstance(p, Compute)]
        g, a = float(orders.time(gathers[0])[0]), est.compute_time(attends[0])
        assert gathers[0].nbytes == pytest.approx(ag.gathered_kv_bytes(c) / n)
        # the first gather exposed, then each next gather beside an attention, then the last attention
        assert float(est.price(steps, orders).seconds[0]) == pytest.approx(g + (n - 1) * max(g, a) + a)
        assert sum(st.repeat for st in steps for p in st.phases if isinstance(p, Compute)) == n  # n calls
    whole = ag.allgather_steps(c, False)
    assert not any(st.overlap for st in whole)  # one chunk: the gather exposed, as before


def test_the_planner_chunks_the_gather_where_it_is_comparable_to_the_attention():
    for S, nodes in ((32768, 1), (32768, 2), (131072, 1)):
        est, cand = priced(S, nodes)
        n = ag.best_kv_chunks(est, cand)
        assert n > 1, (S, nodes)
        assert layer_seconds(est, cand, n) < layer_seconds(est, cand, 1)
        steps = {k: est.evaluate(replace(cand, kv_chunks=k)).step_time_s for k in ag.kv_chunk_options(est.shape(cand))}
        assert n == min(steps, key=steps.get)


def test_the_planner_keeps_one_gather_where_the_gather_is_negligible():
    """A short sequence's gather is a few microseconds: a chunk's own latency and kernel call cost more than the
    gather it would hide."""
    for S, nodes in ((1024, 1), (8192, 2)):
        est, cand = priced(S, nodes, Params(round_overhead_s=2e-5))
        assert ag.kv_chunk_options(est.shape(cand)) == [1, 2, 4, 8]
        assert ag.best_kv_chunks(est, cand) == 1
        assert layer_seconds(est, cand, 1) < layer_seconds(est, cand, 2)


def test_chunk_options_divide_the_kv_heads_a_rank_attends_up_to_eight():
    est, cand = priced(8192)
    assert ag.kv_chunk_options(est.shape(cand)) == [1, 2, 4, 8]
    mha = load_model("llama3-8b").model_copy(update={"kv_heads": 32})
    c = Estimator(est.cluster, mha, est.work).shape(cand)
    assert ag.kv_chunk_options(c) == [1, 2, 4, 8]  # 32 KV heads: up to the cap
    est1 = Estimator(est.cluster, LLAMA, est.work)
    tp = Candidate("allgather", ring=2, tp=4, order=("tp", "ring"), token_layout="zigzag")
    assert ag.kv_chunk_options(est1.shape(tp)) == [1, 2]  # 8 KV heads over tp 4


def test_chunked_buffers_hold_two_chunks_of_the_gathered_k_v():
    est, cand = priced(32768)
    c = est.shape(cand)
    kv = ag.gathered_kv_bytes(c)
    assert ag.allgather_buffer_bytes(c, training=False) == kv
    assert ag.allgather_buffer_bytes(c, training=False, chunks=2) == kv
    assert ag.allgather_buffer_bytes(c, training=False, chunks=8) == kv / 4
    assert ag.allgather_buffer_bytes(c, training=True, chunks=8) == kv / 4 + 2 * kv  # and the fp32 full-length dk, dv


def test_an_estimate_prices_the_plans_kv_chunks():
    est, cand = priced(32768)
    one = est(cand.to_plan(model=LLAMA))
    four = est(replace(cand, kv_chunks=4).to_plan(model=LLAMA))
    exposed = {p.name: p.exposed_seconds for p in four.breakdown}
    whole = {p.name: p.exposed_seconds for p in one.breakdown}
    assert four.step_time_s < one.step_time_s
    assert exposed["allgather k,v fwd"] < whole["allgather k,v fwd"] / 2  # three of its four chunks hidden
    assert four.memory["attention buffers"] < one.memory["attention buffers"]
    with pytest.raises(PlanError, match="kv_chunks: 3 chunks do not split the 8 KV heads"):
        est.check(replace(cand, kv_chunks=3))


@pytest.mark.parametrize("nodes, S, mbs", [(1, 32768, 1), (2, 8192, 2)])
def test_the_searchs_lower_bounds_stay_below_a_chunked_all_gathers_price(nodes, S, mbs):
    """Each chunk count's schedule is its own shape's: the bounds read it, so they stay below its price."""
    est, cand = priced(S, nodes, Params(round_overhead_s=2e-5, overlap=0.8))
    cand = replace(cand, micro_batch_size=mbs, checkpointing="full")
    policies = [(0, "full", mbs), (1, "none", mbs)]
    orders = est.orders(cand.degrees, [cand.order])
    for n in ag.kv_chunk_options(est.shape(cand)):
        c = replace(cand, kv_chunks=n)
        exact, _ = est.evaluate_orders(c, orders, policies)
        assert min(est.bounds.compute_bounds(c, policies)) <= exact.min()
        for how in ("busy", "balanced"):
            assert all(b <= t for b, t in zip(est.bounds.comm_bounds(c, orders, policies, how), exact.min(axis=0)))
        assert est.bounds.degrees_bound(c, [mbs]) <= exact.min()


# ---------------------------------------------------------------- the runtime

def _attend(rank: int, world: int, plan: Plan):
    ctx = init(plan)
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 16, h, 8, generator=gen, dtype=torch.float64) for h in (8, 4, 4))
    q, k, v = (ctx.shard(x, dim=1) for x in (q, k, v))
    for chunks in (None, 1, 2):  # each call's arguments compared over the group once (runtime.agree), not counted
        ctx.attention(q, k, v, causal=True, kv_chunks=chunks)
    gathers = []
    gather = dist.all_gather
    dist.all_gather = lambda *a, **kw: gathers.append(1) or gather(*a, **kw)
    try:
        counted = []
        outs = []
        for chunks in (None, 1, 2):  # the plan's, then the caller's
            gathers.clear()
            outs.append(ctx.attention(q, k, v, causal=True, kv_chunks=chunks))
            counted.append(len(gathers))
    finally:
        dist.all_gather = gather
    return counted, [(o - outs[1]).abs().max().item() for o in outs]


@pytest.mark.multiprocess
@pytest.mark.parametrize("degrees, chunks, gathers", [
    ({"ring": 2}, 4, [8, 2, 4]),  # 4 KV heads a rank: the plan's 4 chunks, one gather, the caller's 2
    ({"ulysses": 2, "ring": 2}, 2, [4, 2, 4]),  # the hybrid: 2 KV heads a rank after Ulysses' all-to-all
])
def test_init_passes_the_plans_kv_chunks_to_the_all_gather_attention(degrees, chunks, gathers):
    plan = Plan(algorithm="allgather", degrees=degrees, token_layout="zigzag", kv_chunks=chunks)
    for counted, diffs in run_world(_attend, plan.world_size, plan, timeout=120):
        assert counted == gathers  # K and V once per chunk
        assert max(diffs) < 1e-12  # chunking moves the same K, V: the same attention


def _refused(rank: int, world: int):
    ctx = init(Plan(algorithm="ring", degrees={"ring": 2}, order=["ring"]))
    q = torch.randn(1, 8, 2, 4)
    try:
        ctx.attention(q, q, q, kv_chunks=2)
    except PlanError as e:
        return e.field
    return None


@pytest.mark.multiprocess
def test_a_chunk_count_for_a_plan_that_gathers_nothing_is_refused():
    assert run_world(_refused, 2, timeout=60) == ["kv_chunks", "kv_chunks"]
