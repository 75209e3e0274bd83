"""Mixed-precision AdamW for the measured layer stack, holding what the memory model prices (planner/memory.py).

The model's half-precision weights compute (2 B a parameter); the optimizer keeps an fp32 master copy (4 B), an
fp32 gradient it steps on (4 B, Megatron's ``main_grad``, kept between steps) and fp32 moments (8 B): 18 B a
parameter, as Megatron's mixed-precision optimizer and the memory model count them. A stack in float32 steps
on plain AdamW (its weights are their own master copy).
"""
from __future__ import annotations

import torch

HALF = (torch.float16, torch.bfloat16)


class MasterAdamW(torch.optim.Optimizer):
    """AdamW on fp32 master copies of half-precision parameters (module docstring); ``step`` writes the updated
    masters back into the parameters. Built as ``MasterAdamW(params, lr=...)``, like AdamW, so that
    ``ZeroRedundancyOptimizer`` can build it over its shard."""

    def __init__(self, params, lr: float = 1e-3, **kw):
        super().__init__(params, dict(lr=lr, **kw))
        self._pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._inner: torch.optim.AdamW | None = None

    def _masters(self) -> torch.optim.AdamW:
        """The fp32 masters (each with its persistent fp32 gradient) and the AdamW over them, made on first use."""
        if self._inner is None:
            for group in self.param_groups:
                for p in group["params"]:
                    master = p.detach().float().clone()
                    master.grad = torch.zeros_like(master)
                    self._pairs.append((p, master))
            kw = {k: v for k, v in self.defaults.items() if k != "foreach"}
            self._inner = torch.optim.AdamW([m for _, m in self._pairs], foreach=False, **kw)
        return self._inner

    @torch.no_grad()
    def step(self, closure=None):
        """Half gradients into the fp32 ones, AdamW on the masters, masters back into the half weights."""
        inner = self._masters()
        inner.param_groups[0]["lr"] = self.param_groups[0]["lr"]
        for p, master in self._pairs:
            if p.grad is None:
                master.grad.zero_()
            else:
                master.grad.copy_(p.grad)
        inner.step()
        for p, master in self._pairs:
            p.copy_(master)
            # the state by parameter, as AdamW's is, so that what reads an optimizer's state (the CPU memory
            # tracker, a state dict) finds the masters, their gradients and moments
            self.state[p] = {"master": master, "main_grad": master.grad, **inner.state[master]}
        return None


def adamw(params, lr: float, dtype: torch.dtype) -> torch.optim.Optimizer:
    """The stack's optimizer: ``MasterAdamW`` for half-precision weights, else AdamW."""
    return MasterAdamW(params, lr=lr) if dtype in HALF else torch.optim.AdamW(params, lr=lr)


def adamw_class(dtype: torch.dtype) -> type:
    """The optimizer class ``adamw`` builds, for ``ZeroRedundancyOptimizer(optimizer_class=...)``."""
    return MasterAdamW if dtype in HALF else torch.optim.AdamW
