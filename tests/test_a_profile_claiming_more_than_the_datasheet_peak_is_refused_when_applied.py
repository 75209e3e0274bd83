"""A profile whose kernel curve or collective fit claims more than the cluster's datasheet (an efficiency above 1,
past the tolerance) is refused when it would price a plan, naming the profile and the figure; it is never used to
rank plans."""
from __future__ import annotations

import pytest

from sp_plan.planner.errors import PlanError
from sp_plan.planner.params import CommFit, Curve, Params
from sp_plan.planner.profile import Profile
from sp_plan.profiles import load_cluster
from sp_plan.profiles.resolve import resolve_params, resolve_profile


def _profile(cluster, params: Params) -> Profile:
    return Profile(cluster="dgx-h100x2", cluster_fingerprint=cluster.topology_fingerprint(), stack={}, params=params,
                   id="p1")


@pytest.mark.parametrize("params, figure", [
    (Params(matmul=Curve(points=((4096, 2.0),))), "matmul"),
    (Params(comm={"all_to_all/intra": CommFit(efficiency=3.0)}), "all_to_all/intra"),
])
def test_an_efficiency_above_the_datasheet_is_refused(params, figure):
    cluster = load_cluster("dgx-h100", nodes=2)
    prof = _profile(cluster, params)
    with pytest.raises(PlanError) as e:
        resolve_profile(prof, cluster)
    assert e.value.field == "profile" and figure in e.value.problem and "p1" in e.value.problem
    with pytest.raises(PlanError):
        resolve_params(cluster, prof)


def test_an_efficiency_within_the_datasheet_is_applied():
    cluster = load_cluster("dgx-h100", nodes=2)
    prof = _profile(cluster, Params(matmul=Curve(points=((4096, 0.8),))))
    params, line, applied = resolve_params(cluster, prof)
    assert applied == prof and params == prof.params and line.startswith("using")
