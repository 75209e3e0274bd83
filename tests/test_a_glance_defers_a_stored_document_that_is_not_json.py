"""A glance at a SQLite store whose newest profile row holds text that is not JSON cannot tell what the profile is:
it returns None (the Store answers), never raising the JSON decoder's error itself."""
from __future__ import annotations

import sqlite3

from sp_plan.planner.params import Params
from sp_plan.planner.profile import Profile
from sp_plan.profiles.peek import glance
from sp_plan.profiles.store import Store


def test_a_row_that_is_not_json_is_deferred(tmp_path):
    fp = "f" * 16
    url = f"sqlite:///{tmp_path}/s.db"
    st = Store(url)
    st.save_profile(Profile(cluster="test", cluster_fingerprint=fp, stack={}, params=Params()))
    st.close()
    assert glance(url, fp).document["cluster_fingerprint"] == fp
    with sqlite3.connect(tmp_path / "s.db") as conn:
        conn.execute("UPDATE profiles SET document = '{not json'")
    conn.close()
    assert glance(url, fp) is None
