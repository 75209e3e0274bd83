"""Layouts read head to head: every plan's whole stack built at once, their training steps taken in turn.

A candidate's reading (candidate.py) is a few layers' steps, scaled to the model's layers; readings of two
layouts taken a minute apart differ by whatever else the hosts did in between (on 8 CPU ranks sharing two cores,
by 32-74 % for one layout). Here each plan's stack is built at its full stage depth (no scaling) and the steps
alternate, one of each plan a round (the order reversed every other round), so that a slow spell of the hosts
lands on a round, not on one plan. A round's steps divided by the round's median step are the plans' paired
readings; a plan's head-to-head time is the median of them (``relative``), the round's speed cancelled.
A pipeline (pp > 1) is composed from one stage as candidate.py composes it, round by round: its stage (model
layers / pp blocks) steps on one micro-batch (``candidate.bench_step``: its gradients' sync read apart), one
stage-boundary round trip is timed beside it, and the step is (m + p - 1) x (forward + backward + sends) + sync +
optimizer (``candidate.composed_step``).
"""
from __future__ import annotations

import statistics

import torch
import torch.distributed as dist

from sp_plan.planner.model import ModelSpec, Workload
from sp_plan.planner.plan import Plan
from sp_plan.runtime import init
from sp_plan.profiles.discover.probe import gather_objects

from .candidate import _device, bench_step, build_bench, composed_step, stage_depth, stage_round_trip
from .parallel import replica_mesh


def round_order(n: int, k: int) -> list[int]:
    """The plans' order in round ``k``: 0..n-1, reversed in odd rounds (each plan's mean position the same)."""
    return list(range(n)) if k % 2 == 0 else list(range(n - 1, -1, -1))


def head_to_head(plans: list[Plan], model: ModelSpec, work: Workload, *, rounds: int = 12, warmup: int = 2,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> list[list[float]]:
    """Step seconds of each plan (full stage depth, forward + backward + optimizer; pipelines composed) in each of
    ``rounds`` rounds, the max over ranks of each rank's step; the same on every rank. Every rank runs every plan."""
    for p in plans:
        p.check_world(dist.get_world_size())
    device = _device(device)
    benches, sends = [], []
    for p in plans:
        ctx = init(p, device_type=device.type)
        benches.append(build_bench(p, model, work, ctx, replica_mesh(p, device.type), stage_depth(model, p),
                                   device=device, dtype=dtype))
        sends.append(stage_round_trip(p, model, work, device=device, dtype=dtype) if p.degrees["pp"] > 1 else None)

    def step(i: int) -> float:
        b, p = benches[i], plans[i].degrees["pp"]
        fb, sync_s, opt = bench_step(b, model, device)
        return composed_step(b.micro_batches, p, fb, sends[i]() if sends[i] else 0.0, opt, sync_s)

    for i in range(len(plans)):
        for _ in range(warmup):
            step(i)
    mine = [[0.0] * rounds for _ in plans]
    for k in range(rounds):
        for i in round_order(len(plans), k):
            dist.barrier()
            mine[i][k] = step(i)
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
