"""Ring rounds under a mask counted without their (P, P) matrix (planner/masks/): each round's busiest rank and mean
equal the max and mean of the counted rounds, and a search's priced rounds stay those of the matrix."""
import numpy as np
import pytest

from sp_plan.planner.documents import draw_packs
from sp_plan.planner.masks import (layout_rounds, pair_matrix, layout_tokens, round_stats, striped_round_stats,
                                   striped_rounds)
from sp_plan.profiles.documents import load_documents

ODD = [np.array([0, 4099]), np.array([0, 1, 2, 3, 4099]), np.array([0, 7, 300, 301, 1025, 2047, 4099]),
       np.array([0, 13]), np.array([0, 1, 13])]


def _packs(name: str, seq_len: int, seeds=range(2)) -> list[np.ndarray]:
    return [draw_packs(load_documents(name), seq_len, 1, s)[0] for s in seeds]


@pytest.mark.parametrize("window", [None, 1, 2, 5, 100, 3000, 70000])
@pytest.mark.parametrize("ring", [1, 2, 3, 7, 64, 256])
def test_striped_rounds_from_their_reach_are_the_counted_rounds(ring, window):
    for cu in ODD + _packs("magi-long", 65536) + _packs("megatron-dcp", 20001) + _packs("magi-short", 9000):
        rounds = striped_rounds(cu, ring, True, window)
        hi, mean = striped_round_stats(cu, ring, window)
        assert hi.dtype == np.int64
        assert hi.tolist() == rounds.max(axis=1).tolist() and mean.tolist() == rounds.mean(axis=1).tolist()


def test_striped_rounds_from_their_reach_match_the_pair_matrix():
    """The token-by-token reference, at a ring where few long documents leave the reach entries sparse."""
    cu, ring = np.array([0, 5000, 5003, 9000]), 32
    m = pair_matrix(layout_tokens("striped", ring, cu), cu)
    r = np.arange(ring)
    rounds = m[r[None, :], (r[None, :] - r[:, None]) % ring]
    hi, mean = striped_round_stats(cu, ring)
    assert hi.tolist() == rounds.max(axis=1).tolist() and mean.tolist() == rounds.mean(axis=1).tolist()


@pytest.mark.parametrize("window", [None, 300])
def test_round_stats_take_the_sparse_striped_count_and_keep_the_rounds(window):
    for cu in _packs("magi-long", 1 << 18, range(3)):
        for ring in (64, 512):
            rounds = layout_rounds("striped", ring, cu, True, window)
            hi, mean = round_stats("striped", ring, cu, True, window)
            assert hi.tolist() == rounds.max(axis=1).tolist() and mean.tolist() == rounds.mean(axis=1).tolist()


def _counted(token_layout: str, ring: int, cu) -> tuple[np.ndarray, np.ndarray]:
    """Each round's max and mean over the ranks of the token-by-token pair matrix."""
    m = pair_matrix(layout_tokens(token_layout, ring, cu), cu)
    r = np.arange(ring)
    rounds = m[r[None, :], (r[None, :] - r[:, None]) % ring]
    return rounds.max(axis=1), rounds.mean(axis=1)


@pytest.mark.parametrize("ring", [2, 3, 5, 8, 16, 64])
def test_contiguous_rounds_from_the_documents_are_the_pair_matrix(ring):
    """Uneven rank sizes (S mod P ranks one longer), documents on one rank, on two, and across many, S < P."""
    from sp_plan.planner.masks import contiguous_round_stats
    for cu in ODD + _packs("magi-long", 8192) + _packs("magi-short", 4097) + [np.array([0, 2, 3, 5, 7, 30, 33, 40])]:
        hi, mean = contiguous_round_stats(cu, ring)
        want_hi, want_mean = _counted("contiguous", ring, cu)
        assert hi.dtype == np.int64
        assert hi.tolist() == want_hi.tolist() and mean.tolist() == want_mean.tolist()


@pytest.mark.parametrize("ring", [7, 1000, 1024])
def test_contiguous_rounds_from_the_documents_at_large_rings_are_the_counted_rounds(ring):
    from sp_plan.planner.masks import _counted_matrix, _diagonals, contiguous_round_stats
    for cu in _packs("magi-long", 1 << 20, range(3)) + _packs("megatron-dcp", 300001) + _packs("magi-short", 1 << 18):
        by_rank = _diagonals(_counted_matrix("contiguous", ring, cu, True, None, None))
        hi, mean = contiguous_round_stats(cu, ring)
        assert hi.tolist() == by_rank.max(axis=0)[::-1].tolist()
        assert mean.tolist() == by_rank.mean(axis=0)[::-1].tolist()


@pytest.mark.parametrize("share", [0, 10 ** 9])
@pytest.mark.parametrize("token_layout", ["zigzag", "balanced"])
@pytest.mark.parametrize("ring", [2, 3, 5, 8, 16, 64])
def test_zigzag_and_balancer_rounds_from_their_chunks_are_the_pair_matrix(monkeypatch, token_layout, ring, share):
    """Every pack through the pieces (their threshold lifted) or the matrix built from the same chunks (none):
    documents spread on every rank, short ones as runs."""
    from sp_plan.planner import masks
    monkeypatch.setattr(masks.chunk_rounds, "PIECES_SHARE", share)  # where chunk_round_stats reads it
    for cu in ODD + _packs("magi-long", 8192) + _packs("magi-short", 4097) + [np.array([0, 2, 3, 5, 7, 300, 333, 400])]:
        hi, mean = masks.chunk_round_stats(token_layout, ring, cu)
        want_hi, want_mean = _counted(token_layout, ring, cu)
        assert hi.dtype == np.int64
        assert hi.tolist() == want_hi.tolist() and mean.tolist() == want_mean.tolist()


@pytest.mark.parametrize("token_layout", ["zigzag", "balanced"])
def test_round_stats_take_the_pieces_where_few_and_keep_the_rounds(token_layout):
    for cu in _packs("magi-long", 1 << 20, range(6)) + [np.array([0, 1 << 20]), np.array([0, 3, 1 << 20])]:
        for ring in (256, 1024):
            rounds = layout_rounds(token_layout, ring, cu)  # counted (or, past ROUND_CELLS, even) from the matrix
            stats = round_stats(token_layout, ring, cu, True, None)
            assert stats[0].tolist() == rounds.max(axis=1).tolist()
            assert stats[1].tolist() == rounds.mean(axis=1).tolist()
