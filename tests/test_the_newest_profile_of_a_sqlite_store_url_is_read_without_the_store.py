"""The cluster's newest profile in a SQLite store named by URL (at this sp-plan's schema head) is read by the glance,
without opening a ``Store`` (which imports SQLAlchemy and alembic): the lookup every plan makes stays cheap. An empty
store says none is stored, also without the Store."""
from __future__ import annotations

import sp_plan.profiles.resolve as resolve
from sp_plan.planner.params import Curve, Params
from sp_plan.planner.profile import Profile
from sp_plan.profiles import load_cluster
from sp_plan.profiles.store import Store


def _no_store(*a, **k):
    raise AssertionError("the Store was opened for a lookup the glance answers")


def test_a_url_lookup_is_answered_by_the_glance(tmp_path, monkeypatch):
    cluster = load_cluster("dgx-h100", nodes=2)
    url = f"sqlite:///{tmp_path}/s.db"
    st = Store(url)
    monkeypatch.setattr(resolve, "_from_store", _no_store)
    prof, line = resolve.resolve_profile(None, cluster, url)
    assert prof is None and "none stored" in line
    p = Profile(cluster="dgx-h100x2", cluster_fingerprint=cluster.topology_fingerprint(), stack={},
                params=Params(matmul=Curve(points=((4096, 0.8),))))
    st.save_profile(p)
    st.close()
    params, line, applied = resolve.resolve_params(cluster, None, url)
    assert applied == p and params == p.params
