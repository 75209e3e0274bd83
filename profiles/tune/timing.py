"""Timing of a callable on a device: CUDA events + synchronize on GPU, perf_counter on CPU; median of repeats."""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], device: torch.device, repeats: int = 5, warmup: int = 1) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs after ``warmup`` untimed runs."""
    return statistics.median(time_readings(fn, device, repeats, warmup))


def time_readings(fn: Callable[[], object], device: torch.device, repeats: int = 5, warmup: int = 1,
                  agree_within: float | None = None) -> list[float]:
    """Seconds of each of up to ``repeats`` runs of ``fn()`` after ``warmup`` untimed runs; with ``agree_within``,
    none after the first two successive readings that agree within that share of the faster (their median with
    any more readings would lie between them)."""
    for _ in range(warmup):
        fn()
    sync(device)
    times: list[float] = []
    for _ in range(max(repeats, 1)):
        if device.type == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        if agree_within is not None and len(times) >= 2 and \
                abs(times[-1] - times[-2]) <= agree_within * min(times[-2:]):
            break
    return times


def time_window(fn: Callable[[], object], device: torch.device, start: float, stop: float) -> float:
    """Mean seconds per call of ``fn()`` called back to back from wall time ``start`` (``time.time()``) until the
    call that passes ``stop``: ranks given one window run their calls at the same time whenever each started, so
    the mean is the per-call time while all of them compute (a median of a few calls each after a barrier is
    not: ranks leave a barrier at different moments and short calls need not overlap)."""
    while (wait := start - time.time()) > 0:
        time.sleep(min(wait, 0.01))
    calls = 0
    t0 = time.perf_counter()
    while True:
        fn()
        sync(device)
        calls += 1
        if time.time() >= stop:
            break
    return (time.perf_counter() - t0) / calls
