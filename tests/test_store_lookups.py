"""How the profile store finds what it is asked for: a typed id prefix matches its characters literally, a profile
replaced under its id gets a new stamp (so answers priced with the old one are not served again), and a read-only
open of a mistyped $SP_PLAN_STORE is an error naming the variable, not a new empty store."""
from __future__ import annotations

import pytest

from sp_plan.planner.errors import NotFound, StoreError
from sp_plan.planner.params import Params
from sp_plan.planner.profile import Profile
from sp_plan.profiles.store import Store

FP = "f" * 16


def make_profile(id: str, overlap: float = 0.9, **kw) -> Profile:
    """A small profile of topology FP (``kw``: other fields, such as created_at)."""
    return Profile(id=id, cluster="test", cluster_fingerprint=FP, params=Params(overlap=overlap), **kw)


def store_holding(tmp_path, *ids: str) -> Store:
    """A fresh SQLite store holding one profile under each of ``ids``."""
    st = Store(f"sqlite:///{tmp_path}/s.db")
    for pid in ids:
        st.save_profile(make_profile(pid))
    return st


@pytest.mark.parametrize("prefix", ["run_", "run%", "r_nX", "%%%%"])
def test_an_id_prefix_matches_its_characters_not_a_pattern(tmp_path, prefix):
    """A prefix holding '_' or '%' names no profile whose id has another character there."""
    st = store_holding(tmp_path, "runX1234")
    with pytest.raises(NotFound):
        st.get_profile(prefix)
    with pytest.raises(NotFound):
        st.delete_profile(prefix)
    assert st.has_profile("runX1234")


def test_an_id_prefix_matches_its_letters_case_and_all(tmp_path):
    """A prefix in other letter case names no profile, on SQLite (whose LIKE ignores case) as on PostgreSQL: `sp-plan
    profile delete RUNX` does not delete runX1234."""
    st = store_holding(tmp_path, "runX1234")
    for prefix in ("RUNX", "runx1"):
        with pytest.raises(NotFound):
            st.delete_profile(prefix)
    assert st.get_profile("runX").id == "runX1234"


def test_an_id_prefix_with_an_underscore_finds_its_profile(tmp_path):
    """The literal match still finds the profile whose id starts with the typed prefix, '_' included."""
    st = store_holding(tmp_path, "runX1234", "run_5678")
    assert st.get_profile("run_").id == "run_5678"


def test_a_profile_replaced_under_its_id_gets_a_new_stamp(tmp_path):
    """Saving other figures under the same id and created_at changes the stamp that versions cached answers."""
    st = Store(f"sqlite:///{tmp_path}/s.db")
    created = "2026-11-01T00:00:00+00:00"
    st.save_profile(make_profile("p9", overlap=0.9, created_at=created))
    before = (st.profile_stamp(FP, "p9"), st.profile_stamp(FP))
    st.save_profile(make_profile("p9", overlap=0.3, created_at=created))
    after = (st.profile_stamp(FP, "p9"), st.profile_stamp(FP))
    assert st.get_profile("p9").params.overlap == 0.3
    assert after[0].startswith("p9@") and after[0] != before[0]
    assert after[1] != before[1]


def test_a_mistyped_store_variable_for_a_read_is_an_error_naming_it(tmp_path, monkeypatch):
    """A read-only open of a $SP_PLAN_STORE file that does not exist names the variable and creates nothing."""
    typo = tmp_path / "typo.db"
    monkeypatch.setenv("SP_PLAN_STORE", f"sqlite:///{typo}")
    with pytest.raises(StoreError) as e:
        Store(existing=True)
    assert e.value.field == "SP_PLAN_STORE" and "no store at" in e.value.problem and str(typo) in e.value.problem
    assert not typo.exists()


def test_a_store_variable_naming_a_store_opens_it_for_a_read(tmp_path, monkeypatch):
    """The same read-only open of a $SP_PLAN_STORE store that exists reads what it holds."""
    store_holding(tmp_path, "abcd1234").close()
    monkeypatch.setenv("SP_PLAN_STORE", f"sqlite:///{tmp_path}/s.db")
    assert [p.id for p in Store(existing=True).list_profiles()] == ["abcd1234"]
