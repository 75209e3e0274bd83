"""What a profile or measurement may claim (planner/plausible.py): finite numbers, no negative time or bandwidth
however small, and a device-memory bandwidth within noise of the datasheet's."""
import pytest

from sp_plan.planner.errors import PlanError
from sp_plan.planner.params import Params
from sp_plan.planner.plausible import check_finite, check_hbm


@pytest.mark.parametrize("key", ["alpha_s", "seconds", "busbw", "capacity"])
@pytest.mark.parametrize("value", [-1e-9, -0.5, -3.0])
def test_a_negative_time_or_bandwidth_is_refused_naming_it(key, value):
    with pytest.raises(PlanError) as e:
        check_finite({"links": [{key: value}]}, "profile")
    assert e.value.field == f"profile.links[0].{key}"
    check_finite({"links": [{key: -value}]}, "profile")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_number_that_is_not_finite_is_refused_naming_where(bad):
    with pytest.raises(PlanError) as e:
        check_finite({"measurements": {"step_s": [1.0, bad]}}, "profile")
    assert e.value.field == "profile.measurements.step_s[1]"


def test_a_memory_bandwidth_within_noise_of_the_datasheet_is_accepted_and_beyond_it_refused():
    check_hbm(Params(hbm_bandwidth=1.05 * 3.35e12), 3.35e12)  # an H100 read 5 % over its datasheet: noise
    with pytest.raises(PlanError) as e:
        check_hbm(Params(hbm_bandwidth=1.15 * 3.35e12), 3.35e12)
    assert e.value.field == "profile.params.hbm_bandwidth"
    check_hbm(Params(hbm_bandwidth=9e12), None)  # no datasheet figure: nothing to compare with
