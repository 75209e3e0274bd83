"""Of two profiles of one topology created at the same time, the one stored last is the cluster's newest: the
glance a plan's default lookup makes and the Store agree on it."""
from __future__ import annotations

import time

from sp_plan.planner.params import Curve, Params
from sp_plan.planner.profile import Profile
from sp_plan.profiles import load_cluster
from sp_plan.profiles.peek import glance
from sp_plan.profiles.resolve import resolve_params
from sp_plan.profiles.store import Store

CREATED = "2026-03-01T00:00:00+00:00"


def _profile(fp: str, pid: str, eff: float) -> Profile:
    return Profile(id=pid, cluster="dgx-h100x2", cluster_fingerprint=fp, stack={}, created_at=CREATED,
                   params=Params(matmul=Curve(points=((4096, eff),))))


def test_the_later_stored_wins_a_tie(tmp_path):
    cluster = load_cluster("dgx-h100", nodes=2)
    fp = cluster.topology_fingerprint()
    url = f"sqlite:///{tmp_path}/s.db"
    st = Store(url)
    for pid, eff in (("first", 0.5), ("second", 0.8), ("third", 0.6)):
        st.save_profile(_profile(fp, pid, eff))
        time.sleep(0.002)  # stored_at is kept to the microsecond
    assert st.latest_profile(fp).id == "third"
    st.close()
    assert Profile.model_validate(glance(url, fp).document).id == "third"
    assert resolve_params(cluster, None, url)[2].id == "third"
