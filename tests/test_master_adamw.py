"""The measured stack's mixed-precision AdamW: it steps as AdamW in fp32 would, and holds the 18 B a parameter
that the memory model prices (planner/memory.py)."""
from __future__ import annotations

import torch

from sp_plan.planner.memory import ADAM_B, GRAD_B, WEIGHT_B
from sp_plan.profiles.tune.memory import PeakMemory
from sp_plan.profiles.tune.precision import MasterAdamW, adamw


def _grads(n: int, steps: int):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(n, generator=g) for _ in range(steps)]


def test_master_adamw_steps_as_fp32_adamw_and_rounds_into_the_half_weights():
    w0 = torch.randn(4096, generator=torch.Generator().manual_seed(1))
    ref = w0.clone().requires_grad_()
    half = w0.to(torch.bfloat16).requires_grad_()
    ref_opt = torch.optim.AdamW([ref], lr=1e-2)
    opt = MasterAdamW([half], lr=1e-2)
    ref.data.copy_(half.detach().float())  # the master starts from the half weights
    for g in _grads(4096, 5):
        ref.grad, half.grad = g.clone(), g.to(torch.bfloat16)
        ref_opt.step()
        opt.step()
    master = opt._pairs[0][1]
    # the bf16 gradient is the only rounding: the fp32 master follows fp32 AdamW to its step size's share
    assert torch.allclose(master, ref.detach(), atol=1e-4), float((master - ref).abs().max())
    assert torch.equal(half.detach(), master.to(torch.bfloat16))
    assert not torch.equal(half.detach(), w0.to(torch.bfloat16))  # it moved


def test_master_adamw_holds_the_memory_models_bytes_per_parameter():
    n = 1 << 16
    p = torch.zeros(n, dtype=torch.bfloat16, requires_grad=True)
    opt = adamw([p], 1e-3, torch.bfloat16)
    assert isinstance(opt, MasterAdamW)
    p.grad = torch.ones_like(p)
    opt.step()
    p.grad = None  # as train_step's zero_grad(set_to_none=True): the peak comes before the next backward's grads
    tracker = PeakMemory()
    tracker.track(p, opt)  # as tune's memory reading tracks a stack's optimizer
    assert (WEIGHT_B + GRAD_B + ADAM_B) * n <= tracker.live <= (WEIGHT_B + GRAD_B + ADAM_B) * n + 64  # + step count


def test_float32_weights_step_on_plain_adamw():
    p = torch.zeros(8, requires_grad=True)
    assert type(adamw([p], 1e-3, torch.float32)) is torch.optim.AdamW
