"""A lognormal's documents are clipped to [min, max], so its expected length, which sizes the draws and decides
whether a distribution can be drawn at all, is the mean held within [min, max]: a distribution whose untruncated
mean lies below ``min`` (every draw raised to ``min``) is drawn, not refused as shorter than one token."""
import pytest

from sp_plan.planner.documents import draw_packs, mean_length
from sp_plan.planner.model import Lognormal


def test_the_expected_length_is_the_mean_held_within_the_clip():
    assert mean_length(Lognormal(mean=0.5, sigma=0.5, min=100, max=200)) == 100
    assert mean_length(Lognormal(mean=1e6, sigma=0.5, min=100, max=200)) == 200
    assert mean_length(Lognormal(mean=150, sigma=0.5, min=100, max=200)) == pytest.approx(150)


def test_a_mean_below_one_token_under_a_higher_min_draws_documents_of_min_tokens():
    docs = Lognormal(mean=0.5, sigma=0.5, min=100, max=200)  # every raw draw is far below 100: all clip to 100
    packs = draw_packs(docs, 1000, 2, seed=0)
    assert [p.tolist() for p in packs] == [list(range(0, 1001, 100))] * 2
