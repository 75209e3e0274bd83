"""METP blocks (runtime/variants/metp.py modules) for tune's stack: tokens and weights split over the tp group.

Each block: x + METPAttention(RMSNorm(x)) (two-level METP MHA, Algorithms 3-6), then
x + METPFeedForward(RMSNorm(x)) with SiLU (Algorithms 1-2: f(X W_in) W_out; METP has no gated
form, so a gated model's MLP runs with two matrices, not three). Tokens follow the METP layout
(``planner.layout.ring_tokens`` over the tp group, ring position = index in the tp rank list).
Gradients: METP's weight shards are all-reduced over dp, replicated weights (norms, embedding,
head) over dp x tp (their gradients come from each rank's own tokens).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from sp_plan.planner.errors import PlanError
from sp_plan.planner.layout import ring_tokens
from sp_plan.planner.model import ModelSpec
from sp_plan.planner.plan import Plan
from sp_plan.runtime.variants.metp import METPAttention, METPFeedForward

from .parallel import Parallel, _manual_sync
from .precision import adamw
from .stack import Stack


class METPBlock(nn.Module):
    """Pre-norm block of METP attention and FFN on this rank's tokens; ``attend`` is not used."""

    def __init__(self, model: ModelSpec, group, ranks: list[int], causal: bool, token_layout: str,
                 checkpointing: str = "none", **kw):
        super().__init__()
        if model.head_dim * model.heads != model.hidden:
            raise PlanError("model.head_dim", "runtime METPAttention needs head_dim = hidden / heads",
                            "use a model without an explicit head_dim for metp")
        self.checkpointing = checkpointing
        self.norm1 = nn.RMSNorm(model.hidden, **kw)
        self.attn = METPAttention(model.hidden, model.heads, group, kv_heads=model.kv_heads, ranks=ranks,
                                  causal=causal, token_layout=token_layout, **kw)
        self.norm2 = nn.RMSNorm(model.hidden, **kw)
        self.mlp = METPFeedForward(model.hidden, model.ffn_hidden, group, ranks=ranks, activation="silu", **kw)

    def _body(self, x):
        h = x + self.attn(self.norm1(x))
        return h + self.mlp(self.norm2(h))

    def forward(self, x: torch.Tensor, attend=None) -> torch.Tensor:
        if self.checkpointing == "full":
            return torch.utils.checkpoint.checkpoint(self._body, x, use_reentrant=False)
        return self._body(x)  # attention_boundary: METP keeps only X and A already (Table 2)


def metp_tokens(plan: Plan, tp_ranks: list[int], rank: int, seq_len: int) -> torch.Tensor:
    """Global token indices of this rank (ring position = its index in the tp group's rank list)."""
    return torch.from_numpy(ring_tokens(plan.token_layout, len(tp_ranks), seq_len)[tp_ranks.index(rank)].copy())


def build_metp(model: ModelSpec, layers: int, plan: Plan, ctx, causal: bool, *, seed: int, device,
               dtype, lr: float = 1e-4) -> Parallel:
    """A Stack of METP blocks with its optimizer and gradient sync (module docstring)."""
    if plan.sp != 1:
        raise PlanError("degrees", "metp splits tokens over its tp group alone", "set ulysses and ring to 1")
    group, ranks = ctx.group("tp"), ctx.ranks("tp")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        stack = Stack(model, 0, dtype=dtype)
        stack.blocks = nn.ModuleList([METPBlock(model, group, ranks, causal, plan.token_layout, plan.checkpointing,
                                                dtype=dtype) for _ in range(layers)])
    stack = stack.to(device)
    layout, rank = plan.layout(), dist.get_rank()
    sharded = [p for b in stack.blocks for p in (*b.attn.parameters(), *b.mlp.parameters())]
    ids = {id(p) for p in sharded}
    replicated = [p for p in stack.parameters() if id(p) not in ids]
    syncs = []
    dp_ranks = layout.group_of("dp", rank)
    dp_tp_ranks = layout.group_of(("tp", "dp"), rank)
    for members, params in ((dp_ranks, sharded), (dp_tp_ranks, replicated)):
        g = None  # every rank creates every group of the kind, in the same order
        for grp in layout.groups(("dp",) if members is dp_ranks else ("tp", "dp")):
            pg = dist.new_group(sorted(grp)) if len(grp) > 1 else None
            if rank in grp:
                g = pg
        if g is not None:
            syncs.append(_manual_sync(params, g))
    notes = {"metp": "runtime.variants.metp METPAttention + METPFeedForward (SiLU, two matrices); tokens by ring_tokens "
                     "over tp; gradients all-reduced by hand (METP shards over dp, replicated weights over dp x tp)"}
    if plan.zero_stage:
        notes["zero"] = f"zero{plan.zero_stage}: FALLBACK not applied to METP (its weights are already split over tp)"
    if plan.checkpointing == "attention_boundary":
        notes["checkpointing"] = "attention_boundary: METP already keeps only X and the attention output"
    return Parallel(stack, adamw(stack.parameters(), lr, dtype), lambda: [s() for s in syncs], notes)
