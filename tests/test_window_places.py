"""The ranks where a zigzag-chunked document's chunks cross a window's offsets (window_forms.window_places), read
off the pieces where the chunks' offsets are linear in the rank: the same ranks as a bisection over every rank,
over random packs, rings from 2 to more ranks than tokens, windows from 1 to 4096, causal and bidirectional."""
import numpy as np
import pytest

from sp_plan.planner import masks, window_forms
from sp_plan.planner.documents import draw_packs
from sp_plan.profiles.documents import load_documents


def _packs() -> list[np.ndarray]:
    """Random packs, single documents shorter and longer than a ring, and a magi-long pack."""
    rng = np.random.default_rng(31)
    out = [np.array([0, 1]), np.array([0, 5000]), np.array([0, 1, 2, 9000])]
    for _ in range(10):
        S = int(rng.integers(2, 9000))
        cuts = rng.choice(np.arange(1, S), size=min(int(rng.integers(0, 9)), S - 1), replace=False)
        out.append(np.concatenate([[0], np.sort(cuts), [S]]).astype(np.int64))
    return out + [draw_packs(load_documents("magi-long"), 1 << 16, 1, 0)[0]]


def _bisected(start, T, P: int) -> np.ndarray:
    """Per document, the last u in [0, P) with start(u) < T, -1 where none, by bisection over the ranks."""
    lo, hi = np.full(len(T), -1, dtype=np.int64), np.full(len(T), P, dtype=np.int64)
    while (hi - lo > 1).any():
        mid = (lo + hi) // 2
        below = start(np.clip(mid, 0, P - 1)[:, None])[:, 0] < T
        open_ = hi - lo > 1
        lo, hi = np.where(open_ & below, mid, lo), np.where(open_ & ~below, mid, hi)
    return lo


@pytest.mark.parametrize("causal", [True, False])
def test_places_from_linear_pieces_are_the_bisected_ones(causal, monkeypatch):
    """Every ``window_places`` call that zigzag_pack and the balancer's spread documents make, against the
    bisection; and those layouts' entries against the token-by-token count."""
    calls = []

    def checked(first, second, thresholds, P, places):
        got = window_forms.window_places(first, second, thresholds, P, places)
        expect = []
        for T in thresholds:
            expect.append(_bisected(first, T, P))
            expect.append(P - 1 - _bisected(lambda v: second(P - 1 - v), T, P))
        assert got.tolist() == np.stack(expect, axis=1).tolist()
        calls.append(P)
        return got

    monkeypatch.setattr(masks.chunked, "window_places", checked)  # where zigzag and the spread documents read it
    for cu in _packs():
        for ring in (2, 7, 64, 1000, 20000):
            for window in (1, 3, 100, 700, 4096):
                p = masks.zigzag_pack(cu, ring, causal, window)[0]
                if ring <= 64 and cu[-1] <= 12000:  # the token-by-token count is O(S W)
                    reference = masks.rank_pairs(masks.layout_tokens("zigzag", ring, cu), cu, causal, window)
                    assert p.tolist() == reference.tolist(), (cu[:4], ring, window)
                masks.closed_balanced_parts(cu, ring, causal, window)
    assert len(calls) > 1.2 * len(_packs()) * 5 * 5  # the spread documents' too
