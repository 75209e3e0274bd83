"""The runtime's, the transformers integration's and tune's documented functions given a wrong-typed or
out-of-range argument: a PlanError naming that argument, before any collective or kernel runs (a 0-token block would
kill the process with SIGFPE inside the attention kernel)."""
import numpy as np
import pytest
import torch
from test_api_argument_errors import assert_fields

import sp_plan
from sp_plan.integrations import transformers as hf
from sp_plan.profiles.tune.isolate import run_candidate_isolated
from sp_plan.profiles.tune.kernels import kernel_shapes, measure_kernels
from sp_plan.runtime.attention import attention
from sp_plan.runtime.context import Context, check_device_type, check_dim

WORK = {"seq_len": 256}


@pytest.fixture(scope="module")
def plan():
    return sp_plan.Plan(algorithm="ring", degrees={"ring": 2}, order=["ring"], token_layout="zigzag")


@pytest.fixture(scope="module")
def ctx(plan):
    """A Context of ``plan`` without a world: its argument checks run before any group is used."""
    return Context(plan=plan, layout=plan.layout(), rank=0, mesh=None)


def _calls(plan, ctx):
    """(argument the error must name, the call) for each wrong argument."""
    model, work, cpu = sp_plan.load_model("tiny-gpt"), sp_plan.Workload(**WORK), torch.device("cpu")
    ids = torch.zeros(1, 8, dtype=torch.long)
    kernels = lambda blocks, heads, dtype=torch.float32: measure_kernels(  # noqa: E731
        model, blocks, heads, cpu, dtype, True, repeats=1)
    cases = [
        ("plan", lambda: sp_plan.init(5)),
        ("torch.distributed", lambda: sp_plan.init(plan.model_dump())),  # a mapping is a plan: then the world
        ("device_type", lambda: check_device_type("bogus")),
        ("device_type", lambda: check_device_type(5)),
        ("causal", lambda: ctx.causal("no")),
        ("window", lambda: ctx.window(-1)),
        ("window", lambda: ctx.window(2.5)),
        ("kv_chunks", lambda: ctx.kv_chunks(-1)),
        ("x", lambda: ctx.shard([1, 2, 3])),
        ("x", lambda: check_dim(None, 1)),
        ("ctx", lambda: hf.register(None)),
        ("ctx", lambda: hf.shard_inputs(None, ids, ids)),
        ("window", lambda: hf.shard_inputs(ctx, ids, ids, window=-1)),
        ("input_ids", lambda: hf.shard_inputs(ctx, [[1, 2]], None)),
        ("labels", lambda: hf.count_loss_tokens(None)),
        ("labels", lambda: hf.count_loss_tokens([[1, 2, 3]])),
        ("model", lambda: hf.all_reduce_grads(ctx, None)),
        ("blocks[0]", lambda: kernels([0], [4])),
        ("blocks[0]", lambda: kernels([-128], [4])),
        ("heads[0]", lambda: kernels([64], [-1])),
        ("heads[0]", lambda: kernels([64], [0])),
        ("dtype", lambda: kernels([64], [4], "float32")),
        ("torch.distributed", lambda: run_candidate_isolated(plan, model, work, timeout_s=60)),
        ("plans[0]", lambda: kernel_shapes([plan.model_dump()], model, work)),
        ("token_layout", lambda: attention(*[torch.randn(1, 8, 4, 8)] * 3, algorithm="ulysses", groups={},
                                           token_layout="balanced")),  # balanced places documents: none given
    ]
    if not torch.cuda.is_available():
        cases.append(("device_type", lambda: check_device_type("cuda")))
    return cases


def test_wrong_arguments_are_plan_errors_naming_them(plan, ctx):
    assert_fields(_calls(plan, ctx))


def test_context_arguments_take_bools_and_numpy_integers(ctx):
    assert ctx.causal(False) is False and ctx.causal(np.bool_(True)) is True
    assert ctx.window(np.int64(64)) == 64 and ctx.kv_chunks(np.int32(1)) == 1
    assert check_device_type("cpu") == "cpu"


def _refusals(rank: int, world: int) -> list[tuple[str, str]]:
    """(field, problem) of each call a rank makes with shards or ranks its plan does not give it."""
    import torch.distributed as dist  # noqa: PLC0415 - inside the spawned rank

    from sp_plan.planner.errors import PlanError as Refused  # noqa: PLC0415
    from sp_plan.runtime.attention import attention  # noqa: PLC0415
    from sp_plan.runtime.variants.ring import member_tokens  # noqa: PLC0415

    cu = (0, 3, 40, 41, 58, 77)
    short = len(member_tokens("balanced", world, 77, True, cu, None)[rank]) - 1  # one token fewer than it holds
    q = torch.randn(1, short, 4, 8)
    swapped = torch.randn(1, 38 if rank == 0 else 39, 4, 8)  # 77 tokens over 2: the other rank's count, in range
    calls = [lambda: attention(q, q, q, algorithm="ring", groups={"ring": dist.group.WORLD}, causal=True,
                               token_layout="balanced", cu_seqlens=cu),
             lambda: attention(torch.randn(1, 8, 4, 8), *[torch.randn(1, 8, 4, 8)] * 2, algorithm="ulysses",
                               groups={"ulysses": dist.group.WORLD}, ranks={"ulysses": [1, 0]}),
             lambda: sp_plan.init(sp_plan.Plan(algorithm="ring", degrees={"ring": 2}, order=["ring"],
                                               token_layout="balanced",
                                               workload={"seq_len": 77, "documents": [8]})).gather(q, 1, cu_seqlens=cu),
             lambda: attention(swapped, swapped, swapped, algorithm="ulysses", groups={"ulysses": dist.group.WORLD},
                               causal=True, cu_seqlens=cu)]
    out = []
    for call in calls:
        try:
            call()
            out.append(("", "no error"))
        except Refused as e:
            out.append((e.field, e.problem))
    return out


def test_shards_and_orders_the_plan_does_not_give_are_refused_on_every_rank():
    """Balanced shards one token short (no even split to check them against: only the layout's own count does) to
    the attention and to ctx.gather, and a ulysses order the all-to-all would not follow: a PlanError naming them on
    every rank, not a wrong result."""
    from harness.worlds import run_world  # noqa: PLC0415

    for got in run_world(_refusals, 2, timeout=120):
        (field, problem), (u_field, u_problem), (g_field, g_problem), (s_field, s_problem) = got
        assert field == "q" and "the balanced layout gives it" in problem, got
        assert u_field == "ranks.ulysses" and "differs from the group's rank order [0, 1]" in u_problem, got
        assert g_field == "cu_seqlens" and "the balanced layout gives this rank" in g_problem, got  # gather too
        assert s_field == "q" and "the contiguous layout gives it" in s_problem, got  # before the all-to-all
