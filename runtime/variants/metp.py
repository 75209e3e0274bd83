"""Memory-efficient tensor parallelism (METP, seeds/002) as torch.nn.Modules over a process group of p ranks.

Every rank holds the tokens X_i of ring position i (``planner.layout.ring_tokens`` over the group,
contiguous or zigzag) and a 1/p shard of each weight; nothing of size b s h is ever gathered.

- ``METPFeedForward`` (Algorithms 1-2): O = f(X W_in) W_out with W_in split by columns and W_out by
  rows. Forward: in step j rank i holds the slice pair of rank (i + j) mod p, computes
  f(X_i B) C into O_i and meanwhile sends the pair to rank i - 1 and receives the next from
  i + 1 (double-buffered; p - 1 sends). Backward: the pairs go round again while the
  FlashAttention-like recompute of T = X_i B gives dX_i, dB, dC; the gradient accumulator of a
  slice follows it one step behind and its last hop reaches the owner, which adds its own step-0
  term (p - 1 hops: the paper's 3 (p-1)/p (k1 k2 + k2 n) in all, Sec. 3.2.1).
- ``METPAttention`` (Algorithms 3-6, two-level METP MHA): W_qkv split by columns into the heads of
  p head groups, W_proj by rows. Outer loop j: the slices of rank j are broadcast (the next
  group's broadcast overlaps this group's compute), Q, K, V of head group j are computed for the
  local tokens, the inner loop (Algorithm 3) is ring attention over the group: K, V circulate,
  (out, lse) merge by online softmax; O_i += A_ij W_proj_j. The forward keeps only X_i and the
  attention output A_i with its LSE (Table 2: 2 b s h / p). Backward (Algorithms 4, 6): the
  slices are broadcast again, Q, K, V recomputed, the inner backward circulates K, V with their
  dK, dV accumulators (p - 1 hops each, owner's term kept local as in Algorithm 2), dX_i
  accumulates, and the weight gradients of group j are reduced to rank j.

Both are exact in forward and backward (X and weight gradients) against a single-device layer;
causal masks come from the global token indices as in ring attention.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from sp_plan.planner.errors import PlanError
from sp_plan.planner.layout import check_token_layout

from . import register
from ..kernels import block_attention_backward, lse_dtype
from .ring import Ring, TrailingSum, make_ring, p2p, ring_attention, ring_forward, round_masks, wait_all

_TAG_W, _TAG_DW, _TAG_KV, _TAG_DKV = 200, 210, 220, 230


def _prev(ring: Ring) -> int:
    return ring.ranks[(ring.position - 1) % ring.size]


def _next(ring: Ring) -> int:
    return ring.ranks[(ring.position + 1) % ring.size]


# ---------------------------------------------------------------- Algorithms 1-2: O = f(AB)C

ACTIVATIONS = {"gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "relu": F.relu, "silu": F.silu}


class _METPFunction(torch.autograd.Function):
    """METP forward (Algorithm 1) and backward (Algorithm 2) of O_i = sum_r f(A_i B_r) C_r."""

    @staticmethod
    def forward(ctx, a, b, c, ring, f):
        A = a.reshape(-1, a.shape[-1])
        out = A.new_zeros(A.shape[0], c.shape[1])
        cur, bufs = (b, c), [None, None]
        p = ring.size
        for j in range(p):
            reqs = []
            if j < p - 1:  # double buffering: the next pair is in flight while this one computes
                nxt = bufs[j % 2] = bufs[j % 2] or (torch.empty_like(b), torch.empty_like(c))
                reqs = p2p(ring.group, [(cur[0], _prev(ring), _TAG_W), (cur[1], _prev(ring), _TAG_W + 1)],
                            [(nxt[0], _next(ring), _TAG_W), (nxt[1], _next(ring), _TAG_W + 1)])
            out += f(A @ cur[0]) @ cur[1]  # T_ij = A_i B, D_ij = f(T_ij), O_i += D_ij C
            wait_all(reqs)
            if j < p - 1:
                cur = nxt
        ctx.save_for_backward(a, b, c)
        ctx.ring, ctx.f = ring, f
        return out.view(*a.shape[:-1], c.shape[1])

    @staticmethod
    def backward(ctx, dout):
        a, b, c = ctx.saved_tensors
        ring, f, p = ctx.ring, ctx.f, ctx.ring.size
        A = a.reshape(-1, a.shape[-1])
        dO = dout.reshape(-1, dout.shape[-1])
        dA = torch.zeros_like(A)
        cur, bufs = (b, c), [None, None]
        own = None
        dw = TrailingSum(ring, _TAG_DW, (b, c), hops=-1)  # to the previous rank, the way the slices travel
        for j in range(p):
            reqs = []
            if j < p - 1:
                nxt = bufs[j % 2] = bufs[j % 2] or (torch.empty_like(b), torch.empty_like(c))
                reqs = p2p(ring.group, [(cur[0], _prev(ring), _TAG_W), (cur[1], _prev(ring), _TAG_W + 1)],
                            [(nxt[0], _next(ring), _TAG_W), (nxt[1], _next(ring), _TAG_W + 1)])
            with torch.enable_grad():  # recompute T_ij, D_ij = f(T_ij) (the forward evicted them)
                T = (A @ cur[0]).detach().requires_grad_()
                D = f(T)
            dD = dO @ cur[1].T
            dC = D.detach().T @ dO
            (dT,) = torch.autograd.grad(D, T, dD)
            dA += dT @ cur[0].T
            dB = A.T @ dT
            if j == 0:
                own = (dB, dC)  # the owner's term stays here; the accumulator starts at step 1
            else:  # Algorithm 2 lines 12-13: the accumulator follows its slice, one step behind
                dw.pass_on((dB, dC))
            wait_all(reqs)
            if j < p - 1:
                cur = nxt
        dw.home(own)  # the last holder sent this rank's own slices' gradients home
        dB, dC = own
        return dA.view_as(a), dB, dC, None, None


def metp(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, group=None, *, ranks=None, f=F.gelu) -> torch.Tensor:
    """O_i = f(A_i B) C over the group (seeds/002 Eq. 1, Algorithms 1-2); b, c are this rank's B_(:,i), C_(i,:)."""
    return _METPFunction.apply(a, b, c, make_ring(group, ranks), f)


def _position(group, ranks) -> tuple[int, int]:
    ring = make_ring(group, ranks)
    return ring.position, ring.size


class METPFeedForward(nn.Module):
    """METP FFN Z = f(X W_in) W_out (seeds/002 Eq. 2, Algorithms 1-2): this rank's W_in columns and W_out rows."""

    def __init__(self, hidden: int, ffn_hidden: int, group=None, *, ranks=None, activation: str = "gelu",
                 dtype=None, device=None):
        super().__init__()
        pos, p = _position(group, ranks)
        if ffn_hidden % p:
            raise PlanError("degrees.tp", f"tp {p} does not divide the FFN width {ffn_hidden}",
                            "choose a tp degree that divides ffn_hidden")
        if activation not in ACTIVATIONS:
            raise PlanError("activation", f"unknown activation {activation!r}", f"use one of {sorted(ACTIVATIONS)}")
        self.group, self.ranks, self.position, self.size = group, ranks, pos, p
        self.activation = activation
        kw = {"dtype": dtype, "device": device}
        self.w_in = nn.Parameter(torch.empty(hidden, ffn_hidden // p, **kw))
        self.w_out = nn.Parameter(torch.empty(ffn_hidden // p, hidden, **kw))
        nn.init.normal_(self.w_in, std=hidden ** -0.5)
        nn.init.normal_(self.w_out, std=ffn_hidden ** -0.5)

    @classmethod
    def from_full(cls, w_in: torch.Tensor, w_out: torch.Tensor, group=None, *, ranks=None,
                  activation: str = "gelu") -> "METPFeedForward":
        """This rank's shard of full weights W_in (h x f) and W_out (f x h)."""
        mod = cls(w_in.shape[0], w_in.shape[1], group, ranks=ranks, activation=activation, dtype=w_in.dtype,
                  device=w_in.device)
        mod.load_full(w_in, w_out)
        return mod

    @torch.no_grad()
    def load_full(self, w_in: torch.Tensor, w_out: torch.Tensor) -> None:
        k = self.w_in.shape[1]
        cols = slice(self.position * k, (self.position + 1) * k)
        self.w_in.copy_(w_in[:, cols])
        self.w_out.copy_(w_out[cols])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, local tokens, hidden) -> (batch, local tokens, hidden)."""
        return _METPFunction.apply(x, self.w_in, self.w_out, make_ring(self.group, self.ranks),
                                   ACTIVATIONS[self.activation])


# ---------------------------------------------------------------- Algorithms 3-6: two-level METP MHA

def metp_attention_backward(dout, q, k, v, out, lse, ring: Ring, masks, scale):
    """METP Attention backward (Algorithm 4): K, V circulate, dK, dV follow one step behind (p - 1 hops home)."""
    acc = lse_dtype(q.dtype)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dk_own = torch.zeros(k.shape, dtype=acc, device=k.device)
    dv_own = torch.zeros(v.shape, dtype=acc, device=v.device)
    cur_k, cur_v, bufs = k, v, [None, None]
    dkv = TrailingSum(ring, _TAG_DKV, (dk_own, dv_own))
    p = ring.size
    for r in range(p):
        reqs = []
        if r < p - 1:
            nxt = bufs[r % 2] = bufs[r % 2] or (torch.empty_like(k), torch.empty_like(v))
            reqs = ring.shift([cur_k, cur_v], list(nxt), _TAG_KV)
        dk_r, dv_r = (dk_own, dv_own) if r == 0 else (torch.zeros_like(dk_own), torch.zeros_like(dv_own))
        bm = masks[r]
        if bm is not None:
            rows, cols = slice(bm.row_start, bm.row_stop), slice(bm.col_start, bm.col_stop)
            gq, gk, gv = block_attention_backward(dout[:, rows], q[:, rows], cur_k[:, cols], cur_v[:, cols],
                                                  out[:, rows], lse[..., rows], scale=scale,
                                                  causal_offset=bm.causal_offset, mask=bm.mask)
            dq[:, rows] += gq
            dk_r[:, cols] += gk
            dv_r[:, cols] += gv
        if r >= 1:  # rank (position - r)'s accumulator: add the one received, pass it on
            dkv.pass_on((dk_r, dv_r))
        wait_all(reqs)
        if r < p - 1:
            cur_k, cur_v = nxt
    dkv.home((dk_own, dv_own))
    return dq.to(q.dtype), dk_own.to(k.dtype), dv_own.to(v.dtype)


def _broadcast(tensors: list, owned: bool, src: int, group, bufs) -> tuple[list, list]:
    """Algorithm 5 line 4: broadcast the slices of rank ``src`` (asynchronous; ``bufs`` are reused)."""
    out = [t.detach() for t in tensors] if owned else bufs
    return out, [dist.broadcast(t, src=src, group=group, async_op=True) for t in out]


def _group_weights(ring: Ring, w_qkv: torch.Tensor, w_proj: torch.Tensor):
    """Each head group j's (W_qkv_j, W_proj_j) in turn, broadcast by rank j, the next group's slices in flight
    while this group computes (Algorithm 5 line 4, Algorithm 6): yields (j, W_qkv_j, W_proj_j)."""
    pools = [[torch.empty_like(w_qkv), torch.empty_like(w_proj)] for _ in range(2)]
    cur, works = _broadcast([w_qkv, w_proj], ring.position == 0, ring.ranks[0], ring.group, pools[0])
    for j in range(ring.size):
        wait_all(works)
        wq, wp = cur
        if j < ring.size - 1:
            cur, works = _broadcast([w_qkv, w_proj], ring.position == j + 1, ring.ranks[j + 1], ring.group,
                                    pools[(j + 1) % 2])
        yield j, wq, wp


def _split_qkv(qkv: torch.Tensor, hq: int, hk: int, d: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q (hq heads), K and V (hk heads each) of a head group from X W_qkv_j, as (batch, seq, heads, d) blocks."""
    b, n = qkv.shape[:2]
    q = qkv[..., :hq * d].reshape(b, n, hq, d).contiguous()
    k = qkv[..., hq * d:(hq + hk) * d].reshape(b, n, hk, d).contiguous()
    v = qkv[..., (hq + hk) * d:].reshape(b, n, hk, d).contiguous()
    return q, k, v


class _METPMHAFunction(torch.autograd.Function):
    """Two-level METP MHA: forward Algorithm 5 (inner: Algorithm 3), backward Algorithm 6 (inner: Algorithm 4)."""

    @staticmethod
    def forward(ctx, x, w_qkv, w_proj, ring, heads, kv_heads, causal, token_layout):
        p = ring.size
        b, n, h = x.shape
        d = w_proj.shape[0] * p // heads
        hq, hk = heads // p, kv_heads // p
        scale = 1.0 / math.sqrt(d)
        masks = round_masks(token_layout, p, n * p, ring.position, bool(causal))
        out = x.new_zeros(b, n, h)
        attn = x.new_empty(b, n, heads, d)  # A_i: saved for the backward (Table 2: 2 b s h / p with X_i)
        lse = torch.empty(b, heads, n, dtype=lse_dtype(x.dtype), device=x.device)
        for j, wq, wp in _group_weights(ring, w_qkv, w_proj):
            q, k, v = _split_qkv(x @ wq, hq, hk, d)  # Q_ij, K_ij, V_ij = X_i W_qkv_j
            a, l = ring_forward(q, k, v, ring, masks, scale)  # Algorithm 3
            heads_j = slice(j * hq, (j + 1) * hq)
            attn[:, :, heads_j] = a
            lse[:, heads_j] = l
            out += a.reshape(b, n, hq * d) @ wp  # O_i += A_ij W_proj_j
        ctx.save_for_backward(x, w_qkv, w_proj, attn, lse)
        ctx.ring, ctx.dims, ctx.masks, ctx.scale = ring, (heads, kv_heads, d), masks, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        x, w_qkv, w_proj, attn, lse = ctx.saved_tensors
        ring, (heads, kv_heads, d), masks, scale = ctx.ring, ctx.dims, ctx.masks, ctx.scale
        p = ring.size
        b, n, h = x.shape
        hq, hk = heads // p, kv_heads // p
        X = x.reshape(-1, h)
        dO = dout.reshape(-1, h)
        dx = torch.zeros_like(X)
        grads: list = []
        for j, wq, wp in _group_weights(ring, w_qkv, w_proj):
            heads_j = slice(j * hq, (j + 1) * hq)
            a = attn[:, :, heads_j].contiguous()
            d_wp = a.reshape(-1, hq * d).T @ dO  # dW_proj_j = A_ij^T dO_i
            q, k, v = _split_qkv(x @ wq, hq, hk, d)  # recompute (Algorithm 6 line 6)
            da = (dO @ wp.T).reshape(b, n, hq, d)  # dA_ij = dO_i W_proj_j^T
            dq, dk, dv = metp_attention_backward(da, q, k, v, a, lse[:, heads_j].contiguous(), ring, masks, scale)
            dqkv = torch.cat([dq.reshape(b * n, -1), dk.reshape(b * n, -1), dv.reshape(b * n, -1)], dim=1)
            dx += dqkv @ wq.T
            d_wq = X.T @ dqkv
            # Algorithm 6 line 11: reduce the group's weight gradients to rank j
            works_r = [dist.reduce(t, dst=ring.ranks[j], op=dist.ReduceOp.SUM, group=ring.group, async_op=True)
                       for t in (d_wq, d_wp)]
            grads.append((d_wq, d_wp, works_r))
        for _, _, w in grads:
            wait_all(w)
        d_wq, d_wp, _ = grads[ring.position]
        return dx.view_as(x), d_wq, d_wp, None, None, None, None, None


class METPAttention(nn.Module):
    """Two-level METP MHA (seeds/002 Sec. 4, Algorithms 3-6): W_qkv columns of head group i, W_proj rows.

    Full weights: W_qkv (h x (heads + 2 kv_heads) d) = [W_q | W_k | W_v], heads in order; W_proj
    (heads d x h). Head group i holds heads i*heads/p .. and KV heads i*kv_heads/p .. (GQA needs
    p | kv_heads).
    """

    def __init__(self, hidden: int, heads: int, group=None, *, kv_heads: int | None = None, ranks=None,
                 causal: bool = False, token_layout: str = "contiguous", dtype=None, device=None):
        super().__init__()
        pos, p = _position(group, ranks)
        kv_heads = kv_heads or heads
        if heads % p or kv_heads % p or heads % kv_heads:
            raise PlanError("degrees.tp", f"tp {p} must divide the {heads} heads and {kv_heads} KV heads",
                            "choose a tp degree that divides the query and the KV heads")
        check_token_layout(token_layout)
        self.group, self.ranks, self.position, self.size = group, ranks, pos, p
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.causal, self.token_layout = causal, token_layout
        d, kw = self.head_dim, {"dtype": dtype, "device": device}
        self.w_qkv = nn.Parameter(torch.empty(hidden, (heads + 2 * kv_heads) * d // p, **kw))
        self.w_proj = nn.Parameter(torch.empty(heads * d // p, hidden, **kw))
        nn.init.normal_(self.w_qkv, std=hidden ** -0.5)
        nn.init.normal_(self.w_proj, std=(heads * d) ** -0.5)

    @classmethod
    def from_full(cls, w_qkv: torch.Tensor, w_proj: torch.Tensor, heads: int, group=None, *,
                  kv_heads: int | None = None, ranks=None, causal: bool = False,
                  token_layout: str = "contiguous") -> "METPAttention":
        """This rank's shard of full W_qkv and W_proj (class docstring)."""
        mod = cls(w_qkv.shape[0], heads, group, kv_heads=kv_heads, ranks=ranks, causal=causal,
                  token_layout=token_layout, dtype=w_qkv.dtype, device=w_qkv.device)
        mod.load_full(w_qkv, w_proj)
        return mod

    def shard_columns(self, full_width: int | None = None) -> torch.Tensor:
        """Column indices of the full W_qkv this rank holds (Q, then K, then V of its head group)."""
        d, p, i = self.head_dim, self.size, self.position
        hq, hk = self.heads // p, self.kv_heads // p
        q0, k0, v0 = 0, self.heads * d, (self.heads + self.kv_heads) * d
        return torch.cat([torch.arange(q0 + i * hq * d, q0 + (i + 1) * hq * d),
                          torch.arange(k0 + i * hk * d, k0 + (i + 1) * hk * d),
                          torch.arange(v0 + i * hk * d, v0 + (i + 1) * hk * d)])

    def shard_rows(self) -> slice:
        """Rows of the full W_proj this rank holds."""
        w = self.heads * self.head_dim // self.size
        return slice(self.position * w, (self.position + 1) * w)

    @torch.no_grad()
    def load_full(self, w_qkv: torch.Tensor, w_proj: torch.Tensor) -> None:
        self.w_qkv.copy_(w_qkv[:, self.shard_columns()])
        self.w_proj.copy_(w_proj[self.shard_rows()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, local tokens in the token layout over the group, hidden) -> same shape."""
        return _METPMHAFunction.apply(x, self.w_qkv, self.w_proj, make_ring(self.group, self.ranks), self.heads,
                                      self.kv_heads, self.causal, self.token_layout)


def _registered_metp(q, k, v, *, groups, ranks, causal, token_layout, scale, backend=None):
    """q, k, v already projected and token-sharded over the tp group: the inner loop (Algorithms 3-4)."""
    group = groups.get("tp")
    if group is None:
        raise PlanError("algorithm", "METP replaces the whole attention layer (projections included); "
                        "runtime.attention gets no tp group",
                        "use sp_plan.runtime.variants.metp.METPAttention(hidden, heads, ctx.group('tp'), "
                        "ranks=ctx.ranks('tp')) and METPFeedForward on the plan's tp group")
    return ring_attention(q, k, v, group, causal=causal, token_layout=token_layout, scale=scale,
                          ranks=ranks.get("tp"), backend=backend)


register("metp", _registered_metp)
