"""Numbers that cannot be true are refused: NaN or infinite figures, negative times, FLOP/s above a device's
datasheet peak, bandwidth above a link's capacity (PlanError naming the figure; never used to rank)."""
from __future__ import annotations

import math
from typing import Any

from .errors import PlanError

#: measured / datasheet above this is not noise (boost clocks and timer jitter stay well inside 10%)
TOLERANCE = 1.10
#: an efficiency above this is untrue on any cluster, datasheet or not: a CPU cluster's peaks and capacities are
#: placeholders a CPU may beat (cpu-local: 50 GFLOP/s, 5 GB/s shared memory), but not a thousandfold (50 TFLOP/s
#: is beyond any CPU socket)
EFFICIENCY_CEILING = 1000.0
#: achieved device-memory bytes/s above this is untrue on any device: 200x the fastest memory in
#: profiles/kernels.yaml (the H200's 4.8 TB/s)
HBM_CEILING = 1e15
_TIME_KEYS = ("seconds", "time", "alpha_s")

#: the least efficiency a curve, a fit or a device may claim: a millionth of peak is slower than any device sp-plan
#: plans, and a floor keeps a typo (1e-300) from pricing steps past float range
MIN_EFFICIENCY = 1e-6


def is_time_key(key: str) -> bool:
    return key.endswith("_s") or key in _TIME_KEYS


def is_rate_key(key: str) -> bool:
    return key.endswith("busbw") or "capacity" in key or "bandwidth" in key


def check_finite(data: Any, field: str) -> None:
    """Every number in a free-form document (measurements, details) is finite; no time or bandwidth is negative."""
    if isinstance(data, dict):
        for k, v in data.items():
            check_finite(v, f"{field}.{k}")
            if isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0:
                if is_time_key(k):
                    raise PlanError(f"{field}.{k}", f"a negative time ({v})", "remove it or measure again")
                if is_rate_key(k):
                    raise PlanError(f"{field}.{k}", f"a negative bandwidth ({v})", "remove it or measure again")
    elif isinstance(data, (list, tuple)):
        for i, v in enumerate(data):
            check_finite(v, f"{field}[{i}]")
    elif isinstance(data, float) and not math.isfinite(data):
        raise PlanError(field, f"{data} is not a number sp-plan can use", "remove it or measure again")


def has_datasheet(cluster) -> bool:
    """True when the cluster's peaks and link capacities are datasheet figures (GPUs, NPUs), not the
    placeholders of CPU rank slots (a CPU may well beat cpu-local's nominal 50 GFLOP/s)."""
    return any(d.kind != "cpu" for t in cluster.node_types.values() for d in t.devices)


def _efficiencies(params):
    """(field under params, size or None, efficiency) of every efficiency in ``params``: the curves' points
    (achieved / peak FLOP/s) and the comm fits (measured / modelled bandwidth)."""
    from .params import CURVES

    for name in CURVES:
        curve = getattr(params, name)
        for size, eff in (curve.points if curve else ()):
            yield name, size, eff
    for key, fit in params.comm.items():
        yield f"comm.{key}", None, fit.efficiency


def check_bounds(params, what: str = "profile") -> None:
    """What no cluster can make true, whatever its devices: an efficiency above EFFICIENCY_CEILING or an achieved
    device-memory bandwidth above HBM_CEILING (checkable without the cluster: a profile's upload)."""
    for name, size, eff in _efficiencies(params):
        if eff > EFFICIENCY_CEILING:
            at = f" at {size:g} tokens" if size is not None else ""
            raise PlanError(f"{what}.params.{name}", f"efficiency {eff:.3g}{at} claims {eff:.3g}x the cluster's peak, "
                            f"more than any device or link reaches, even against a CPU cluster's placeholder figures "
                            f"(at most {EFFICIENCY_CEILING:g}x)",
                            "re-run `sp-plan tune` (a timing was wrong)")
    hbm = params.hbm_bandwidth
    if hbm is not None and hbm > HBM_CEILING:
        raise PlanError(f"{what}.params.hbm_bandwidth", f"{hbm:.3g} bytes/s is more than any device's memory moves "
                        f"(at most {HBM_CEILING:.3g})", "re-run `sp-plan tune` (a timing was wrong)")


def check_hbm(params, datasheet: float | None, what: str = "profile") -> None:
    """An achieved device-memory bandwidth above the device's datasheet figure (bytes/s; None: no figure)."""
    hbm = params.hbm_bandwidth
    if datasheet and hbm is not None and hbm > TOLERANCE * datasheet:
        raise PlanError(f"{what}.params.hbm_bandwidth", f"{hbm:.3g} bytes/s claims {hbm / datasheet:.2f}x the "
                        f"device's datasheet memory bandwidth ({datasheet:.3g})", "re-run `sp-plan tune` (a timing "
                        "was wrong)")


def check_params(params, cluster, what: str = "profile") -> None:
    """Calibrated efficiencies above 1 claim more than the datasheet: FLOP/s above the device's peak
    (curves are achieved / peak) or bandwidth above the links' capacity (comm fits are measured / modelled)."""
    if not has_datasheet(cluster):
        return
    for name, size, eff in _efficiencies(params):
        if eff <= TOLERANCE:
            continue
        if size is not None:  # a curve's point
            raise PlanError(f"{what}.params.{name}", f"efficiency {eff:.3g} at {size:g} tokens claims {eff:.2f}x "
                            f"the device's datasheet peak FLOP/s", "re-run `sp-plan tune` (a timing was wrong)")
        raise PlanError(f"{what}.params.{name}", f"efficiency {eff:.3g} claims {eff:.2f}x the links' capacity",
                        "re-run `sp-plan profile links` and `sp-plan tune`")


def check_samples(samples, peak_flops: float | None, datasheet: bool) -> None:
    """Kernel timings: positive finite seconds and FLOPs; on a datasheet device, no more FLOP/s than its peak."""
    for i, s in enumerate(samples):
        if not (math.isfinite(s.seconds) and s.seconds > 0):
            raise PlanError(f"kernels[{i}].seconds", f"{s.seconds} s for a {s.kind} kernel", "time it again")
        if not (math.isfinite(s.flops) and s.flops >= 0):
            raise PlanError(f"kernels[{i}].flops", f"{s.flops} FLOPs for a {s.kind} kernel", "count its FLOPs again")
        rate = s.flops / s.seconds
        if datasheet and peak_flops and rate > TOLERANCE * peak_flops:
            raise PlanError(f"kernels[{i}]", f"{s.kind} at size {s.size} ran at {rate:.3g} FLOP/s, above the device's "
                            f"datasheet peak {peak_flops:.3g}", "time it again (was the kernel synchronized?)")
