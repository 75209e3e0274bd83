"""A real Transformer layer stack from a ModelSpec, its attention through the plan's ``ctx.attention``.

Pre-norm blocks (LLaMA): RMSNorm -> Q, K, V projections -> attention -> output projection ->
residual; RMSNorm -> MLP (SwiGLU when ``gated_mlp``, else GELU) -> residual. No positional
encoding: the causal mask comes from the global token indices of the plan's token layout, so a
sharded run equals a single-device run. The attention is a callable ``attend(q, k, v)`` on
(batch, local tokens, local heads, head dim), e.g. ``ctx.attention``; head counts are read off the
projections' (possibly tensor-parallel) outputs.

Checkpointing (Plan.checkpointing): ``full`` recomputes the whole block in backward;
``attention_boundary`` keeps the attention output and recomputes everything else (the projections
before it, the output projection and MLP after it).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from sp_plan.planner.model import ModelSpec

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class SelfAttention(nn.Module):
    """Q, K, V and output projections around ``attend`` (GQA: fewer K/V heads)."""

    def __init__(self, model: ModelSpec, **kw):
        super().__init__()
        self.head_dim = model.head_dim
        self.q = nn.Linear(model.hidden, model.q_dim, bias=False, **kw)
        self.k = nn.Linear(model.hidden, model.kv_dim, bias=False, **kw)
        self.v = nn.Linear(model.hidden, model.kv_dim, bias=False, **kw)
        self.o = nn.Linear(model.q_dim, model.hidden, bias=False, **kw)

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, n, d = x.shape[0], x.shape[1], self.head_dim
        return (self.q(x).view(b, n, -1, d), self.k(x).view(b, n, -1, d), self.v(x).view(b, n, -1, d))

    def out(self, a: torch.Tensor) -> torch.Tensor:
        return self.o(a.flatten(2))


class MLP(nn.Module):
    """SwiGLU (down(silu(gate x) * up x)) for gated models, else down(gelu(up x))."""

    def __init__(self, model: ModelSpec, **kw):
        super().__init__()
        self.gated = model.gated_mlp
        self.up = nn.Linear(model.hidden, model.ffn_hidden, bias=False, **kw)
        self.gate = nn.Linear(model.hidden, model.ffn_hidden, bias=False, **kw) if self.gated else None
        self.down = nn.Linear(model.ffn_hidden, model.hidden, bias=False, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.gate(x)) * self.up(x) if self.gated else F.gelu(self.up(x))
        return self.down(h)


def gather_sequence(h: torch.Tensor) -> torch.Tensor:
    """A norm's output under TP sequence parallelism (a DTensor sharded on the tokens) all-gathered for the
    column-parallel projections (its backward reduce-scatters); a plain tensor as is."""
    from torch.distributed.tensor import DTensor, Replicate

    return h.redistribute(h.device_mesh, [Replicate()]) if isinstance(h, DTensor) else h


class Block(nn.Module):
    """One pre-norm Transformer block; ``attend`` is given per call (no state about the world)."""

    def __init__(self, model: ModelSpec, checkpointing: str = "none", **kw):
        super().__init__()
        self.checkpointing = checkpointing
        self.norm1 = nn.RMSNorm(model.hidden, **kw)
        self.attn = SelfAttention(model, **kw)
        self.norm2 = nn.RMSNorm(model.hidden, **kw)
        self.mlp = MLP(model, **kw)

    def _qkv(self, x):
        return self.attn.qkv(gather_sequence(self.norm1(x)))

    def _post(self, x, a):
        h = x + self.attn.out(a)
        return h + self.mlp(gather_sequence(self.norm2(h)))

    def _body(self, x, attend):
        return self._post(x, attend(*self._qkv(x)))

    def forward(self, x: torch.Tensor, attend: Attend) -> torch.Tensor:
        if self.checkpointing == "full":
            return checkpoint(self._body, x, attend, use_reentrant=False)
        if self.checkpointing == "attention_boundary":
            q, k, v = checkpoint(self._qkv, x, use_reentrant=False)
            return checkpoint(self._post, x, attend(q, k, v), use_reentrant=False)
        return self._body(x, attend)


class Stack(nn.Module):
    """Token embedding, ``layers`` blocks, final norm and LM head (no embedding/head when vocab is 0)."""

    def __init__(self, model: ModelSpec, layers: int, checkpointing: str = "none", **kw):
        super().__init__()
        self.model = model
        self.embed = nn.Embedding(model.vocab, model.hidden, **kw) if model.vocab else None
        self.blocks = nn.ModuleList([Block(model, checkpointing, **kw) for _ in range(layers)])
        self.norm = nn.RMSNorm(model.hidden, **kw)
        self.head = nn.Linear(model.hidden, model.vocab, bias=False, **kw) if model.vocab else None

    def hidden_states(self, inputs: torch.Tensor, attend: Attend) -> torch.Tensor:
        """Token ids (batch, tokens) or embeddings (batch, tokens, hidden) -> final normed hidden states."""
        x = self.embed(inputs) if self.embed is not None else inputs
        for blk in self.blocks:
            x = blk(x, attend)
        return self.norm(x)

    def forward(self, inputs: torch.Tensor, attend: Attend) -> torch.Tensor:
        """Logits (or hidden states without a head) of this rank's tokens."""
        h = self.hidden_states(inputs, attend)
        return self.head(h) if self.head is not None else h



def build_stack(model: ModelSpec, layers: int, checkpointing: str = "none", *, seed: int = 0,
                device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> Stack:
    """A Stack with weights drawn from ``seed`` (the same on every rank and in a single-process reference)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        stack = Stack(model, layers, checkpointing, dtype=dtype)
    return stack.to(device)


def random_batch(model: ModelSpec, batch: int, seq_len: int, seed: int, *, device="cpu",
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-sequence inputs and targets from ``seed``: token ids (or embeddings when vocab is 0)."""
    g = torch.Generator().manual_seed(seed)
    if model.vocab:
        x = torch.randint(model.vocab, (batch, seq_len), generator=g)
        y = torch.randint(model.vocab, (batch, seq_len), generator=g)
    else:
        x = torch.randn(batch, seq_len, model.hidden, generator=g).to(dtype)
        y = torch.zeros(batch, seq_len, dtype=torch.long)
    return x.to(device), y.to(device)


def token_loss(out: torch.Tensor, targets: torch.Tensor, model: ModelSpec) -> torch.Tensor:
    """Mean cross entropy of this rank's logits (mean square of the hidden states when vocab is 0)."""
    if not model.vocab:
        return out.float().pow(2).mean()
    return F.cross_entropy(out.flatten(0, 1).float(), targets.flatten())
