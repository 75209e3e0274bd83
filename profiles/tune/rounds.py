"""Tune's round probe: the fixed cost of a ring round (``Params.round_overhead_s``), measured, not fitted.

A ring round costs its block's FLOPs, its messages' bytes and a fixed part besides: launching the block, the
out/LSE merge, posting and waiting for the K, V messages (seeds/003 Sec. 3).
The probe runs the bundled Ring attention (runtime/variants/ring.py) over the whole world, zigzag, causal,
forward and backward, at ``TOKENS_PER_RANK`` tokens a rank, where the blocks cost next to nothing and the rounds'
fixed part is what is left; the overhead is the one at which the model prices the same probe at the
measurement. Fitting it to a handful of candidates instead let it trade against compute efficiency: on 8 ranks
sharing 2 cores the fit put 3.6-4.0 ms on each call, where the probe reads 2-3 ms, and ranked layouts of many
rounds last.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from sp_plan.planner.cluster import Cluster
from sp_plan.planner.engine import LinkEngine
from sp_plan.planner.errors import PlanError
from sp_plan.planner.estimate import Estimator
from sp_plan.planner.model import ModelSpec, Workload
from sp_plan.planner.params import MAX_OVERHEAD_S, Params
from sp_plan.planner.plan import Plan

#: tokens a rank holds in the probe (zigzag: two chunks of half as many)
TOKENS_PER_RANK = 32
#: attention layers (forward + backward) one timed run goes through
LAYERS = 8


def probe_plan(world: int) -> Plan:
    """The probe's layout: Ring over every rank of the world, zigzag (every rank computes in every round)."""
    return Plan(algorithm="ring", degrees={"ring": world}, token_layout="zigzag")


def time_rounds(model: ModelSpec, device: torch.device, dtype: torch.dtype, iters: int = 5, warmup: int = 2) -> float:
    """Seconds of ``LAYERS`` Ring attention forwards + backwards over the default group (collective): per run the
    slowest rank's wall time between barriers, the median of ``iters`` runs after ``warmup``."""
    from sp_plan.runtime.variants.ring import ring_attention

    n = TOKENS_PER_RANK
    gen = torch.Generator(device="cpu").manual_seed(dist.get_rank())
    rnd = lambda h: torch.randn(1, n, h, model.head_dim, generator=gen).to(device=device, dtype=dtype)  # noqa: E731
    q, k, v = rnd(model.heads), rnd(model.kv_heads), rnd(model.kv_heads)
    for t in (q, k, v):
        t.requires_grad_(True)
    times = []
    for _ in range(warmup + iters):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(LAYERS):
            ring_attention(q, k, v, causal=True, token_layout="zigzag").sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        slowest = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        times.append(float(slowest[0]))
    return statistics.median(times[warmup:])


def round_overhead(cluster: Cluster, model: ModelSpec, base: Params, seconds: float) -> float | None:
    """``Params.round_overhead_s`` from the probe's measured ``seconds``: the overhead at which the model prices the
    probe (``LAYERS`` layers) at the measurement, found by bisection (the price never falls as the overhead grows;
    it is linear in it but where a round's messages outlast its compute and hide part of it), at least 0; None where
    the model cannot price the probe on this cluster (one rank, or a layout it refuses)."""
    world = cluster.world_size
    if world < 2 or seconds <= 0:
        return None
    work = Workload(seq_len=TOKENS_PER_RANK * world, causal=True, training=True)
    one = model.model_copy(update={"layers": 1})
    plan = probe_plan(world)
    target = seconds / LAYERS
    engine = LinkEngine(cluster)  # link costs do not depend on params: one for every price

    def price(ro: float) -> float:
        est = Estimator(cluster, one, work, engine, params=base.model_copy(update={"round_overhead_s": ro}))
        return est.attention_time(plan, backward=True)[0]

    try:
        if price(0.0) >= target:
            return 0.0
        lo, hi = 0.0, 1e-3
        while price(hi) < target:
            if hi >= MAX_OVERHEAD_S:  # more than a profile may hold (ten seconds a call): not a round's fixed cost
                return None
            lo, hi = hi, min(hi * 2, MAX_OVERHEAD_S)
    except PlanError:
        return None
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if price(mid) < target else (lo, mid)
    return (lo + hi) / 2
