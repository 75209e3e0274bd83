"""A sequence length is a whole number of tokens: 1.5k is 1536 (k and m are binary), and a length that is not a
whole number of tokens (0.1k = 102.4) is refused naming seq_len, not cut to an integer."""
from __future__ import annotations

import pytest

from sp_plan.planner.errors import PlanError
from sp_plan.planner.model import parse_seq_len


def test_fractional_binary_suffixes_that_land_on_whole_tokens_parse():
    assert parse_seq_len("1.5k") == 1536
    assert parse_seq_len("0.25m") == 262144


@pytest.mark.parametrize("text", ["0.1k", "1.0001m", "2.5"])
def test_a_length_that_is_not_whole_tokens_is_refused(text):
    with pytest.raises(PlanError) as e:
        parse_seq_len(text)
    assert e.value.field == "seq_len"
