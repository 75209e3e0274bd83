"""TP, ZeRO and gradient synchronization of a Stack for a plan, with every fallback said out loud.

Mesh: one DeviceMesh ("pp", "dp_sp", "tp") over the world, "dp_sp" = the ranks that hold the same
weights (dp x ulysses x ring: same tp and pp coordinates). TP: Megatron's TP with sequence parallelism
(what the planner prices, schedules.linear_steps: an all-gather before attention and MLP, a
reduce-scatter after) through torch's tensor-parallel API on "tp": SequenceParallel norms on this rank's
1/tp of the tokens, the sequence all-gathered into ColwiseParallel Q, K, V and the MLP's up/gate,
RowwiseParallel O and down reduce-scattered back to the tokens' shards (``Parallel.shard_tokens``); the
embedding, final norm and head run on the rank's 1/tp of the tokens. A sequence rank's unequal token count (packed
documents) is padded to a multiple of tp (``tokens_of``), and its attention trims the padding (``sequence_attend``).
ZeRO over "dp_sp": stage 2/3 FSDP2 ``fully_shard`` per block and at the root (reshard_after_forward
False/True); stage 1 DDP with ``ZeroRedundancyOptimizer`` (AdamW state sharded); stage 0 DDP.
Where one of these does not apply (TP with DDP), gradients are all-reduced by hand and ``notes``
says so.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from sp_plan.planner.errors import PlanError
from sp_plan.planner.plan import Plan
from sp_plan.planner.schedules import DDP_BUCKET_BYTES
from sp_plan.runtime.variants.ring import pad_tokens

from .precision import adamw, adamw_class

REPLICA_DIMS = ("dp", "ulysses", "ring")


def replica_mesh(plan: Plan, device_type: str) -> DeviceMesh:
    """DeviceMesh (pp, dp_sp, tp) of the world: [p][i][j] = rank at pp p, tp j, i-th of its dp x sp group."""
    layout, d = plan.layout(), plan.degrees
    dp_sp = d["dp"] * d["ulysses"] * d["ring"]
    grid = torch.empty(d["pp"], dp_sp, d["tp"], dtype=torch.long)
    for r in range(plan.world_size):
        c = layout.coords(r)
        i = layout.group_of(REPLICA_DIMS, r).index(r)
        grid[c.get("pp", 0), i, c.get("tp", 0)] = r
    return DeviceMesh(device_type, grid, mesh_dim_names=("pp", "dp_sp", "tp"))


def tp_plan(gated: bool) -> dict:
    """Megatron's split of a block with sequence parallelism (Korthikanti et al. 2022, Fig. 5): the norms on
    sequence shards, column-parallel into attention and MLP (the block gathers the sequence first:
    stack.gather_sequence), row-parallel out of them reduce-scattered onto the sequence shards."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    p = {"norm1": SequenceParallel(), "norm2": SequenceParallel(),
         "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
         "attn.o": RowwiseParallel(output_layouts=Shard(1)), "mlp.up": ColwiseParallel(),
         "mlp.down": RowwiseParallel(output_layouts=Shard(1))}
    if gated:
        p["mlp.gate"] = ColwiseParallel()
    return p


#: the target id cross entropy ignores (torch's default ``ignore_index``): the label of a TP padding token
IGNORE = -100


def tokens_of(tp_rank: int, tp: int) -> Callable[..., torch.Tensor]:
    """This TP rank's contiguous 1/tp of a (batch, tokens, ...) tensor's tokens (identity for tp = 1). A sequence rank
    whose token count tp does not divide (packed documents give ranks unequal counts) is padded at its end with
    ``fill`` first, fewer than tp tokens, as Megatron pads packed sequences for sequence parallelism."""
    if tp == 1:
        return lambda t, fill=0: t

    def shard(t: torch.Tensor, fill=0) -> torch.Tensor:
        return pad_tokens(t, t.shape[1] + -t.shape[1] % tp, fill).chunk(tp, dim=1)[tp_rank].contiguous()
    return shard


def sequence_attend(attend: Callable, tokens: int) -> Callable:
    """``attend`` on a sequence rank's ``tokens`` real tokens of q, k, v all-gathered over TP (``tokens_of``'s
    padding trimmed before, restored as zeros after: padding attends nothing and nothing attends it)."""
    def trimmed(q, k, v):
        if q.shape[1] == tokens:
            return attend(q, k, v)
        return pad_tokens(attend(q[:, :tokens], k[:, :tokens], v[:, :tokens]), q.shape[1])
    return trimmed


@dataclass
class Parallel:
    """The wrapped model, its optimizer, a post-backward gradient hook, and what was done (``notes``)."""

    module: nn.Module
    optimizer: torch.optim.Optimizer
    sync_grads: Callable[[], None]
    notes: dict = field(default_factory=dict)
    shard_tokens: Callable[..., torch.Tensor] = lambda t, fill=0: t  # a sequence rank's tokens -> this TP rank's


@contextmanager
def accumulate(module: nn.Module, sync: bool):
    """Gradient accumulation over micro-batches: DDP's no_sync / FSDP2's requires_gradient_sync unless ``sync``."""
    if hasattr(module, "set_requires_gradient_sync"):  # FSDP2
        module.set_requires_gradient_sync(sync)
        yield
    elif not sync and hasattr(module, "no_sync"):  # DDP
        with module.no_sync():
            yield
    else:
        yield


def _buckets(tensors: list[torch.Tensor], cap: float) -> list[list[torch.Tensor]]:
    """``tensors`` in order, cut into runs of at most ``cap`` bytes (a tensor larger than ``cap`` alone), by dtype."""
    out: list[list[torch.Tensor]] = []
    size = 0.0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if not out or size + nbytes > cap or out[-1][0].dtype != t.dtype:
            out.append([])
            size = 0.0
        out[-1].append(t)
        size += nbytes
    return out


def _bucketed_all_reduce(tensors: list[torch.Tensor], group):
    """Sum ``tensors`` over ``group`` in DDP's flat buckets (schedules.DDP_BUCKET_BYTES, in the order given): one
    collective per bucket; yields each bucket's tensors with their sums."""
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    for bucket in _buckets(tensors, DDP_BUCKET_BYTES):
        flat = _flatten_dense_tensors(bucket)
        dist.all_reduce(flat, group=group)
        yield from zip(bucket, _unflatten_dense_tensors(flat, bucket))


def _manual_sync(params: list[nn.Parameter], group) -> Callable[[], None]:
    """All-reduce (average) the local gradients of ``params`` over ``group`` after the backward, last parameters
    first as DDP fills its buckets (``_bucketed_all_reduce``): one collective per bucket as the model prices ZeRO-0's
    sync, not one per parameter; nothing on a group of one."""
    n = dist.get_world_size(group)

    def sync():
        if n == 1:
            return
        grads = [p.grad._local_tensor if hasattr(p.grad, "_local_tensor") else p.grad
                 for p in reversed(params) if p.grad is not None]
        for g, total in _bucketed_all_reduce(grads, group):
            g.copy_(total.div_(n))
    return sync


def _partial_sync(params: list[nn.Parameter], group) -> Callable[[], None]:
    """Sum the TP-partial gradients of ``params`` over the TP ``group`` once after the backward
    (``_bucketed_all_reduce``) and hand them back replicated: a parameter replicated on the TP mesh whose input is
    sharded on the tokens (the SequenceParallel norms' weights) gets a Partial(sum) gradient, which the optimizer
    would otherwise all-reduce anew in each op that reads it (Megatron-LM does the same sum for sequence-parallel
    norm weights: ``_allreduce_layernorm_grads``)."""
    from torch.distributed.tensor import DTensor, Replicate

    def sync():
        partial = [p for p in reversed(params)
                   if isinstance(p.grad, DTensor) and any(pl.is_partial() for pl in p.grad.placements)]
        grads = [p.grad for p in partial]
        for p, g, (_, total) in zip(partial, grads, _bucketed_all_reduce([g._local_tensor for g in grads], group)):
            p.grad = DTensor.from_local(total, g.device_mesh, [Replicate()] * g.device_mesh.ndim, run_check=False,
                                        shape=g.shape, stride=g.stride())
    return sync


def _then(*syncs: Callable[[], None]) -> Callable[[], None]:
    """The gradient hooks run in order."""
    def sync():
        for s in syncs:
            s()
    return sync


def parallelize(stack: nn.Module, plan: Plan, mesh: DeviceMesh, *, lr: float = 1e-4) -> Parallel:
    """Apply TP, ZeRO and gradient sync to ``stack`` as the plan says (module docstring)."""
    m = stack.model
    tp, stage = plan.degrees["tp"], plan.zero_stage
    dtype = next(stack.parameters()).dtype  # half weights step on fp32 masters (precision.MasterAdamW)
    notes: dict = {}
    if tp > 1:
        if why := m.tp_problem(tp):
            raise PlanError("degrees.tp", why, "pick a tp degree that divides them")
        from torch.distributed.tensor.parallel import parallelize_module

        for blk in stack.blocks:
            parallelize_module(blk, mesh["tp"], tp_plan(m.gated_mlp))
        notes["tp"] = ("torch.distributed.tensor.parallel, Megatron TP with sequence parallelism (SequenceParallel "
                       "norms; sequence all-gathered into Colwise Q,K,V,up,gate; Rowwise O,down reduce-scattered); "
                       "embedding, final norm and head replicated, run on this rank's 1/tp of the tokens")
    shard = tokens_of(mesh["tp"].get_local_rank(), tp)
    replicas = mesh["dp_sp"].size()
    group = mesh["dp_sp"].get_group()
    nothing = lambda: None  # noqa: E731
    tp_sum = _partial_sync(list(stack.parameters()), mesh["tp"].get_group()) if tp > 1 else nothing
    if tp > 1:
        notes["tp"] += "; the norms' partial weight gradients summed over tp once after the backward"
    if replicas == 1:
        notes["zero"] = f"zero{stage}: no data-parallel replicas, nothing to shard or sync"
        return Parallel(stack, adamw(stack.parameters(), lr, dtype), tp_sum, notes, shard)
    if stage >= 2:
        from torch.distributed.fsdp import fully_shard

        reshard = stage == 3
        for blk in stack.blocks:
            fully_shard(blk, mesh=mesh["dp_sp"], reshard_after_forward=reshard)
        fully_shard(stack, mesh=mesh["dp_sp"], reshard_after_forward=reshard)
        notes["zero"] = f"zero{stage}: FSDP2 fully_shard over dp x sp (reshard_after_forward={reshard})"
        return Parallel(stack, adamw(stack.parameters(), lr, dtype), nothing, notes, shard)
    if tp > 1:
        notes["zero"] = (f"zero{stage}: FALLBACK gradients all-reduced by hand over dp x sp after the backward, "
                         "in DDP-sized buckets (DDP does not take TP's DTensor parameters); optimizer state not "
                         "sharded")
        return Parallel(stack, adamw(stack.parameters(), lr, dtype),
                        _then(tp_sum, _manual_sync(list(stack.parameters()), group)), notes, shard)
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(stack, process_group=group)
    if stage == 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=adamw_class(dtype), process_group=group,
                                      lr=lr)
        notes["zero"] = "zero1: DDP over dp x sp + ZeroRedundancyOptimizer(AdamW)"
    else:
        opt = adamw(ddp.parameters(), lr, dtype)
        notes["zero"] = "zero0: DDP over dp x sp"
    return Parallel(ddp, opt, nothing, notes)
