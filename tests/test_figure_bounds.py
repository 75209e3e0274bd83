"""A cluster's or a profile's figure past any real device (a latency of 1e308 s, an efficiency of 1e-300, an
overhead of 1e6 s a call) priced steps past float range: the service answered 500 and the CLI a nonsense step time.
Each figure has bounds a real device sits well inside, and a phase that still overflows is refused by name."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from sp_plan.planner.errors import PlanError
from sp_plan.planner.estimate import _phases
from sp_plan.planner.params import CommFit, Curve, Params
from sp_plan.profiles import cluster_presets, load_cluster, preset_cluster


@pytest.mark.parametrize("field,value", [("round_overhead_s", 1e6), ("layer_overhead_s", 1e308),
                                         ("tp_overhead_s", 11.0), ("memory_overhead_bytes", 1e300),
                                         ("hbm_bandwidth", 1e-300)])
def test_params_past_any_device_are_refused(field, value):
    with pytest.raises(ValidationError) as e:
        Params(**{field: value})
    assert field in str(e.value)


def test_efficiencies_and_latencies_have_a_floor_and_a_ceiling():
    with pytest.raises(ValidationError):
        Curve(points=((128, 1e-300),))
    with pytest.raises(ValidationError):
        CommFit(efficiency=1e-300)
    with pytest.raises(ValidationError):
        CommFit(alpha_s=1e308)
    data = preset_cluster("dgx-h100", 1).model_dump()
    node = next(iter(data["node_types"].values()))
    node["links"][0]["latency"] = 1e308
    with pytest.raises(ValidationError) as e:
        type(preset_cluster("dgx-h100", 1)).model_validate(data)
    assert "latency" in str(e.value)


def test_every_preset_sits_inside_the_bounds():
    for name in cluster_presets():
        assert load_cluster(name).world_size >= 1


def test_a_phase_priced_past_float_range_is_refused_by_name():
    rows = [("attention", "compute", "ring", 0.0, 1.0, 1.0), ("attention", "compute", "ring", 0.0, float("inf"), 0.0)]
    with pytest.raises(PlanError) as e:
        _phases(rows)
    assert e.value.field == "cluster" and "attention phase" in e.value.problem
    assert _phases(rows[:1])[0].seconds == 1.0
