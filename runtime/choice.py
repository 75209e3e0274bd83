"""Which block kernel runs: ``SP_PLAN_ATTN_BACKEND`` if set, else the fastest correct one, measured once.

The choice is kept per (device, dtype, head dim, block length bucket, causal) in one explicit
``BackendChoice`` object (the ``Context`` owns one; nothing global). On first use of a key, every
backend available there (``backends.available``) is first checked against the float64 math path
on a small block (forward out and lse, backward dq, dk, dv), then the correct ones are timed,
forward + backward, on a representative block of the bucket's length; the fastest wins.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

import torch

from sp_plan.planner.errors import PlanError

from . import backends as B
from .kernels import block_attention, block_attention_backward

ENV = "SP_PLAN_ATTN_BACKEND"
#: the names a user may give in ``SP_PLAN_ATTN_BACKEND`` (math = the plain reference path)
NAMES = ("cudnn", "flash", "flash_attn", "efficient", "math", "cpu_flash")
#: how far a backend's result may be from float64, by input dtype (max abs error, inputs ~ N(0, 1))
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 8e-2, torch.float64: 1e-10}


@dataclass(frozen=True)
class Key:
    """What a choice depends on: device type, dtype, head dim, block length bucket (power of 2), causal."""

    device: str
    dtype: str
    head_dim: int
    bucket: int
    causal: bool


@dataclass(frozen=True)
class Decision:
    """A choice: the backend, each candidate's measured seconds (fwd + bwd), and why others were left out."""

    backend: str
    seconds: dict[str, float] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    source: str = "measured"  # "measured", "only" (one candidate) or "override"


def bucket(n: int) -> int:
    """Block length bucket: the next power of two (at least 16)."""
    return max(16, 1 << max(0, math.ceil(math.log2(max(n, 1)))))


def key_of(q: torch.Tensor, causal: bool) -> Key:
    return Key(q.device.type, str(q.dtype).replace("torch.", ""), int(q.shape[-1]), bucket(q.shape[1]), bool(causal))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":  # pragma: no cover - needs CUDA
        torch.cuda.synchronize(device)


def check_exact(name: str, device: torch.device, dtype: torch.dtype, head_dim: int, heads: int, kv_heads: int,
                causal: bool, n: int = 64) -> str | None:
    """None if ``name`` matches float64 math on a small block (fwd out/lse, bwd), else what went wrong."""
    g = torch.Generator().manual_seed(0)
    rnd = lambda h: torch.randn(1, n, h, head_dim, generator=g, dtype=torch.float64)  # noqa: E731
    q64, k64, v64, do64 = rnd(heads), rnd(kv_heads), rnd(kv_heads), rnd(heads)
    off = 0 if causal else None
    ref_o, ref_l = block_attention(q64, k64, v64, causal_offset=off, backend="math")
    ref_g = block_attention_backward(do64, q64, k64, v64, ref_o, ref_l, causal_offset=off, backend="math")
    q, k, v, do = (x.to(device=device, dtype=dtype) for x in (q64, k64, v64, do64))
    try:
        o, lse = block_attention(q, k, v, causal_offset=off, backend=name)
        grads = block_attention_backward(do, q, k, v, o, lse, causal_offset=off, backend=name)
    except Exception as e:  # noqa: BLE001 - any failure of a fused op rules the backend out, with its reason
        return f"{name} failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    tol = TOLERANCE.get(dtype, 1e-2)
    for what, got, ref in (("out", o, ref_o), ("lse", lse, ref_l), ("dq", grads[0], ref_g[0]),
                           ("dk", grads[1], ref_g[1]), ("dv", grads[2], ref_g[2])):
        err = float((got.to("cpu", torch.float64) - ref).abs().max())
        if not err <= tol * (4 if what[0] == "d" else 1):
            return f"{name} is off by {err:.3g} in {what} (tolerance {tol:g})"
    return None


def time_backend(name: str, device: torch.device, dtype: torch.dtype, head_dim: int, heads: int, kv_heads: int,
                 causal: bool, n: int, repeats: int = 3) -> float:
    """Median seconds of one block forward + backward of ``name`` on (1, n, heads, head_dim)."""
    g = torch.Generator().manual_seed(1)
    rnd = lambda h: torch.randn(1, n, h, head_dim, generator=g).to(device=device, dtype=dtype)  # noqa: E731
    q, k, v, do = rnd(heads), rnd(kv_heads), rnd(kv_heads), rnd(heads)
    off = 0 if causal else None

    def step():
        o, lse = block_attention(q, k, v, causal_offset=off, backend=name)
        block_attention_backward(do, q, k, v, o, lse, causal_offset=off, backend=name)

    step()  # warm-up
    times = []
    for _ in range(max(1, repeats)):
        _sync(device)
        t0 = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _check_name(name: str) -> str:
    if name not in NAMES:
        raise PlanError(ENV, f"unknown attention backend {name!r}", f"set {ENV} to one of {list(NAMES)} or unset it")
    return name


@dataclass
class BackendChoice:
    """The block-kernel choice of one process: an optional override and the measured decisions by ``Key``.

    ``max_block`` caps the representative block's length (the bucket is timed up to it; default 4096
    tokens on CUDA, 1024 on CPU, where one math step of 4096 tokens takes seconds); ``repeats`` timed
    runs per candidate.
    """

    override: str | None = None
    repeats: int = 3
    max_block: int | None = None
    decisions: dict[Key, Decision] = field(default_factory=dict)
    last: Key | None = None
    _keys: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        if self.override is not None:
            _check_name(self.override)

    @classmethod
    def from_env(cls, environ=None, **kw) -> BackendChoice:
        """A choice honouring ``SP_PLAN_ATTN_BACKEND`` (empty or unset = measure)."""
        name = (os.environ if environ is None else environ).get(ENV, "").strip()
        return cls(override=name or None, **kw)

    def choose(self, q: torch.Tensor, k: torch.Tensor, causal: bool) -> str:
        """The backend for blocks like (q, k) (batch, seq, heads, head dim); measured on the key's first use."""
        seen = (q.device, q.dtype, q.shape[-1], q.shape[1], causal)  # every layer asks with the same block
        key = self._keys.get(seen)
        if key is None:
            key = self._keys[seen] = key_of(q, causal)
        if key not in self.decisions:
            self.decisions[key] = self._decide(key, q.device, q.dtype, q.shape[2], k.shape[2])
        self.last = key
        return self.decisions[key].backend

    @property
    def backend(self) -> str | None:
        """The backend of the most recent ``choose`` (None before the first)."""
        return None if self.last is None else self.decisions[self.last].backend

    def _decide(self, key: Key, device, dtype, heads: int, kv_heads: int) -> Decision:
        names = [n for n in B.PRIORITY if n in NAMES]
        why = {n: B.BACKENDS[n].unavailable(key.device, dtype, key.head_dim) for n in names}
        if self.override is not None:
            reason = why[self.override]
            if reason is not None:
                ok = [n for n in names if why[n] is None]
                raise PlanError(ENV, f"backend {self.override!r} cannot run {key.dtype} blocks of head dim "
                                f"{key.head_dim} on {key.device}: {reason}",
                                f"set {ENV} to one of {ok} here, or unset it to measure")
            return Decision(self.override, source="override")
        rejected = {n: r for n, r in why.items() if r is not None}
        candidates = [n for n in names if why[n] is None]
        for n in list(candidates):
            bad = check_exact(n, device, dtype, key.head_dim, heads, kv_heads, key.causal)
            if bad is not None:
                rejected[n] = bad
                candidates.remove(n)
        if not candidates:  # math is exact by construction; only a broken build gets here
            raise PlanError(ENV, f"no attention backend is correct for {key}: {rejected}",
                            f"report this; set {ENV}=math to force the reference path")
        if len(candidates) == 1:
            return Decision(candidates[0], rejected=rejected, source="only")
        cap = self.max_block or (4096 if key.device == "cuda" else 1024)
        n = min(key.bucket, cap)
        secs = {c: time_backend(c, device, dtype, key.head_dim, heads, kv_heads, key.causal, n, self.repeats)
                for c in candidates}
        return Decision(min(secs, key=secs.get), seconds=secs, rejected=rejected)
