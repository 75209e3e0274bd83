"""init(plan) on an 8-rank gloo world: groups equal the plan's lists; gather(shard(x)) == x."""
import numpy as np
import pytest
import torch
import torch.distributed as dist

from sp_plan.planner import Plan, PlanError
from sp_plan.runtime import init
from harness.worlds import WorldError, run_world

PLANS = [
    Plan(algorithm="usp", degrees={"ulysses": 2, "ring": 2, "dp": 2}, order=["ulysses", "ring", "dp"], token_layout="zigzag"),
    Plan(algorithm="usp", degrees={"ulysses": 2, "ring": 2, "dp": 2}, order=["ring", "dp", "ulysses"], token_layout="striped"),
    Plan(algorithm="usp", degrees={"ulysses": 2, "ring": 4}, order=["ring", "ulysses"], token_layout="contiguous"),
    Plan(algorithm="ring", degrees={"ring": 4, "dp": 2}, order=["dp", "ring"], token_layout="zigzag"),
    Plan(algorithm="ring", degrees={"ring": 8}, order=["ring"], token_layout="striped"),
    Plan(algorithm="ulysses", degrees={"ulysses": 4, "dp": 2}, order=["dp", "ulysses"]),
]


def _check(rank, world, plans):
    out = []
    x = torch.randn(2, 64, 3, generator=torch.Generator().manual_seed(0))
    for p in plans:
        ctx = init(p)
        layout = p.layout()
        for name, groups in layout.all_groups().items():
            mine = layout.group_of(name, rank)
            assert mine in groups
            assert ctx.ranks(name) == mine
            g = ctx.group(name)
            got = dist.get_process_group_ranks(g) if g is not None else [rank]
            assert sorted(got) == sorted(mine), (name, got, mine)
        # mesh dims equal the plan's groups too
        for name in ctx.mesh.mesh_dim_names:
            assert sorted(dist.get_process_group_ranks(ctx.mesh.get_group(name))) == sorted(layout.group_of(name, rank))
        local = ctx.shard(x, dim=1)
        assert local.shape[1] == 64 // p.sp
        assert torch.equal(ctx.gather(local, dim=1), x)
        out.append(p.summary())
    return out


def test_init_groups_and_shard_gather_roundtrip():
    res = run_world(_check, 8, PLANS, timeout=60)
    assert res[0] == [p.summary() for p in PLANS]


def _one_rank_groups(rank, world):
    ctx = init(Plan(algorithm="ring", degrees={}, order=[]))
    return {name: ctx.group(name) for name in ("tp", "ulysses", "ring", "dp", "pp", "sp")}


def test_a_world_of_one_rank_has_no_groups():
    """One rank: every dimension is of degree 1, so every group is None (its mesh still has the one "dp" dim)."""
    assert run_world(_one_rank_groups, 1, timeout=60)[0] == dict.fromkeys(("tp", "ulysses", "ring", "dp", "pp", "sp"))


def _wrong_world(rank, world):
    init(Plan(algorithm="ring", degrees={"ring": 4}, order=["ring"]))


def test_world_mismatch_is_a_clear_error():
    with pytest.raises(WorldError, match="world_size: the plan needs 4 ranks.*the world has 2"):
        run_world(_wrong_world, 2, timeout=30)


def test_init_without_distributed_is_a_clear_error():
    with pytest.raises(PlanError, match="not initialized"):
        init(PLANS[0])


DOCS = (0, 3, 40, 41, 58, 77)  # odd lengths, no padding: ranks hold different numbers of tokens


def _document_plans():
    from sp_plan.planner.model import Workload

    packed = Workload(seq_len=77, documents=[3, 37, 1, 17, 19])
    return [
        Plan(algorithm="ring", degrees={"ring": 8}, order=["ring"], token_layout="zigzag"),
        Plan(algorithm="ulysses", degrees={"ulysses": 8}, order=["ulysses"]),
        Plan(algorithm="usp", degrees={"ulysses": 2, "ring": 4}, order=["ring", "ulysses"], token_layout="balanced",
             workload=packed),
        Plan(algorithm="allgather", degrees={"ring": 4, "dp": 2}, order=["dp", "ring"], token_layout="striped"),
    ]


def _document_roundtrip(rank, world):
    x = torch.randn(2, 77, 3, generator=torch.Generator().manual_seed(1))
    out = []
    for p in _document_plans():
        ctx = init(p)
        local = ctx.shard(x, dim=1, cu_seqlens=DOCS, window=9)
        back = ctx.gather(local, dim=1, cu_seqlens=DOCS, window=9)
        out.append((local.shape[1], torch.equal(back, x)))
    return out


def test_gather_undoes_shard_with_documents_and_unequal_shards():
    """ctx.gather(ctx.shard(x, cu_seqlens=...), cu_seqlens=...) == x on every rank, for per-document layouts whose
    ranks hold different numbers of tokens (padded in the all-gather, trimmed after)."""
    res = run_world(_document_roundtrip, 8, timeout=60)
    for i, p in enumerate(_document_plans()):
        assert all(r[i][1] for r in res), p.summary()
        lengths = [r[i][0] for r in res]
        assert len(set(lengths)) > 1, (p.summary(), lengths)
        assert sum(lengths) == 77 * 8 // p.sp


def _metp_attention(rank, world):
    ctx = init(Plan(algorithm="metp", degrees={"tp": 2}, order=["tp"]))
    q = torch.randn(1, 8, 4, 16)
    ctx.attention(q, q, q, causal=True)


def test_metp_plans_have_no_ctx_attention_and_say_what_to_use():
    # METP shards tokens over its tp group and replaces the whole layer: plain attention on the local tokens
    # would be silently wrong, so the call names the modules that run it
    with pytest.raises(WorldError, match="METPAttention"):
        run_world(_metp_attention, 2, timeout=60)


def _far_cu_seqlens(rank, world, plans):
    """Per plan, the field and problem of ctx.attention and ctx.gather given a cu_seqlens that ends far past the
    inputs (2^40 tokens: any per-token array of it would not fit in memory)."""
    out = []
    for p in plans:
        ctx = init(p)
        q = torch.randn(1, 8, 2, 4)
        for call in (lambda: ctx.attention(q, q, q, causal=True, cu_seqlens=[0, 5, 2 ** 40]),
                     lambda: ctx.gather(q, dim=1, cu_seqlens=[0, 5, 2 ** 40])):
            try:
                call()
                out.append(None)
            except PlanError as e:
                out.append((e.field, e.problem))
    return out


@pytest.mark.parametrize("world, plans", [
    (1, [Plan(algorithm="ring", degrees={"ring": 1}, order=["ring"])]),
    (2, [Plan(algorithm="ring", degrees={"ring": 2}, order=["ring"], token_layout="zigzag"),
         Plan(algorithm="ulysses", degrees={"ulysses": 2}, order=["ulysses"]),
         Plan(algorithm="allgather", degrees={"ring": 2}, order=["ring"], token_layout="striped")]),
])
def test_a_cu_seqlens_far_past_the_inputs_is_refused_before_the_layout_is_built(world, plans):
    """The token count a layout gives a rank is checked against the inputs before any per-token array of the
    sequence is made, so a wrong end is one clear error, at world 1 too (where gather has nothing to move)."""
    for res in run_world(_far_cu_seqlens, world, plans, timeout=60):
        assert len(res) == 2 * len(plans)
        for r in res:
            assert r is not None and r[0] == "cu_seqlens" and "1,099,511,627,776" in r[1], r


def _plan_per_rank(rank, world, other_world=False):
    plans = [Plan(algorithm="ring", degrees={"ring": 2}, order=["ring"], token_layout="zigzag"),
             Plan(algorithm="ulysses", degrees={"ulysses": 4 if other_world else 2}, order=["ulysses"])]
    try:
        init(plans[rank])
    except PlanError as e:
        return e.field, e.problem
    return None


def test_ranks_given_different_plans_are_refused_at_init_not_left_waiting():
    """Each plan passes its own checks; run, rank 0's ring sends would wait on rank 1's all-to-all forever."""
    for other_world in (False, True):  # rank 1's plan of 4 ranks: rank 0 is not left in the mesh's collectives
        res = run_world(_plan_per_rank, 2, other_world, timeout=60)
        assert res[0] == res[1] and res[0][0] == "plan", res
        assert "rank 1 was given 'ulysses" in res[0][1] and "rank 0 'ring" in res[0][1], res


def _bad_dim(rank, world):
    ctx = init(Plan(algorithm="ring", degrees={"ring": 2}, order=["ring"]))
    out = []
    for call in (lambda: ctx.shard(torch.randn(2, 8, 3), dim=5), lambda: ctx.gather(torch.randn(2, 4, 3), dim=-7)):
        try:
            call()
        except PlanError as e:
            out.append(e.field)
    return out


def test_shard_and_gather_name_a_dim_the_tensor_lacks():
    assert run_world(_bad_dim, 2, timeout=60) == [["dim", "dim"]] * 2


DIFFERENT = {  # per field, the call's keywords on rank 0 and on rank 1 (q's heads: rank 1's shards hold 3)
    "window": ({"window": 4}, {"window": 8}),
    "causal": ({"causal": True}, {"causal": False}),
    "scale": ({}, {"scale": 0.3}),
    "cu_seqlens": ({"cu_seqlens": [0, 6, 16]}, {"cu_seqlens": [0, 10, 16]}),
    "shapes": ({}, {"heads": 3}),
}


def _mismatched_calls(rank, world, plan):
    """Per field of ``DIFFERENT``, what ctx.attention raised on this rank (field, problem); then how many
    all-gathers an agreed call repeated three times made, and that its output is this rank's share of the whole."""
    from sp_plan.runtime import agree

    ctx = init(plan)
    out = {}
    for name, kws in DIFFERENT.items():
        kw = dict(kws[rank])
        q = torch.randn(1, 8, kw.pop("heads", 2), 4)
        try:
            ctx.attention(q, q, q, **kw)
            out[name] = None
        except PlanError as e:
            out[name] = (e.field, e.problem)
    calls = [0]
    real = agree.dist.all_gather
    agree.dist.all_gather = lambda *a, **k: (calls.__setitem__(0, calls[0] + 1), real(*a, **k))[1]
    torch.manual_seed(0)
    x = torch.randn(1, 16, 2, 4)
    mine = ctx.shard(x, dim=1)
    outs = [ctx.attention(mine, mine, mine, causal=True, window=5) for _ in range(3)]
    agree.dist.all_gather = real
    whole = ctx.gather(outs[-1], dim=1)
    return out, calls[0], all(torch.equal(o, outs[0]) for o in outs), whole


@pytest.mark.parametrize("plan", [
    Plan(algorithm="ring", degrees={"ring": 2}, order=["ring"], token_layout="zigzag"),
    Plan(algorithm="ulysses", degrees={"ulysses": 2}, order=["ulysses"]),
], ids=["ring2", "ulysses2"])
def test_ranks_calling_attention_otherwise_get_an_error_naming_the_field(plan):
    """A rank given another window, causal flag, scale, cu_seqlens or head count than its peer would compute a wrong
    attention silently (or abort in a collective): every rank gets one error naming the field instead. An agreed
    call is compared once, then remembered."""
    from sp_plan.runtime.attention import attention as local

    res = run_world(_mismatched_calls, 2, plan, timeout=60)
    for out, calls, same, _ in res:
        for name in DIFFERENT:
            assert out[name] is not None and out[name][0] == name, (name, out)
            assert f"rank 1 passed ctx.attention another {name} than rank 0" in out[name][1]
        assert calls == 1 and same
    torch.manual_seed(0)
    x = torch.randn(1, 16, 2, 4)
    ref = local(x, x, x, algorithm="ring", groups=None, causal=True, window=5)
    assert torch.allclose(res[0][3], ref, atol=1e-6) and torch.equal(res[0][3], res[1][3])


def _stray_into_an_earlier_call(rank, world):
    """Every call compared (SP_PLAN_CHECK_CALLS=every): both ranks make two calls alike, then rank 0 repeats the
    second while rank 1 repeats the first; what each rank raised (field, problem)."""
    import os

    os.environ["SP_PLAN_CHECK_CALLS"] = "every"
    ctx = init(Plan(algorithm="allgather", degrees={"ring": 2}, order=["ring"], token_layout="zigzag"))
    q = torch.randn(1, 8, 2, 4)
    ctx.attention(q, q, q, causal=True)
    ctx.attention(q, q, q, causal=True, window=4)
    try:
        ctx.attention(q, q, q, causal=True, window=4 if rank == 0 else None)
    except PlanError as e:
        return e.field, e.problem
    return None


def test_every_call_compared_finds_a_rank_that_strays_into_an_earlier_call():
    """Each rank remembers the calls its group agreed on; a rank that repeats one while its peer repeats another
    compares nothing by default. Compared on every call, both ranks get the error naming the field."""
    for field, problem in run_world(_stray_into_an_earlier_call, 2, timeout=60):
        assert field == "window" and "rank 1 passed ctx.attention another window than rank 0" in problem


def test_the_check_mode_is_read_from_the_environment_and_an_unknown_one_is_named():
    from sp_plan.runtime.agree import check_mode

    assert check_mode({}) == "new" and check_mode({"SP_PLAN_CHECK_CALLS": " every "}) == "every"
    with pytest.raises(PlanError) as e:
        check_mode({"SP_PLAN_CHECK_CALLS": "always"})
    assert e.value.field == "SP_PLAN_CHECK_CALLS" and "every" in e.value.fix


def _replica_windows(rank, world):
    """Each data-parallel replica's sequence group calls with its own window; the global ranks of this rank's group."""
    ctx = init(Plan(algorithm="ring", degrees={"ring": 2, "dp": 2}, order=["ring", "dp"], token_layout="zigzag"))
    q = torch.randn(1, 8, 2, 4)
    ctx.attention(q, q, q, causal=True, window=4 + 4 * ctx.layout.coords(rank).get("dp", 0))
    return ctx.ranks("sp")


def test_replicas_compare_within_their_own_sequence_group():
    """Data-parallel replicas hold other batches: their calls may differ, and only a group's ranks are compared."""
    groups = run_world(_replica_windows, 4, timeout=60)
    assert sorted(map(tuple, groups)) == [(0, 1), (0, 1), (2, 3), (2, 3)]


def _preset_named_file(rank, world, path):
    """init() of a plan file whose model is a preset's name: the error; then init() of load_plan's Plan of it."""
    from sp_plan.profiles.plans import load_plan

    try:
        init(path)
        refused = None
    except PlanError as e:
        refused = (e.field, e.problem)
    return refused, init(load_plan(path)).plan.model.name


def test_init_of_a_file_naming_a_model_preset_says_where_names_are_read(tmp_path):
    """`sp-plan show` reads a preset's name in a plan file; a Plan (init's) takes the fields: the error says so, and
    load_plan's Plan of the same file runs."""
    path = tmp_path / "plan.yaml"
    path.write_text("algorithm: ring\ndegrees: {ring: 2}\norder: [ring]\nmodel: llama3-8b\n")
    for refused, name in run_world(_preset_named_file, 2, str(path), timeout=60):
        assert refused == ("plan.model", "'llama3-8b' names a model preset, and a Plan takes the model's fields")
        assert name == "llama3-8b"


def _one_rank_wrong(rank, world):
    """Per case, what ctx.attention raised on this rank where rank 1 alone passes a call its own checks refuse."""
    ctx = init(Plan(algorithm="ring", degrees={"ring": 2}, order=["ring"], token_layout="zigzag"))
    q = torch.randn(1, 8, 2, 4)
    out = []
    for kw, q1 in (({"window": 2.5}, q), ({}, q[0]), ({"cu_seqlens": [0, 6.5, 16]}, q)):
        try:
            ctx.attention(*([q1] * 3 if rank == 1 else [q] * 3), causal=True, **(kw if rank == 1 else {}))
            out.append(None)
        except PlanError as e:
            out.append(e.field)
    return out


def test_a_rank_whose_own_call_is_wrong_fails_with_its_peers():
    """A fractional window, a 3-dimensional q or fractional cu_seqlens on one rank: its checks would refuse it while
    its peers waited in the attention's collectives; the agreement comes first, so every rank fails at once."""
    assert run_world(_one_rank_wrong, 2, timeout=60) == [["window", "shapes", "cu_seqlens"]] * 2


def _covering_windows(rank, world):
    """Per plan, whether ctx.attention under a window covering every document gave bit for bit the output of no
    window, and the gathered output of the packed plan under its covering window."""
    from sp_plan.planner.model import Workload

    torch.manual_seed(0)
    x = torch.randn(1, 16, 4, 4)
    same = []
    for p in (Plan(algorithm="ring", degrees={"ring": 4}, order=["ring"], token_layout="zigzag"),
              Plan(algorithm="ulysses", degrees={"ulysses": 4}, order=["ulysses"]),
              Plan(algorithm="wallfacer", degrees={"ring": 4, "team": 2}, order=["ring"])):
        ctx = init(p)
        q = ctx.shard(x, dim=1)
        same.append(torch.equal(ctx.attention(q, q, q, window=16), ctx.attention(q, q, q)))
    packed = Plan(algorithm="usp", degrees={"ulysses": 2, "ring": 2}, order=["ring", "ulysses"],
                  token_layout="balanced", workload=Workload(seq_len=77, documents=[3, 37, 1, 17, 19], window=37))
    ctx = init(packed)
    y = torch.randn(1, 77, 4, 4, generator=torch.Generator().manual_seed(2))
    q = ctx.shard(y, dim=1, cu_seqlens=DOCS)
    out = ctx.attention(q, q, q, cu_seqlens=DOCS)
    same.append(torch.equal(out, ctx.attention(q, q, q, cu_seqlens=DOCS, window=None)))
    return same, ctx.gather(out, dim=1, cu_seqlens=DOCS)


def test_a_window_covering_every_document_runs_as_full_attention():
    """A window of at least the longest document masks nothing: ctx.attention runs it as no window (the same bits),
    for algorithms that honour windows and for those that do not (WallFacer); with packed documents the plan's
    window of the longest document's length leaves the shard's balanced layout and the attention exact."""
    from sp_plan.runtime.attention import attention as local

    res = run_world(_covering_windows, 4, timeout=90)
    y = torch.randn(1, 77, 4, 4, generator=torch.Generator().manual_seed(2))
    ref = local(y, y, y, algorithm="ring", groups=None, causal=True, cu_seqlens=DOCS)
    for same, whole in res:
        assert same == [True] * 4
        assert torch.allclose(whole, ref, atol=1e-6)


MISUSE = {  # per case, (q, k, v) shapes and dtypes a user might pass, and the field the error must name
    "v heads": (((1, 8, 4, 8), (1, 8, 2, 8), (1, 8, 1, 8)), torch.float32, "k"),
    "heads not dividing": (((1, 8, 4, 8), (1, 8, 3, 8), (1, 8, 3, 8)), torch.float32, "k"),
    "head dim": (((1, 8, 4, 8), (1, 8, 2, 4), (1, 8, 2, 4)), torch.float32, "k"),
    "dtype": (((1, 8, 4, 8), (1, 8, 2, 8), (1, 8, 2, 8)), torch.float64, "k"),
    "3-d": (((8, 4, 8), (8, 2, 8), (8, 2, 8)), torch.float32, "q"),
    "v head dim": (((1, 8, 4, 8), (1, 8, 2, 8), (1, 8, 2, 16)), torch.float32, "v"),
}


def _misused(rank, world, plan):
    """Per MISUSE case, the field of the PlanError ctx.attention raised (None: none); then ctx.attention with a 2-d
    cu_seqlens and ctx.gather of the full tensor instead of its shard."""
    ctx = init(plan)
    ctx.shard(torch.randn(1, 16, 4, 8), dim=1)
    got = {}
    for name, (shapes, kv_dtype, _) in MISUSE.items():
        q, k, v = (torch.randn(s, dtype=torch.float32 if i == 0 else kv_dtype) for i, s in enumerate(shapes))
        try:
            ctx.attention(q, k, v, causal=True)
            got[name] = None
        except PlanError as e:
            got[name] = e.field
    q = torch.randn(1, 8, 4, 8)
    got["numpy scale"] = tuple(ctx.attention(q, q, q, scale=np.float32(0.3)).shape)  # a Real, not a float: taken
    for name, call in (("2-d cu_seqlens", lambda: ctx.attention(q, q, q, cu_seqlens=torch.tensor([[0, 5, 16]]))),
                       ("gather of the whole", lambda: ctx.gather(torch.randn(1, 16, 4, 8), dim=1))):
        try:
            call()
            got[name] = None
        except PlanError as e:
            got[name] = e.field
    cu = (0, 5, 16, 20, 32)  # two rows of 16 end to end, then one row of 32 with the same boundaries
    two, one = torch.randn(2, 16, 4, 8), torch.randn(1, 32, 4, 8)
    got["rows back"] = [tuple(ctx.gather(ctx.shard(x, 1, cu_seqlens=cu), 1, cu_seqlens=cu).shape) for x in (two, one)]
    return got


@pytest.mark.parametrize("plan", [
    Plan(algorithm="ring", degrees={"ring": 2}, order=["ring"], token_layout="zigzag"),
    Plan(algorithm="ulysses", degrees={"ulysses": 2}, order=["ulysses"]),
    Plan(algorithm="allgather", degrees={"ring": 2}, order=["ring"]),
], ids=["ring2", "ulysses2", "allgather2"])
def test_misshapen_inputs_are_refused_naming_the_argument(plan):
    """KV heads that differ between k and v or do not divide q's, q and k of different head dims, mixed dtypes and a
    dropped batch dimension are a PlanError naming the argument on every algorithm, not a kernel's RuntimeError, a
    reshape error or (ring, all-gather) an output with v's heads broadcast apart from k's; a 2-d cu_seqlens and the
    full tensor passed to ctx.gather where its shard was meant are refused too; a numpy scale is taken, and ctx.gather
    hands back the rows of the latest ctx.shard of those cu_seqlens (two rows, then one of the same boundaries)."""
    want = {name: field for name, (_, _, field) in MISUSE.items()}
    want.update({"2-d cu_seqlens": "cu_seqlens", "gather of the whole": "x", "numpy scale": (1, 8, 4, 8),
                 "rows back": [(2, 16, 4, 8), (1, 32, 4, 8)]})
    assert run_world(_misused, 2, plan, timeout=120) == [want] * 2
