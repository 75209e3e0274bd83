"""Fuzzing the profile boundary: profile files, and figures that cannot be true (NaN, negative times,
FLOP/s above the datasheet peak, bandwidth above the links) refused before they price anything."""
from __future__ import annotations

import math
import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from fuzzing import dump, mutated, outcome, text_mutated, write
from sp_plan.planner.calibration import measured_params, resolve_params
from sp_plan.planner.errors import PlanError
from sp_plan.planner.profile import PROFILE_SCHEMA_VERSION, KernelSample, Profile
from sp_plan.planner.yamlio import read_data
from sp_plan.profiles import preset_cluster

FIXTURE = Path(__file__).parent / "fixtures" / "profile-dgx-h100.yaml"
H100 = preset_cluster("dgx-h100", 2)
CPU = preset_cluster("cpu-local", 1)
BASE = {**read_data(FIXTURE, "profile"), "cluster_fingerprint": H100.topology_fingerprint(), "stack": {}}

EFF = st.floats(0.01, 1.0)
CURVE = st.lists(st.tuples(st.floats(1, 2**20), EFF), min_size=1, max_size=4, unique_by=lambda p: p[0]).map(
    lambda pts: {"points": [list(p) for p in pts]})


@st.composite
def profile_docs(draw) -> dict:
    """A profile with plausible fitted parameters for the dgx-h100 x2 preset."""
    params = {"overlap": draw(st.floats(0, 1)), "round_overhead_s": draw(st.floats(0, 1e-3)),
              "activation_factor": draw(st.floats(0.5, 2)),
              "comm": {k: {"alpha_s": draw(st.floats(0, 1e-3)), "efficiency": draw(EFF)}
                       for k in draw(st.sets(st.sampled_from(["all_to_all/intra", "all_to_all/inter", "p2p/intra",
                                                              "all_gather/inter"]), max_size=3))}}
    for name in ("attention_fwd", "attention_bwd", "matmul"):
        if draw(st.booleans()):
            params[name] = draw(CURVE)
    return {**BASE, "params": params}


def _with_file(doc: dict, fn, suffix: str = ".yaml"):
    with tempfile.TemporaryDirectory() as d:
        path = write(Path(d), f"profile{suffix}", dump(doc, suffix))
        return fn(path)


@given(profile_docs(), st.sampled_from([".yaml", ".json"]))
def test_valid_profile_round_trips_and_applies(doc, suffix):
    def check(path):
        p = Profile.load(path)
        p.save(path)
        assert Profile.load(path) == p
        params, line, prof = resolve_params(H100, str(path))
        assert prof == p and params == p.params and line.startswith("using")
    _with_file(doc, check, suffix)


@given(profile_docs().flatmap(mutated), st.sampled_from([".yaml", ".json"]))
def test_mutated_profile_is_a_plan_error_or_applies(doc, suffix):
    def check(path):
        got = outcome(lambda: Profile.load(path))
        if isinstance(got, Profile):
            got.save(path)
            assert Profile.load(path) == got
            outcome(lambda: resolve_params(H100, str(path)))  # applied, not applied (says why), or refused
    _with_file(doc, check, suffix)


@given(profile_docs().map(lambda doc: dump(doc, ".yaml")).flatmap(text_mutated))
def test_damaged_profile_file_is_a_plan_error_or_loads(data):
    with tempfile.TemporaryDirectory() as d:
        assert isinstance(outcome(lambda: Profile.load(write(Path(d), "p.yaml", data))), (Profile, PlanError))


@given(profile_docs(), st.sampled_from(["attention_fwd", "attention_bwd", "matmul", "comm"]), st.floats(1.11, 1e6))
def test_efficiency_above_the_datasheet_is_refused_on_gpus(doc, where, eff):
    if where == "comm":
        doc["params"]["comm"] = {"all_to_all/intra": {"alpha_s": 0.0, "efficiency": eff}}
    else:
        doc["params"][where] = {"points": [[4096.0, 0.5], [65536.0, eff]]}
    e = _with_file(doc, lambda path: outcome(lambda: resolve_params(H100, str(path))))
    assert isinstance(e, PlanError) and e.field == "profile"
    assert ("datasheet peak" in e.problem) if where != "comm" else ("capacity" in e.problem)
    # CPU rank slots carry placeholder peaks, not datasheets: the same figure is a CPU beating its placeholder
    cpu = {**doc, "cluster_fingerprint": CPU.topology_fingerprint()}
    assert _with_file(cpu, lambda path: resolve_params(CPU, str(path)))[2] is not None


BAD = st.sampled_from([math.nan, math.inf, -math.inf])


@given(profile_docs(), st.sampled_from(["measured_s", "predicted_before_s", "measured_memory", "overlap",
                                        "efficiency", "curve", "measurements", "loo_error_after"]),
       st.one_of(BAD, st.floats(-1e9, -1e-9)))
def test_nan_and_negative_figures_are_refused(doc, where, bad):
    if where in ("measured_s", "predicted_before_s", "measured_memory"):
        doc["candidates"] = [dict(doc["candidates"][0], **{where: bad})]
    elif where == "overlap":
        doc["params"]["overlap"] = bad
    elif where == "efficiency":
        doc["params"]["comm"] = {"p2p/intra": {"alpha_s": 0.0, "efficiency": bad}}
    elif where == "curve":
        doc["params"]["matmul"] = {"points": [[1024.0, bad]]}
    elif where == "measurements":
        doc["measurements"] = {"kernels": [{"kind": "matmul", "seconds": bad}]}
    else:
        doc[where] = bad
    for suffix in (".yaml", ".json"):
        e = _with_file(doc, lambda path: outcome(lambda: Profile.load(path)), suffix)
        assert isinstance(e, PlanError), (where, bad)


@given(st.floats(1.11, 1e3), st.sampled_from(["attention_fwd", "matmul"]), st.floats(1e-6, 1.0))
def test_kernel_timings_above_the_peak_are_refused_in_calibration(over, kind, seconds):
    peak = H100.device(0).peak_flops["bf16"]
    fast = KernelSample(kind=kind, size=4096, heads=8, head_dim=128, causal=True, flops=over * peak * seconds,
                        seconds=seconds, dtype="bf16")
    e = outcome(lambda: measured_params(H100, "bf16", kernels=[fast]))
    assert isinstance(e, PlanError) and "datasheet peak" in e.problem
    ok = KernelSample(kind=kind, size=4096, heads=8, head_dim=128, causal=True, flops=0.5 * peak * seconds,
                      seconds=seconds, dtype="bf16")
    assert measured_params(H100, "bf16", kernels=[ok]) is not None
    for bad in (0.0, -seconds, math.nan):
        neg = KernelSample(kind=kind, size=4096, heads=8, head_dim=128, causal=True, flops=1e9, seconds=bad, dtype="bf16")
        assert isinstance(outcome(lambda: measured_params(CPU, "bf16", kernels=[neg])), PlanError)


@given(profile_docs(), st.integers(PROFILE_SCHEMA_VERSION + 1, 10**6))
def test_newer_profile_is_refused_naming_both_versions(doc, version):
    e = _with_file({**doc, "schema_version": version}, lambda path: outcome(lambda: resolve_params(H100, str(path))))
    assert isinstance(e, PlanError) and str(version) in e.problem and f"({PROFILE_SCHEMA_VERSION})" in e.problem
