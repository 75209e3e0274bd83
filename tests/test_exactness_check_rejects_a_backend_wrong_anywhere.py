"""The measured backend choice only times backends that match float64 math: a backend wrong in any one output
(out, lse, dq, dk, dv), wrong only under the causal mask, wrong only with grouped K/V heads, producing NaN, or
raising is rejected with its reason; float32 outputs must be within 1e-4, gradients within 4x that."""
import torch

from sp_plan.runtime import backends as B
from sp_plan.runtime import choice as C

M = B.BACKENDS["math"]


def _backend(forward=None, backward=None, gqa=False):
    def fwd(q, k, v, scale, causal, mask):
        return M.forward(q, k, v, scale, causal, mask)

    def bwd(dout, q, k, v, out, lse, scale, causal, mask):  # from the exact out and lse, whatever the forward gave
        o, l = M.forward(q, k, v, scale, causal, mask)
        return M.backward(dout, q, k, v, o, l, scale, causal, mask)

    return B.Backend("cpu_flash", forward or fwd, backward or bwd, devices=("cpu",), dtypes=(torch.float32,), gqa=gqa)


def _check(monkeypatch, backend, causal=False, heads=2, kv_heads=2):
    monkeypatch.setitem(B.BACKENDS, "cpu_flash", backend)
    return C.check_exact("cpu_flash", torch.device("cpu"), torch.float32, 8, heads, kv_heads, causal)


def test_an_exact_backend_passes(monkeypatch):
    assert _check(monkeypatch, _backend()) is None
    assert _check(monkeypatch, _backend(), causal=True, heads=4, kv_heads=2) is None


def test_wrong_lse_alone_is_rejected(monkeypatch):
    def fwd(q, k, v, scale, causal, mask):
        o, l = M.forward(q, k, v, scale, causal, mask)
        return o, l + 1e-2
    why = _check(monkeypatch, _backend(forward=fwd))
    assert why is not None and "in lse" in why


def test_wrong_dk_alone_is_rejected(monkeypatch):
    base = _backend()

    def bwd(*a):
        dq, dk, dv = base.backward(*a)
        return dq, dk + 1.0, dv
    why = _check(monkeypatch, _backend(backward=bwd))
    assert why is not None and "in dk" in why


def test_a_backend_that_ignores_the_causal_mask_is_rejected_for_causal_blocks(monkeypatch):
    def fwd(q, k, v, scale, causal, mask):
        return M.forward(q, k, v, scale, False, mask)
    be = _backend(forward=fwd)
    assert _check(monkeypatch, be, causal=False) is None
    why = _check(monkeypatch, be, causal=True)
    assert why is not None and "in out" in why


def _wrong_grouping(x, h):  # K/V head j serves Q heads j, j + kv, ... instead of the consecutive group
    return x.repeat(1, 1, h // x.shape[2], 1)


def test_a_backend_wrong_only_for_grouped_kv_heads_is_rejected(monkeypatch):
    def fwd(q, k, v, scale, causal, mask):
        h = q.shape[2]
        return M.forward(q, _wrong_grouping(k, h), _wrong_grouping(v, h), scale, causal, mask)

    def bwd(dout, q, k, v, out, lse, scale, causal, mask):
        h = q.shape[2]
        kk, vv = _wrong_grouping(k, h), _wrong_grouping(v, h)
        dq, dk, dv = M.backward(dout, q, kk, vv, out, lse, scale, causal, mask)
        g = h // k.shape[2]
        fold = lambda d: d.view(d.shape[0], d.shape[1], g, k.shape[2], d.shape[3]).sum(2)  # noqa: E731
        return dq, fold(dk), fold(dv)
    be = _backend(forward=fwd, backward=bwd, gqa=True)
    assert _check(monkeypatch, be, heads=2, kv_heads=2) is None
    assert _check(monkeypatch, be, heads=4, kv_heads=2) is not None
    # the choice checks with the caller's K/V heads
    monkeypatch.setitem(B.BACKENDS, "cpu_flash", be)
    choice = C.BackendChoice(repeats=1)
    assert choice.choose(torch.randn(1, 32, 4, 8), torch.randn(1, 32, 2, 8), False) == "math"
    assert "cpu_flash" in choice.decisions[choice.last].rejected


def test_nan_output_is_rejected(monkeypatch):
    def fwd(q, k, v, scale, causal, mask):
        o, l = M.forward(q, k, v, scale, causal, mask)
        return torch.full_like(o, float("nan")), l
    why = _check(monkeypatch, _backend(forward=fwd))
    assert why is not None and "in out" in why


def test_a_backend_that_raises_is_rejected_with_the_error(monkeypatch):
    def fwd(*a):
        raise RuntimeError("no kernel image")
    why = _check(monkeypatch, _backend(forward=fwd))
    assert why == "cpu_flash failed: RuntimeError: no kernel image"


def test_float32_tolerance_is_tight_on_outputs_and_four_times_looser_on_gradients(monkeypatch):
    def fwd(q, k, v, scale, causal, mask):
        o, l = M.forward(q, k, v, scale, causal, mask)
        return o + 2e-4, l
    why = _check(monkeypatch, _backend(forward=fwd))
    assert why is not None and "in out" in why and "tolerance 0.0001" in why
    base = _backend()

    def bwd(*a):
        return tuple(g + 2e-4 for g in base.backward(*a))
    assert _check(monkeypatch, _backend(backward=bwd)) is None
