"""Layouts read head to head: every plan's whole stack built at once, their training steps taken in turn.

A candidate's reading (candidate.py) is a few layers' steps, scaled to the model's layers; readings of two
layouts taken a minute apart differ by whatever else the hosts did in between (on 8 CPU ranks sharing two cores,
by 32-74 % for one layout). Here each plan's stack is built at its full stage depth (no scaling) and the steps
alternate, one of each plan a round (the order reversed every other round), so that a slow spell of the hosts
lands on a round, not on one plan. A round's steps divided by the round's median step are the plans' paired
readings; a plan's head-to-head time is the median of them (``relative``), the round's speed cancelled.
Pipelines (pp > 1) are composed from one stage by candidate.py and are not read here.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from sp_plan.planner.errors import PlanError
from sp_plan.planner.model import ModelSpec, Workload
from sp_plan.planner.plan import Plan
from sp_plan.runtime import init
from sp_plan.runtime.probe import gather_objects

from .candidate import _device, build_bench, train_step
from .parallel import replica_mesh


def round_order(n: int, k: int) -> list[int]:
    """The plans' order in round ``k``: 0..n-1, reversed in odd rounds (each plan's mean position the same)."""
    return list(range(n)) if k % 2 == 0 else list(range(n - 1, -1, -1))


def head_to_head(plans: list[Plan], model: ModelSpec, work: Workload, *, rounds: int = 12, warmup: int = 2,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> list[list[float]]:
    """Step seconds of each plan (full stage depth, forward + backward + optimizer) in each of ``rounds`` rounds,
    the max over ranks of each step; the same on every rank. Every rank of the world runs every plan."""
    for p in plans:
        if p.degrees["pp"] > 1:
            raise PlanError(p.summary(), "pp > 1 is composed from one stage, not read head to head",
                            "leave it out")
        p.check_world(dist.get_world_size())
    device = _device(device)
    benches = []
    for p in plans:
        ctx = init(p, device_type=device.type)
        benches.append(build_bench(p, model, work, ctx, replica_mesh(p, device.type), model.layers, device=device,
                                   dtype=dtype))
    for b in benches:
        for _ in range(warmup):
            train_step(b, model, device)
    mine = [[0.0] * rounds for _ in plans]
    for k in range(rounds):
        for i in round_order(len(plans), k):
            dist.barrier()
            t0 = time.perf_counter()
            train_step(benches[i], model, device)
            mine[i][k] = time.perf_counter() - t0
    everyone = gather_objects(mine)
    return [[max(r[i][k] for r in everyone) for k in range(rounds)] for i in range(len(plans))]


def relative(steps: list[list[float]]) -> list[list[float]]:
    """Each plan's step over its round's median step, round by round (``steps[plan][round]``, None where a plan
    was not read): the paired readings, the round's speed cancelled."""
    rounds = max(len(s) for s in steps)
    out = [[] for _ in steps]
    for k in range(rounds):
        here = [s[k] for s in steps if k < len(s) and s[k] is not None]
        if len(here) < 2:
            continue
        mid = statistics.median(here)
        for i, s in enumerate(steps):
            if k < len(s) and s[k] is not None:
                out[i].append(s[k] / mid)
    return out


def regret(times: dict[str, float], pick: str) -> float:
    """The regret of ``pick`` under head-to-head ``times``: its time over the fastest's, minus 1."""
    return times[pick] / min(times.values()) - 1
