"""A store row whose document is not JSON (a damaged file, a hand edit) is reported as the store's error, naming the
store and the fix, by every read of it: the cluster's newest profile, an id, the list."""
from __future__ import annotations

import sqlite3

import pytest

from sp_plan.planner.errors import StoreError
from sp_plan.planner.params import Params
from sp_plan.planner.profile import Profile
from sp_plan.profiles import load_cluster
from sp_plan.profiles.resolve import resolve_profile
from sp_plan.profiles.store import Store


@pytest.fixture
def damaged(tmp_path):
    """A SQLite store holding one profile of two dgx-h100 nodes, its document overwritten with text."""
    cluster = load_cluster("dgx-h100", nodes=2)
    url = f"sqlite:///{tmp_path}/s.db"
    st = Store(url)
    pid = st.save_profile(Profile(cluster="dgx-h100x2", cluster_fingerprint=cluster.topology_fingerprint(),
                                    stack={}, params=Params()))
    st.close()
    with sqlite3.connect(tmp_path / "s.db") as conn:
        conn.execute("UPDATE profiles SET document = '{not json'")
    conn.close()
    return cluster, url, pid


def test_every_read_names_the_store_and_the_fix(damaged):
    cluster, url, pid = damaged
    st = Store(url)
    for read in (lambda: st.latest_profile(cluster.topology_fingerprint()), lambda: st.get_profile(pid),
                 st.list_profiles, lambda: resolve_profile(None, cluster, url)):
        with pytest.raises(StoreError) as e:
            read()
        assert e.value.field == "store" and "is not JSON" in e.value.problem and "s.db" in e.value.problem
        assert "restore the store" in e.value.fix
    st.close()
