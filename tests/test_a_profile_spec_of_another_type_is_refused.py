"""A profile is given as a Profile, a file or id (str or path), None (the cluster's newest) or False (none); anything
else (True, a number, a list) is refused naming ``profile`` and the type, before any store is looked at."""
from __future__ import annotations

import pytest

from sp_plan.planner.errors import PlanError
from sp_plan.profiles import load_cluster
from sp_plan.profiles.resolve import resolve_params, resolve_profile


@pytest.mark.parametrize("spec", [True, 7, 1.5, ["abc123"]])
def test_a_spec_of_another_type_is_refused(spec, tmp_path):
    cluster = load_cluster("dgx-h100", nodes=2)
    url = f"sqlite:///{tmp_path}/s.db"
    for call in (resolve_profile, resolve_params):
        with pytest.raises(PlanError) as e:
            call(cluster=cluster, **{"spec" if call is resolve_profile else "profile": spec}, store=url)
        assert e.value.field == "profile" and type(spec).__name__ in e.value.problem
    assert not (tmp_path / "s.db").exists()
