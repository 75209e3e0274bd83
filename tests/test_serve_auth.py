"""The service's bearer tokens (service/auth.py) without a server: which lines of a token file are tokens, and which
Authorization headers pass."""
from __future__ import annotations

import pytest

from sp_plan.planner.errors import PlanError
from sp_plan.service.auth import Forbidden, Unauthorized, check, load_tokens


def test_a_token_file_holds_one_token_a_line_its_comments_and_blank_lines_are_not_tokens(tmp_path):
    f = tmp_path / "tokens"
    f.write_text("# admin tokens\n\n  t1  \nt2\n")
    assert load_tokens(str(f)) == (b"t1", b"t2")
    with pytest.raises(Forbidden):
        check("Bearer # admin tokens", load_tokens(str(f)))


def test_a_token_file_without_a_token_is_refused_at_start_naming_the_file(tmp_path):
    f = tmp_path / "tokens"
    f.write_text("# none yet\n\n")
    with pytest.raises(PlanError) as e:
        load_tokens(str(f))
    assert e.value.field == "token_file" and str(f) in e.value.problem


def test_any_listed_token_passes_in_the_bearer_scheme_whatever_its_case():
    tokens = load_tokens(listed="t1, t2")
    for header in ("Bearer t1", "Bearer t2", "bearer t1", "Bearer  t2 "):
        check(header, tokens)
    with pytest.raises(Forbidden):
        check("Bearer t3", tokens)
    for header in (None, "", "Basic t1", "Bearer "):
        with pytest.raises(Unauthorized):
            check(header, tokens)
    with pytest.raises(Forbidden):  # a service given no tokens takes no writes
        check("Bearer t1", ())
