"""tune's measurement side: kernel samples, the layer stack's sharding, run_candidate and its isolation."""
import json
import math
import os
import time

import pytest
import torch
import torch.distributed as dist

from sp_plan.planner import ModelSpec, Plan, Workload
from sp_plan.profiles.tune import PeakMemory, kernel_shapes, measure_kernels, run_candidate, run_candidate_isolated
from sp_plan.profiles.tune.candidate import extrapolate, layer_counts
from sp_plan.profiles.tune.isolate import combine
from sp_plan.profiles.tune.kernels import attention_flops, token_rows
from sp_plan.profiles.tune.parallel import parallelize, replica_mesh
from sp_plan.profiles.tune.stack import build_stack, random_batch
from sp_plan.runtime import init
from sp_plan.runtime.kernels import local_attention
from harness.worlds import run_world

MODEL = ModelSpec(name="tiny", layers=4, hidden=64, heads=4, kv_heads=2, vocab=128, dtype="fp32", gated_mlp=True)
WORK = Workload(seq_len=256)


# ---------------------------------------------------------------- kernels

def test_attention_flops_formula():
    assert attention_flops(128, 4, 16, causal=False) == 4 * 128 * 128 * 4 * 16
    assert attention_flops(128, 4, 16, causal=True) == 2 * 128 * 128 * 4 * 16
    assert attention_flops(128, 4, 16, causal=True, backward=True) == 2.5 * 2 * 128 * 128 * 4 * 16


def test_measure_kernels_samples(monkeypatch):
    # the backend pinned: which one wins a timed choice depends on the host's load (tests/test_backends.py tests it)
    monkeypatch.setenv("SP_PLAN_ATTN_BACKEND", "cpu_flash")
    s = measure_kernels(MODEL, [64, 128], [2, 4], torch.device("cpu"), torch.float32, causal=True, repeats=2,
                        gemm_rows=[128])
    att = [x for x in s if x.kind.startswith("attention")]
    mm = [x for x in s if x.kind == "matmul"]
    # causal work: every block timed under the causal mask and dense (a ring's diagonal vs its other rounds)
    assert len(att) == 2 * 2 * 2 * 2 and len(mm) == 4
    assert sum(x.causal for x in att) == sum(not x.causal for x in att) == 8
    assert all(x.seconds > 0 and x.flops > 0 for x in s)
    for x in att:
        assert x.head_dim == 16 and x.backend == "cpu_flash"
        assert x.flops == attention_flops(x.size, x.heads, 16, x.causal, backward=x.kind == "attention_bwd")
    up = 2 * MODEL.ffn_hidden  # SwiGLU: gate and up
    assert sorted(x.gemm for x in mm) == sorted([(128, 64 + 2 * 32, 64), (128, 64, 64), (128, up, 64), (128, 64, 256)])
    assert all(x.flops == 2 * math.prod(x.gemm) for x in mm)


def test_measure_kernels_agrees_on_windows_once_every_kernel_is_prepared(monkeypatch):
    from sp_plan.profiles.tune import kernels

    events = []
    real_choose = kernels.BackendChoice.choose
    monkeypatch.setattr(kernels.BackendChoice, "choose",
                        lambda self, *a, **k: (events.append("choose"), real_choose(self, *a, **k))[1])
    real_window = kernels.time_window
    monkeypatch.setattr(kernels, "time_window", lambda fn, dev, a, b: (events.append(("window", a, b)),
                                                                       real_window(fn, dev, a, b))[1])

    firsts = []

    def agree(first_seconds):
        events.append("agree")
        firsts.extend(first_seconds)
        return time.time() + 0.01, [0.02 * (i + 1) for i in range(len(first_seconds))]

    s = measure_kernels(MODEL, [64], [2], torch.device("cpu"), torch.float32, causal=True, gemm_rows=[64],
                        windows=agree)
    assert len(s) == 2 * 2 + 4 and all(x.seconds > 0 for x in s)
    assert len(firsts) == len(s) and all(t > 0 for t in firsts)  # every kernel's first call, timed
    i = events.index("agree")
    assert events.count("agree") == 1 and events[:i] == ["choose", "choose"]  # both masks chosen before the windows
    wins = [e for e in events[i + 1:]]
    assert len(wins) == len(s) and all(w[0] == "window" for w in wins)
    # each kernel its own window, laid end to end: 90 % of its length timed, the next one starts where it ends
    for k, (_, a, b) in enumerate(wins):
        assert b - a == pytest.approx(0.9 * 0.02 * (k + 1), abs=1e-6)
        if k:
            assert a - wins[k - 1][1] == pytest.approx(0.02 * k, abs=1e-6)


def test_shared_windows_are_calls_of_the_slowest_first_call_and_at_least_the_floor():
    from sp_plan.profiles.tune.kernels import shared_windows

    before = time.time()
    start, lengths = shared_windows([0.001, 0.02, 0.5], calls=8, least=0.05)
    assert before < start <= time.time() + 0.05
    assert lengths == pytest.approx([0.05, 0.16, 4.0])


def _kernel_step(rank, world, timing):
    from sp_plan.profiles.tune import kernels, run

    calls = []
    real = kernels.shared_windows
    kernels.shared_windows = lambda firsts, **kw: (calls.append(len(firsts)),
                                                   real(firsts, **{"calls": 2, "least": 0.005, **kw}))[1]
    try:
        samples = run.measure_kernels_step([Plan(algorithm="ring", degrees={"ring": 2})], MODEL, WORK,
                                           run.TuneOptions(kernel_timing=timing, kernel_repeats=1))
    finally:
        kernels.shared_windows = real
    return calls, len(samples), sorted({s["rank"] for s in samples})


@pytest.mark.parametrize("timing", ["each", "shared", "auto"])
def test_kernel_step_times_in_shared_windows_only_when_asked(timing):
    for calls, n, ranks in run_world(_kernel_step, 2, timing, timeout=120):
        assert ranks == [0, 1] and n > 0
        # shared (auto on CPU ranks): one agreement over every kernel of the sweep; measure_alone's together
        # timing always agrees one window (per rank: the sweep's kernels and 4 samples of measure_alone)
        assert calls == ([n // 2 - 4, 1] if timing != "each" else [1])


def test_auto_kernel_timing_is_shared_on_cpu_and_each_on_gpu():
    from sp_plan.profiles.tune.run import TuneOptions, kernel_timing

    assert kernel_timing(TuneOptions(), torch.device("cpu")) == "shared"
    assert kernel_timing(TuneOptions(), torch.device("cuda", 0)) == "each"
    assert kernel_timing(TuneOptions(kernel_timing="each"), torch.device("cpu")) == "each"


def test_kernel_shapes_follow_the_schedules():
    w = Workload(seq_len=512)
    cases = [(Plan(algorithm="ring", degrees={"ring": 2}, token_layout="zigzag"), [128, 256], [4]),
             (Plan(algorithm="ulysses", degrees={"ulysses": 2}), [512], [2]),
             (Plan(algorithm="usp", degrees={"ulysses": 2, "ring": 2, "tp": 2}), [256], [1]),
             (Plan(algorithm="wallfacer", degrees={"ring": 4, "team": 2}), [128], [4]),  # causal: C^2 ring blocks
             (Plan(algorithm="tokenring", degrees={"ring": 4}), [128], [4]),
             (Plan(algorithm="metp", degrees={"tp": 2}), [256], [2])]
    for plan, blocks, heads in cases:
        assert kernel_shapes([plan], MODEL, w) == (blocks, heads), plan.summary()
    both = kernel_shapes([c[0] for c in cases[:2]], MODEL, w)
    assert both == ([128, 256, 512], [2, 4])
    assert token_rows([c[0] for c in cases], w) == [128, 256]


# ---------------------------------------------------------------- memory and extrapolation

def test_peak_memory_sees_a_known_tensor():
    base = torch.zeros(1000)
    tracker = PeakMemory()
    tracker.track(base)
    assert tracker.live == 4000
    with tracker:
        a = torch.empty(1 << 18)  # 1 MiB
        v = a.view(-1)  # a view is not a new allocation
        del a, v
        b = torch.ones(10)
    assert tracker.peak >= 4000 + (1 << 20)
    assert tracker.peak < 4000 + (1 << 20) + 1000
    assert tracker.live == 4000 + 40
    del b


def test_a_tensor_tracked_twice_and_its_gradient_count_once_each():
    """A parameter tracked with its module and again by itself counts its storage once; its gradient counts too
    (a model's and an optimizer's tensors overlap)."""
    lin = torch.nn.Linear(100, 10, bias=False)
    lin.weight.grad = torch.zeros_like(lin.weight)
    tracker = PeakMemory()
    tracker.track(lin, lin.weight)
    assert tracker.live == 2 * 4000


def test_extrapolation_is_linear_in_layers():
    assert layer_counts(16, 2) == [1, 2] and layer_counts(1, 2) == [1] and layer_counts(3, 5) == [1, 3]
    v, fixed, per, clamped = extrapolate({1: 3.0, 2: 5.0}, 10)
    assert (v, fixed, per, clamped) == (21.0, 1.0, 2.0, False)
    assert extrapolate({1: 3.0, 2: 2.9}, 10)[2:] == (0.0, True)


def test_combine_outcomes():
    ok = [(0, "ok", {"x": 1}, 5.0), (1, "ok", {"x": 1}, 5.0)]
    assert combine(ok) == ("ok", None, {"x": 1})
    err = [(0, "error", "peer closed", 2.0), (1, "oom", "injected", 1.0)]
    assert combine(err) == ("oom", 1, "injected")
    hang = [(0, "error", "timed out waiting", 2.0), (1, "timeout", "no result", 3.0)]
    assert combine(hang)[:2] == ("timeout", 1)


# ---------------------------------------------------------------- the stack is really sharded

def _forward_vs_single(rank, world, plans):
    errs = []
    x, _ = random_batch(MODEL, 1, WORK.seq_len, seed=7)
    for plan in plans:
        ref = build_stack(MODEL, 2, seed=3)(x, lambda q, k, v: local_attention(q, k, v, causal=True))
        ctx = init(plan)
        par = parallelize(build_stack(MODEL, 2, seed=3), plan, replica_mesh(plan, "cpu"))
        mine = lambda t: par.shard_tokens(ctx.shard(t, dim=1))  # noqa: E731  (TP-sp: 1/tp of the rank's tokens)
        out = par.module(mine(x), lambda q, k, v: ctx.attention(q, k, v, causal=True))
        errs.append((out - mine(ref)).abs().max().item())
    return errs


def test_stack_forward_equals_single_process():
    plans = [Plan(algorithm="ring", degrees={"ring": 2}, token_layout="zigzag"),
             Plan(algorithm="ulysses", degrees={"ulysses": 2}),
             Plan(algorithm="ring", degrees={"tp": 2})]
    for errs in run_world(_forward_vs_single, 2, plans, timeout=60):
        assert max(errs) < 1e-5, errs


def _tp_sp_grads_vs_single(rank, world, plan):
    """Gradients of the summed logits^2 under TP with sequence parallelism against one process."""
    x, _ = random_batch(MODEL, 1, WORK.seq_len, seed=7)
    attend = lambda q, k, v: local_attention(q, k, v, causal=True)  # noqa: E731
    ref = build_stack(MODEL, 2, seed=3)
    ref(x, attend).pow(2).sum().backward()
    ctx = init(plan)
    par = parallelize(build_stack(MODEL, 2, seed=3), plan, replica_mesh(plan, "cpu"))
    par.module(par.shard_tokens(ctx.shard(x, dim=1)), lambda q, k, v: ctx.attention(q, k, v, causal=True)
               ).pow(2).sum().backward()
    got = dict(par.module.named_parameters())
    partial_before = sorted(n for n, q in got.items() if any(pl.is_partial() for pl in getattr(q.grad, "placements", ())))
    par.sync_grads()  # the norms' partial sums reduced once, so the optimizer issues no collective of its own
    partial_after = [n for n, q in got.items() if any(pl.is_partial() for pl in getattr(q.grad, "placements", ()))]
    errs = {}
    for name, want in ref.named_parameters():
        g = got[name].grad
        if hasattr(g, "full_tensor"):  # TP weights (sharded) and SequenceParallel norms (summed: replicated)
            g = g.full_tensor()
        else:  # replicated embedding, final norm, head: each TP rank's share of the tokens
            g = g.clone()
            dist.all_reduce(g)
        errs[name] = ((g - want.grad).abs().max() / want.grad.abs().max()).item()
    return errs, partial_before, partial_after


def test_stack_tp_sequence_parallel_gradients_equal_single_process():
    for errs, before, after in run_world(_tp_sp_grads_vs_single, 2, Plan(algorithm="ring", degrees={"tp": 2}),
                                         timeout=60):
        assert any(".norm1." in n for n in errs) and any(".attn.q." in n for n in errs)
        assert max(errs.values()) < 1e-5, errs
        assert before and all(".norm" in n for n in before) and after == [], (before, after)


def _bucketed_sync(rank, world):
    from sp_plan.profiles.tune import parallel

    params = [torch.nn.Parameter(torch.zeros(n)) for n in (3, 70, 5, 40)]
    for i, p in enumerate(params):
        p.grad = torch.full_like(p, float(rank + 1) * (i + 1))
    calls = []
    real = dist.all_reduce
    dist.all_reduce = lambda t, group=None: (calls.append(t.numel()), real(t, group=group))[1]
    try:
        parallel.DDP_BUCKET_BYTES = 300.0  # 75 floats a bucket: [40 + 5], [70 + 3], from the last parameter back
        parallel._manual_sync(params, dist.group.WORLD)()
    finally:
        dist.all_reduce = real
    mean = sum(r + 1 for r in range(world)) / world
    return calls, [p.grad.tolist() == [mean * (i + 1)] * p.numel() for i, p in enumerate(params)]


def test_manual_gradient_sync_averages_in_ddp_sized_buckets():
    for calls, ok in run_world(_bucketed_sync, 2, timeout=60):
        assert calls == [45, 73] and all(ok)


# ---------------------------------------------------------------- run_candidate

def _candidates(rank, world, plans, limit):
    out = [run_candidate(p, MODEL, WORK, iters=2) for p in plans]
    out.append(run_candidate(plans[0], MODEL, WORK, iters=1, memory_limit_bytes=limit))
    two = Workload(seq_len=WORK.seq_len, batch=2)  # two micro-batches, gradients accumulated
    out += [run_candidate(p, MODEL, two, iters=1) for p in (plans[0], plans[2])]
    out.append(run_candidate(Plan(algorithm="ring", degrees={"dp": 2}), MODEL, two, iters=1))  # a sequence a replica
    out.append(run_candidate(Plan(algorithm="ring", degrees={"ring": 4}), MODEL, WORK))  # wrong world: every rank fails
    return out


def _check_ok(res, plan, target=4, fallbacks=0):
    assert res.status == "ok", res.reason
    assert res.summary == plan.summary() and res.plan["model"]["name"] == "tiny" and res.plan["workload"]
    assert res.measured_s > 0 and res.measured_memory > 0
    d = res.detail
    assert d["layers_measured"] == [1, 2] and d["layers_target"] == target
    m1, m2 = d["measured"]["1"], d["measured"]["2"]
    assert m2["peak_bytes"] > m1["peak_bytes"] > 0  # a block adds weights, gradients, AdamW state
    for q in ("fwd_bwd_s", "optimizer_s", "peak_bytes"):
        f = d["fit"][q]
        if not f["clamped"]:
            assert f["fixed"] + f["per_layer"] == pytest.approx(m1[q])
            assert f["fixed"] + 2 * f["per_layer"] == pytest.approx(m2[q])
        assert f["value"] == pytest.approx(f["fixed"] + target * f["per_layer"])
    if plan.degrees["pp"] == 1:
        m = d["micro_batches"]
        assert res.measured_s == pytest.approx(m * d["fit"]["fwd_bwd_s"]["value"] + d["fit"]["optimizer_s"]["value"])
        assert res.measured_memory == pytest.approx(d["fit"]["peak_bytes"]["value"])
    assert res.measured_memory > m2["peak_bytes"] or target == 2
    assert "PeakMemory" in d["memory_method"] and len(d["fallbacks"]) == fallbacks
    json.dumps(res.model_dump(mode="json"))  # storable as is


def test_run_candidate_two_ranks():
    plans = [Plan(algorithm="ring", degrees={"ring": 2}, token_layout="zigzag"),
             Plan(algorithm="ulysses", degrees={"ulysses": 2}),
             Plan(algorithm="ring", degrees={"ring": 2}, zero_stage=3),
             Plan(algorithm="ring", degrees={"ring": 2}, checkpointing="full"),
             Plan(algorithm="ulysses", degrees={"ulysses": 2}, checkpointing="attention_boundary", zero_stage=1),
             Plan(algorithm="metp", degrees={"tp": 2}, token_layout="zigzag")]
    results = run_world(_candidates, 2, plans, 1e5, timeout=120)
    assert results[0] == results[1]  # every rank returns the same result
    for res, plan in zip(results[0], plans):
        _check_ok(res, plan)
    assert "FSDP2" in results[0][2].detail["zero"] and "reshard_after_forward=True" in results[0][2].detail["zero"]
    assert "ZeroRedundancyOptimizer" in results[0][4].detail["zero"]
    assert "METPAttention" in results[0][5].detail["metp"]
    wrong = results[0][-1]
    assert (wrong.status, wrong.rank) == ("error", 0) and "needs 4 ranks" in wrong.reason
    for acc, plan in zip(results[0][-4:-2], (plans[0], plans[2])):
        assert acc.detail["micro_batches"] == acc.detail["micro_batches_run"] == 2
        _check_ok(acc, plan)
    replicas = results[0][-2]
    assert replicas.detail["micro_batches"] == 1  # two sequences over two data-parallel replicas
    _check_ok(replicas, Plan(algorithm="ring", degrees={"dp": 2}))
    oom = results[0][-5]
    assert oom.status == "oom" and "exceeds the device memory" in oom.reason


def _four(rank, world, plans):
    return [run_candidate(p, MODEL, WORK, iters=1) for p in plans]


def test_run_candidate_four_ranks_usp_pp_tp():
    plans = [Plan(algorithm="usp", degrees={"ulysses": 2, "ring": 2}, token_layout="zigzag"),
             Plan(algorithm="ring", degrees={"ring": 2, "pp": 2}),
             Plan(algorithm="ring", degrees={"ring": 2, "tp": 2}, zero_stage=3)]
    res = run_world(_four, 4, plans, timeout=120)
    assert all(r == res[0] for r in res)
    usp, pp, tp = res[0]
    _check_ok(usp, plans[0])
    _check_ok(pp, plans[1], target=2, fallbacks=1)  # pipeline composed, said in the fallbacks
    d = pp.detail
    m = d["micro_batches"]
    assert d["stage_sends_s"] > 0  # the stage-boundary traffic is timed, not left out
    fit = {q: d["fit"][q]["value"] for q in ("fwd_bwd_s", "sync_s", "optimizer_s")}
    assert fit["sync_s"] >= 0  # the gradients' sync read apart, and counted once a step
    assert pp.measured_s == pytest.approx((m + 2 - 1) * (fit["fwd_bwd_s"] + d["stage_sends_s"]) + fit["sync_s"]
                                          + fit["optimizer_s"])
    assert "COMPOSED 1F1B" in d["pipeline"]
    _check_ok(tp, plans[2])
    assert "tensor.parallel" in tp.detail["tp"] and "sequence parallelism" in tp.detail["tp"]
    assert "FSDP2" in tp.detail["zero"]


# ---------------------------------------------------------------- faults are results

def _isolated(rank, world, faults):
    out = []
    for fault in faults:
        # a hang waits out its timeout, so those are short; a candidate that must finish gets room for a loaded host
        hangs = fault is not None and fault.split("@")[0] in ("hang", "stall")
        res = run_candidate_isolated(Plan(algorithm="ring", degrees={"ring": 2}), MODEL, WORK,
                                     timeout_s=8 if hangs else 30,
                                     fault=fault, iters=1)
        x = torch.ones(1)
        dist.all_reduce(x)  # the parent world still works
        out.append((res.status, res.rank, res.reason, res.measured_s, x.item()))
    return out


def test_isolated_faults_are_results_and_the_world_survives():
    res = run_world(_isolated, 2, [None, "raise@1", "oom", "hang@1"], timeout=60)
    assert res[0] == res[1]
    ok, raised, oom, hang = res[0]
    assert ok[0] == "ok" and ok[3] > 0 and ok[4] == 2.0
    assert raised[:2] == ("error", 1) and "injected fault on rank 1" in raised[2]
    assert oom[:2] == ("oom", 0) and "out-of-memory" in oom[2]
    assert hang[:2] == ("timeout", 1) and "did not finish" in hang[2]
    assert all(r[4] == 2.0 for r in res[0])


def _shared_choice(rank, world):
    from sp_plan.runtime.choice import ENV

    os.environ.pop(ENV, None)  # measured, not overridden
    made: dict = {}
    plan = Plan(algorithm="ring", degrees={"ring": 2})
    first = run_candidate_isolated(plan, MODEL, WORK, timeout_s=60, iters=1, backends=made)
    after_first = dict(made)
    second = run_candidate_isolated(plan, MODEL, WORK, timeout_s=60, iters=1, backends=made)
    return first.status, second.status, after_first, made


def test_a_candidates_block_kernel_choices_are_handed_to_the_next_candidate():
    # the first candidate's child measures its blocks' kernel choices and hands them back; the second's child uses
    # them as made (a choice measured again would carry other seconds) and makes none more
    res = run_world(_shared_choice, 2, timeout=120)
    for first, second, after_first, made in res:
        assert (first, second) == ("ok", "ok") and after_first
        assert made == after_first and any(d.source == "measured" and d.seconds for d in made.values())


def _hung(rank, world):
    t0 = time.monotonic()
    res = run_candidate_isolated(Plan(algorithm="ring", degrees={"ring": 2}), MODEL, WORK, timeout_s=120,
                                 collective_timeout_s=3, grace_s=2, fault="hang@1", iters=1)
    return res.status, res.rank, res.reason, time.monotonic() - t0


def test_a_child_whose_peer_failed_is_given_up_after_the_grace_not_the_timeout():
    # rank 1's child hangs before its first collective; rank 0's gives up on it at 3 s and reports an error:
    # rank 1's parent then kills its child 2 s later, not at the candidate's 120 s
    res = run_world(_hung, 2, timeout=60)
    assert [r[:3] for r in res] == [res[0][:3]] * 2
    status, rank, reason, took = res[0]
    assert (status, rank) == ("timeout", 1) and "after a peer's child failed" in reason and "rank 0:" in reason
    assert took < 120  # given up after the grace, not at the candidate's timeout


def test_a_child_stalled_after_its_peers_reported_is_waited_for_past_the_parent_worlds_timeout():
    # rank 1's child hangs once the candidate ran; rank 0's has reported and its parent waits 8 s for rank 1's
    # in a world whose collectives time out after 3 s: the parents agree in beats, never in one long collective
    res = run_world(_isolated, 2, ["stall@1"], timeout=60, collective_timeout=3)
    assert res[0] == res[1]
    (stalled,) = res[0]
    assert stalled[:2] == ("timeout", 1) and "did not finish" in stalled[2] and stalled[4] == 2.0
