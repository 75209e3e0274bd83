"""A balanced layout places packed documents by the mask's work, so shard, attention and gather must read one mask.

The pack below is one where a causal and a bidirectional mask, or no window and a window of 5, give every rank of
a 4-rank USP (ulysses 2 x ring 2) the same number of tokens but different tokens: a count check passes, and without
``runtime/placement.py``'s checks the attention returns a wrong result with no error. Each scenario runs on one world and
reports the field of the error every rank raised, or the largest error against single-device attention.
"""
from __future__ import annotations

import pytest
import torch

from harness.worlds import run_world
from markers import shared_world
from sp_plan.planner.errors import PlanError
from sp_plan.planner.model import Workload
from sp_plan.planner.plan import Plan
from sp_plan.planner.search import Degrees, Space
from sp_plan.profiles import load_model
from sp_plan.runtime import init
from sp_plan.runtime.variants.ring import member_pieces
from test_masked_exact import reference

CU = (0, 18, 23, 27, 31, 33, 35, 37)
SEQ = CU[-1]
#: name -> (plan's causal, plan's window, shard's keywords, attention's keywords, gather's keywords)
SCENARIOS = {
    "one mask throughout": (True, None, {}, {}, {}),
    "window passed to all three": (True, None, {"window": 5}, {"window": 5}, {"window": 5}),
    "bidirectional passed to all three": (True, None, {"causal": False}, {"causal": False}, {"causal": False}),
    "a layer's window, the shard's none": (True, None, {}, {"window": 5}, {}),
    "a bidirectional call on a causal plan": (True, None, {}, {"causal": False}, {}),
    "gather without the shard's window": (True, None, {"window": 5}, {"window": 5}, {}),
    "a plan's uniform window, by default": (True, {"size": 5}, {}, {}, {}),
    "k sharded by another window than q": (True, None, {}, {}, {}),
}
#: scenarios whose k is sharded with other keywords than q and v
K_SHARD = {"k sharded by another window than q": {"window": 5}}


def plan(causal: bool, window) -> Plan:
    work = Workload(seq_len=SEQ, documents=[8], causal=causal, window=window)
    return Plan(algorithm="usp", degrees={"ulysses": 2, "ring": 2}, order=["ulysses", "ring"],
                token_layout="balanced", workload=work)


def _run(rank: int, world: int) -> dict:
    out = {}
    for name, (causal, window, shard_kw, attn_kw, gather_kw) in SCENARIOS.items():
        ctx = init(plan(causal, window))
        g = torch.Generator().manual_seed(0)
        q, k, v, do = (torch.randn(1, SEQ, h, 4, generator=g, dtype=torch.float64) for h in (4, 2, 2, 4))
        try:
            ql, kl, vl = (ctx.shard(x, 1, cu_seqlens=CU, **(K_SHARD.get(name, shard_kw) if x is k else shard_kw))
                          .requires_grad_() for x in (q, k, v))
            o = ctx.attention(ql, kl, vl, cu_seqlens=CU, **attn_kw)
            full = ctx.gather(o.detach(), 1, cu_seqlens=CU, **gather_kw)
        except PlanError as e:
            out[name] = e.field
            continue
        want = reference(q, k, v, do, SEQ, ctx.causal(attn_kw.get("causal")), CU, ctx.window(attn_kw.get("window")))
        out[name] = float((full - want[0]).abs().max())
    out[RESHARD] = _reshard_then_read()
    return out


#: documents read before this context sharded them, then sharded by another mask: the next read checks the shard
RESHARD = "a read, then a shard by another mask, then the read again"


def _reshard_then_read() -> str:
    """The field of the error a read by the causal mask raises once its documents were sharded bidirectional
    after an identical read (the once-per-batch check must not take the shard for the batch it already read), or
    'no error'."""
    ctx = init(plan(True, None))
    q = torch.randn(1, SEQ, 4, 4, dtype=torch.float64)
    ql = init(plan(True, None)).shard(q, 1, cu_seqlens=CU)  # another context's shard: this one has placed nothing
    ctx.attention(ql, ql, ql, cu_seqlens=CU)
    ql = ctx.shard(q, 1, cu_seqlens=CU, causal=False)
    try:
        ctx.attention(ql, ql, ql, cu_seqlens=CU)
    except PlanError as e:
        return e.field
    return "no error"


def test_the_pack_places_alike_in_counts_and_otherwise_in_tokens():
    """The pack is the hard case: the other masks hold the same counts per rank and other tokens."""
    base = member_pieces("balanced", 2, 2, SEQ, True, CU, None)
    for other in (member_pieces("balanced", 2, 2, SEQ, False, CU, None),
                  member_pieces("balanced", 2, 2, SEQ, True, CU, 5)):
        assert [[len(t) for t in m] for m in other] == [[len(t) for t in m] for m in base]
        assert any(not torch.equal(torch.as_tensor(a), torch.as_tensor(b))
                   for m, n in zip(base, other) for a, b in zip(m, n))


@shared_world("placement")
def test_shard_attention_and_gather_read_one_mask_or_every_rank_names_the_field():
    results = run_world(_run, 4, timeout=120)
    for name in SCENARIOS:
        got = {r[name] for r in results}
        assert len(got) == 1, (name, got)  # every rank alike
    exact = ("one mask throughout", "window passed to all three", "bidirectional passed to all three",
             "a plan's uniform window, by default")
    for name in exact:
        assert results[0][name] < 1e-12, (name, results[0][name])
    assert results[0]["a layer's window, the shard's none"] == "window"
    assert results[0]["a bidirectional call on a causal plan"] == "causal"
    assert results[0]["gather without the shard's window"] == "window"
    assert results[0]["k sharded by another window than q"] == "window"
    assert {r[RESHARD] for r in results} == {"causal"}


def test_the_placements_kept_are_the_latest(monkeypatch):
    """Past KEEP batches the oldest is forgotten, never the one just sharded."""
    from collections import OrderedDict

    from sp_plan.runtime import placement

    monkeypatch.setattr(placement, "KEEP", 3)
    kept = OrderedDict()
    for i in range(5):
        placement.remember(kept, i, i)
    assert list(kept) == [2, 3, 4]
    placement.remember(kept, 2, "again")  # a batch sharded again is the latest
    assert list(kept) == [3, 4, 2]


def test_a_balanced_plan_whose_layers_mix_windows_is_refused_before_it_runs():
    """One placement serves every layer, so a window pattern cannot be balanced by one mask."""
    mixed = plan(True, {"size": 5, "pattern": "5:1"})
    results = run_world(_init_error, 4, mixed, timeout=60)
    assert all(r == "token_layout" for r in results), results


def test_the_search_offers_balanced_only_where_one_mask_serves_every_layer():
    """The search leaves balanced out for a window pattern and keeps it for a window on every layer, or none."""
    for window, has_balanced in (({"size": 5, "pattern": "5:1"}, False), ({"size": 5}, True), (None, True)):
        work = Workload(seq_len=4096, documents=[100, 900], window=window)
        layouts = Space(4, load_model("llama3-8b"), work).layouts(Degrees(1, 1, 1, 2, 2))
        assert ("balanced" in layouts) == has_balanced, (window, layouts)
        assert "zigzag" in layouts


def _init_error(rank: int, world: int, p: Plan):
    try:
        init(p)
    except PlanError as e:
        return e.field
    return None


@pytest.mark.parametrize("window,mixes", [(None, False), ({"size": 5}, False), ({"size": 5, "pattern": "5:1"}, True),
                                          ({"size": 4096, "pattern": "5:1"}, False)])
def test_a_workload_mixes_windows_only_where_its_pattern_masks(window, mixes):
    """A pattern whose window covers every document is full attention on every layer: one mask."""
    assert Workload(seq_len=4096, documents=[100, 900], window=window).mixes_windows is mixes


def test_estimate_of_a_balanced_plan_whose_layers_mix_windows_says_the_runtime_refuses_it(tmp_path):
    """A plan file written before the search left balanced out for mixed layers still loads and is priced, with a
    note that ``init`` refuses it."""
    from typer.testing import CliRunner

    from sp_plan.cli.app import app

    work = Workload(seq_len=65536, documents=[1000, 9000], window={"size": 4096, "pattern": "5:1"})
    path = tmp_path / "plan.yaml"
    Plan(algorithm="ring", degrees={"ring": 8}, order=["ring"], token_layout="balanced", workload=work,
         model=load_model("llama3-8b")).save(path)
    r = CliRunner().invoke(app, ["estimate", str(path), "--cluster", "dgx-h100", "--no-profile"])
    assert r.exit_code == 0, r.output
    assert "note: balanced places packed documents by one mask's work, and these layers mix windows" in r.output
    zigzag = tmp_path / "zigzag.yaml"
    Plan(algorithm="ring", degrees={"ring": 8}, order=["ring"], token_layout="zigzag", workload=work,
         model=load_model("llama3-8b")).save(zigzag)
    r = CliRunner().invoke(app, ["estimate", str(zigzag), "--cluster", "dgx-h100", "--no-profile"])
    assert r.exit_code == 0 and "note: balanced" not in r.output, r.output


#: token layout -> whether its per-document placement of (16, 48) is its whole-sequence one and that of (40, 24)
#: (4 ranks: ulysses 2 x ring 2)
UNPACKED = {"zigzag": False, "contiguous": True, "striped": True}
#: how the shard and the reads take the documents: (shard's cu_seqlens, attention's and gather's)
READS = {"shard whole, read per document": (None, (0, 16, 64)),
         "shard per document, read whole": ((0, 16, 64), None),
         "shard and read other documents": ((0, 40, 64), (0, 16, 64))}


def _unpacked_shard(rank: int, world: int) -> dict:
    """Each layout and way of reading: the field every rank raised, or the largest error against the reference of
    the documents the reads name."""
    out = {}
    for layout in UNPACKED:
        for how, (shard_cu, read_cu) in READS.items():
            ctx = init(Plan(algorithm="usp", degrees={"ulysses": 2, "ring": 2}, order=["ulysses", "ring"],
                            token_layout=layout))
            g = torch.Generator().manual_seed(0)
            q, k, v, do = (torch.randn(1, 64, h, 4, generator=g, dtype=torch.float64) for h in (4, 2, 2, 4))
            ql, kl, vl = (ctx.shard(x, 1, cu_seqlens=shard_cu) for x in (q, k, v))
            try:
                full = ctx.gather(ctx.attention(ql, kl, vl, cu_seqlens=read_cu), 1, cu_seqlens=read_cu)
            except PlanError as e:
                out[layout, how] = e.field
                continue
            out[layout, how] = float((full - reference(q, k, v, do, 64, True, read_cu, None)[0]).abs().max())
    return out


@shared_world("placement")
def test_documents_read_otherwise_than_sharded_are_refused_where_the_layout_places_them_otherwise():
    """Zigzag of the whole sequence, zigzag of a (16, 48) pack and of a (40, 24) pack hold S/P tokens a rank each,
    so only the placement tells them apart: every way of reading other than the shard is refused, naming
    cu_seqlens. Contiguous and striped place alike either way, so those reads run (and the attention is the one
    of the documents it was given)."""
    results = run_world(_unpacked_shard, 4, timeout=120)
    for layout, alike in UNPACKED.items():
        for how in READS:
            got = {r[layout, how] for r in results}
            assert len(got) == 1, (layout, how, got)
            value = results[0][layout, how]
            assert (value < 1e-12) if alike else value == "cu_seqlens", (layout, how, value)


def _unsharded_reads(rank: int, world: int) -> dict:
    """After ``ctx.shard`` of a 64-token sequence: the field each misread raised (None where it ran), and the error
    of the right read against the reference."""
    ctx = init(Plan(algorithm="allgather", degrees={"ring": 4}, order=["ring"], token_layout="zigzag"))
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 64, 4, 4, generator=g, dtype=torch.float64) for _ in range(4))
    local = [ctx.shard(x, 1) for x in (q, k, v)]
    reads = {"full tensors": (q, k, v),  # shards meant: they run as a 256-token sequence
             "SDPA's layout": [ctx.shard(x.transpose(1, 2), 2) for x in (q, k, v)]}  # heads read as tokens
    out = {}
    for how, (a, b, c) in reads.items():
        try:
            ctx.attention(a, b, c, causal=True)
            out[how] = None
        except PlanError as e:
            out[how] = e.field
    full = ctx.gather(ctx.attention(*local, causal=True), 1)
    out["shards"] = float((full - reference(q, k, v, do, 64, True, None, None)[0]).abs().max())
    return out


@shared_world("placement")
def test_tensors_that_are_not_the_shards_of_a_placed_sequence_are_refused_naming_q():
    """Full tensors where shards were meant, or shards of SDPA's (batch, heads, seq, head dim) layout, have the
    shapes the attention takes and would run as another sequence with no error; after ctx.shard placed a 64-token
    sequence, a read of another length is refused on every rank."""
    for out in run_world(_unsharded_reads, 4, timeout=120):
        assert out["full tensors"] == out["SDPA's layout"] == "q", out
        assert out["shards"] < 1e-12


def _many_micro_batches(rank: int, world: int, n: int) -> float:
    """``n`` micro-batches of one length and distinct documents sharded ahead of their attention (a pipeline's
    step), then read first to last: the largest error against single-device attention."""
    ctx = init(Plan(algorithm="ring", degrees={"ring": 2}, order=["ring"], token_layout="zigzag"))
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 32, h, 4, generator=g, dtype=torch.float64) for h in (4, 2, 2, 4))
    packs = [(0, a, b, 32) for a in range(1, 31) for b in range(a + 1, 32)][:n]  # n distinct packs
    shards = [[ctx.shard(x, 1, cu_seqlens=cu) for x in (q, k, v)] for cu in packs]
    worst = 0.0
    for cu, (ql, kl, vl) in zip(packs, shards):
        full = ctx.gather(ctx.attention(ql, kl, vl, cu_seqlens=cu, causal=True), 1, cu_seqlens=cu)
        worst = max(worst, float((full - reference(q, k, v, do, 32, True, cu, None)[0]).abs().max()))
    return worst


def test_a_pipelines_micro_batches_sharded_ahead_are_read_as_sharded():
    """A step's micro-batches are sharded before the first one's attention: each is read against its own shard,
    100 of them, more than a record of 64 batches would hold (its 65th back would read as sharded otherwise)."""
    assert max(run_world(_many_micro_batches, 2, 100, timeout=120)) < 1e-12
