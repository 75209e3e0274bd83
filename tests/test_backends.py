"""Block-kernel backends: exact against float64 on CPU, op schemas checked, the measured choice and its override."""
import pytest
import torch
import torch.nn.functional as F

from sp_plan.planner import Plan, PlanError
from sp_plan.runtime import backends as B
from sp_plan.runtime import choice as C
from sp_plan.runtime import init
from sp_plan.runtime import kernels as K
from exact import attention_terms, scaled_error, tolerance
from harness.worlds import run_world

CPU_BACKENDS = [n for n in B.PRIORITY if B.BACKENDS[n].available("cpu", torch.float32, 8)]


def _qkv(n_q=12, n_k=10, heads=4, kv_heads=2, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, n, h, dim, generator=g, dtype=torch.float64)
            for n, h in ((n_q, heads), (n_k, kv_heads), (n_k, kv_heads), (n_q, heads))]


def _reference(q, k, v, dout, allowed):
    """float64 SDPA with autograd (rows that see nothing give 0): out, lse, (dq, dk, dv)."""
    leaves = [x.detach().transpose(1, 2).clone().requires_grad_() for x in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, attn_mask=allowed, enable_gqa=True)
    out = torch.where(allowed.any(1).view(1, 1, -1, 1), out, 0.0) if allowed is not None else out
    out.backward(dout.transpose(1, 2))
    kk = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, kk) / q.shape[-1] ** 0.5
    lse = torch.logsumexp(s if allowed is None else s.masked_fill(~allowed, float("-inf")), -1)
    return out.transpose(1, 2), lse, [x.grad.transpose(1, 2) for x in leaves]


def test_cpu_has_a_real_choice():
    assert CPU_BACKENDS == ["cpu_flash", "math"]
    assert B.available("cpu", torch.float64, 8) == ["math"]


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("offset", [None, 0, -3, 4, "mask"])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2)])
def test_every_cpu_backend_is_exact_against_float64(backend, offset, heads, kv_heads):
    q, k, v, dout = _qkv(heads=heads, kv_heads=kv_heads)
    n_q, n_k = q.shape[1], k.shape[1]
    mask = None
    if offset == "mask":
        g = torch.Generator().manual_seed(7)
        mask = torch.rand(n_q, n_k, generator=g) < 0.6
        mask[3] = False  # a row that sees nothing
        allowed, kw = mask, {"mask": mask}
    else:
        allowed = None if offset is None else K.offset_mask(n_q, n_k, offset)
        kw = {"causal_offset": offset}
    ref_o, ref_l, ref_g = _reference(q, k, v, dout, allowed)
    f32 = [x.float() for x in (q, k, v, dout)]
    out, lse = K.block_attention(*f32[:3], backend=backend, **kw)
    grads = K.block_attention_backward(f32[3], *f32[:3], out, lse, backend=backend, **kw)
    live = allowed.any(1) if allowed is not None else torch.ones(n_q, dtype=torch.bool)
    tol = tolerance("float32", attention_terms(n_k, q.shape[-1], heads // kv_heads))
    assert scaled_error(out, ref_o) <= tol
    assert scaled_error(lse[..., live], ref_l[..., live]) <= tol
    assert torch.isneginf(lse[..., ~live]).all()
    for got, ref in zip(grads, ref_g):
        assert got.shape == ref.shape and scaled_error(got, ref) <= tol
    if backend == "math":  # the reference path in float64 is exact to rounding
        out64, lse64 = K.block_attention(q, k, v, backend="math", **kw)
        assert (out64 - ref_o).abs().max() <= 1e-12


def test_every_schema_this_module_calls_matches_the_installed_torch():
    for op, expected in B.SCHEMAS.items():
        assert B.schema_problem(op, expected) is None, op


def test_a_different_schema_makes_the_backend_unavailable_with_the_reason(monkeypatch):
    op = "_scaled_dot_product_flash_attention_for_cpu"
    wrong = B.SCHEMAS[op].replace("float? scale=None", "float? softmax_scale=None")
    why = B.BACKENDS["cpu_flash"].unavailable("cpu", torch.float32, 8, schemas={**B.SCHEMAS, op: wrong})
    assert why is not None and "has schema" in why and "softmax_scale" in why
    missing = B.schema_problem("_scaled_dot_product_no_such_attention", "aten::x() -> Tensor")
    assert "has no aten::_scaled_dot_product_no_such_attention" in missing
    # the cuDNN / flash SDPA schemas are checked on CPU too (the ops exist in every build)
    assert B.BACKENDS["cudnn"].unavailable("cuda", torch.bfloat16, 128, schemas={
        **B.SCHEMAS, "_scaled_dot_product_cudnn_attention_backward": "aten::old() -> Tensor"}).startswith(
        "aten::_scaled_dot_product_cudnn_attention_backward has schema")
    # the measured choice falls back cleanly: cpu_flash is left out, with that reason
    monkeypatch.setitem(B.SCHEMAS, op, wrong)
    choice = C.BackendChoice()
    q = torch.randn(1, 32, 2, 8)
    assert choice.choose(q, q, True) == "math"
    d = choice.decisions[choice.last]
    assert d.source == "only" and "softmax_scale" in d.rejected["cpu_flash"]


def test_measured_choice_is_an_available_backend_measured_once(monkeypatch):
    calls = []
    real = C.time_backend
    monkeypatch.setattr(C, "time_backend", lambda name, *a, **kw: calls.append(name) or real(name, *a, **kw))
    choice = C.BackendChoice(repeats=1)
    q, k = torch.randn(1, 100, 4, 16), torch.randn(1, 100, 2, 16)
    name = choice.choose(q, k, causal=True)
    assert name in CPU_BACKENDS and choice.backend == name
    d = choice.decisions[C.Key("cpu", "float32", 16, 128, True)]
    assert d.source == "measured" and set(d.seconds) == set(CPU_BACKENDS) and d.backend == min(d.seconds, key=d.seconds.get)
    assert sorted(calls) == sorted(CPU_BACKENDS)
    assert choice.choose(torch.randn(1, 120, 4, 16), k, causal=True) == name  # same bucket: no new measurement
    assert len(calls) == 2
    choice.choose(q, k, causal=False)  # another key is measured on its own
    assert len(calls) == 4 and len(choice.decisions) == 2
    assert C.BackendChoice().choose(q.double(), k.double(), True) == "math"  # float64: only math runs


def test_a_wrong_backend_fails_the_exactness_check(monkeypatch):
    broken = B.Backend("cpu_flash", lambda q, k, v, *a: (torch.zeros_like(q), torch.zeros(q.shape[0], q.shape[2],
                                                                                          q.shape[1])),
                       B.BACKENDS["cpu_flash"].backward, devices=("cpu",), dtypes=(torch.float32,))
    monkeypatch.setitem(B.BACKENDS, "cpu_flash", broken)
    choice = C.BackendChoice()
    assert choice.choose(torch.randn(1, 64, 2, 8), torch.randn(1, 64, 2, 8), False) == "math"
    assert "off by" in choice.decisions[choice.last].rejected["cpu_flash"]


def test_override_from_the_environment():
    q = torch.randn(1, 64, 2, 8)
    for name in CPU_BACKENDS:
        choice = C.BackendChoice.from_env({C.ENV: name})
        assert choice.choose(q, q, True) == name and choice.decisions[choice.last].source == "override"
    assert C.BackendChoice.from_env({C.ENV: ""}).override is None


def test_unknown_or_unavailable_override_is_a_clear_error():
    with pytest.raises(PlanError, match=r"SP_PLAN_ATTN_BACKEND: unknown attention backend 'fa3'.*one of"):
        C.BackendChoice.from_env({C.ENV: "fa3"})
    choice = C.BackendChoice.from_env({C.ENV: "cudnn"})
    with pytest.raises(PlanError, match=r"SP_PLAN_ATTN_BACKEND: backend 'cudnn' cannot run float32 blocks of head dim 8 "
                                        r"on cpu: cudnn runs on cuda.*one of \['cpu_flash', 'math'\]"):
        choice.choose(torch.randn(1, 8, 2, 8), torch.randn(1, 8, 2, 8), True)
    with pytest.raises(PlanError, match=r"cpu_flash takes float32, bfloat16, float16, not float64.*\['math'\]"):
        C.BackendChoice(override="cpu_flash").choose(torch.randn(1, 8, 2, 8).double(), torch.randn(1, 8, 2, 8).double(),
                                                     False)


def test_a_region_the_backend_cannot_take_goes_to_the_default():
    q, k, _, _ = _qkv(n_q=8, n_k=8)
    mask = torch.rand(8, 8) < 0.5
    assert K._prepare(q.float(), k.float(), None, mask, None, "flash")[2].name == "cpu_flash"  # no mask support
    assert K._prepare(q.float(), k.float(), -2, None, None, "flash")[2].name == "flash"  # 6 rows x 6 keys: square
    assert K._prepare(q.float(), k[:, :4].float(), 0, None, None, "flash_attn")[2].name == "cpu_flash"  # non-square
    assert K._prepare(q.float(), k.float(), 0, None, None, "flash")[2].name == "flash"
    assert K._prepare(q, k, None, None, None, "reference")[2].name == "math"  # the old name still works
    with pytest.raises(ValueError, match="unknown backend"):
        K._prepare(q, k, None, None, None, "fa9")


def _ctx_backend(rank, world, x):
    ctx = init(Plan(algorithm="ring", degrees={"ring": world}, order=["ring"], token_layout="zigzag"))
    assert ctx.attention_backend is None
    local = ctx.shard(x, dim=1).requires_grad_()
    out = ctx.attention(local, local, local, causal=True)
    out.sum().backward()
    return ctx.attention_backend, ctx.gather(out.detach(), dim=1), dict(ctx.backends.decisions)


@pytest.mark.parametrize("env", ["math", None])
def test_context_exposes_the_backend_and_stays_exact(monkeypatch, env):
    if env:
        monkeypatch.setenv(C.ENV, env)
    else:
        monkeypatch.delenv(C.ENV, raising=False)
    x = torch.randn(1, 64, 2, 8, generator=torch.Generator().manual_seed(0))
    res = run_world(_ctx_backend, 2, x, timeout=120)
    ref = F.scaled_dot_product_attention(*(x.transpose(1, 2),) * 3, is_causal=True).transpose(1, 2)
    for name, out, decisions in res:
        assert name == (env or name) and name in CPU_BACKENDS
        assert scaled_error(out, ref) <= tolerance("float32", attention_terms(x.shape[1], x.shape[-1]))
        (key,) = decisions
        assert key == C.Key("cpu", "float32", 8, 32, True)


def test_tune_times_the_chosen_backend_and_records_it(monkeypatch):
    from sp_plan.planner import ModelSpec
    from sp_plan.profiles import load_cluster
    from sp_plan.profiles.tune import measure_kernels
    from sp_plan.profiles.tune.kernels import chosen_backends
    from sp_plan.profiles.tune.run import base_params

    model = ModelSpec(name="tiny", layers=2, hidden=64, heads=4, kv_heads=2, vocab=128, dtype="fp32", gated_mlp=True)
    monkeypatch.setenv(C.ENV, "math")
    forced = measure_kernels(model, [32, 64], [4], torch.device("cpu"), torch.float32, causal=True, repeats=1,
                             gemm_rows=[])
    assert {s.backend for s in forced} == {"math"}
    monkeypatch.delenv(C.ENV)
    samples = [dict(vars(s), rank=0) for s in measure_kernels(model, [32, 64], [4], torch.device("cpu"),
                                                                  torch.float32, causal=True, repeats=1, gemm_rows=[])]
    assert {s["backend"] for s in samples} <= set(CPU_BACKENDS)
    _, said = base_params(load_cluster("cpu-local"), model, samples, None)
    assert f"attention blocks on {chosen_backends(samples)} (runtime.choice)" in said
    mixed = [dict(kind="attention_fwd", size=n, backend=b, rank=0) for n, b in ((64, "math"), (128, "cpu_flash"),
                                                                                (4096, "cpu_flash"))]
    assert chosen_backends(mixed) == "math for 64-token blocks, cpu_flash for 128, 4096-token blocks"
    assert chosen_backends(mixed[1:]) == "cpu_flash"
    # timed under the causal mask and without it: each group says which (one size on two backends reads plainly)
    masks = [dict(kind="attention_fwd", size=n, backend=b, causal=c, rank=0)
             for n, b, c in ((256, "cpu_flash", True), (128, "cpu_flash", True), (256, "math", False),
                             (128, "cpu_flash", False))]
    assert chosen_backends(masks) == ("cpu_flash for 128, 256-token causal blocks, cpu_flash for 128-token dense "
                                      "blocks, math for 256-token dense blocks")
    assert chosen_backends([m for m in masks if m["backend"] == "cpu_flash"]) == "cpu_flash"


def _recording_op(calls):
    """A stand-in for a fused op: records its arguments, returns gradients shaped like q, k, v (B, H, S, D)."""
    def op(*args, **kwargs):
        calls.append(args)
        return args[1].clone(), args[2].clone(), args[3].clone()
    return op


@pytest.mark.parametrize("name, undefined", [("cudnn", (8, 9, 10)), ("flash", (6, 7))])
def test_fused_backward_passes_dense_inputs_undefined_bias_and_offsets(monkeypatch, name, undefined):
    """cuDNN's and flash's backward read a defined bias / cum_seq tensor, even an empty one, as a bias or as varlen
    offsets (on CUDA: 'Dimension out of range', 'cu_seqlens_q must have dtype int32'): dense blocks pass None."""
    from sp_plan.runtime import backends as B

    calls = []
    monkeypatch.setattr(B, "_op", lambda op_name: _recording_op(calls))
    q = torch.randn(1, 16, 2, 8)
    lse = torch.zeros(1, 2, 16)
    dq, dk, dv = B.get(name).backward(q, q, q, q, q, lse, 0.5, True, None)
    assert dq.shape == q.shape
    args = calls[0]
    assert all(args[i] is None for i in undefined), [type(args[i]) for i in undefined]
    assert args[5].dtype == torch.float32  # lse goes in float32
