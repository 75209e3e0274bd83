"""Looking a profile up (the cluster's newest, or an id) in a named SQLite store whose file does not exist only
reads: it says there is no store there, and creates no file."""
from __future__ import annotations

import pytest

from sp_plan.planner.errors import NotFound
from sp_plan.profiles import load_cluster
from sp_plan.profiles.resolve import resolve_params, resolve_profile


def test_the_newest_profile_of_an_absent_store_is_none_and_no_file_is_made(tmp_path):
    cluster = load_cluster("dgx-h100", nodes=2)
    url = f"sqlite:///{tmp_path}/absent.db"
    prof, line = resolve_profile(None, cluster, url)
    assert prof is None and "no store at" in line and "does not exist" in line
    params, line, applied = resolve_params(cluster, None, url)
    assert applied is None and line.startswith("not using a profile")
    assert not (tmp_path / "absent.db").exists()


def test_an_id_in_an_absent_store_is_not_found_and_no_file_is_made(tmp_path):
    cluster = load_cluster("dgx-h100", nodes=2)
    url = f"sqlite:///{tmp_path}/absent.db"
    with pytest.raises(NotFound) as e:
        resolve_profile("abc123", cluster, url)
    assert e.value.field == "profile" and "does not exist" in e.value.problem
    assert not (tmp_path / "absent.db").exists()
