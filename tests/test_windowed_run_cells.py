"""``masks._windowed_run_cells`` and ``masks._ramp`` against the pairs counted token by token."""

import numpy as np
import pytest

from sp_plan.planner import masks


def _runs(rng, docs, ring):
    """Runs in token order, each inside one document (start, stop, rank, document start, document end)."""
    cu = np.concatenate([[0], np.cumsum(rng.integers(1, 60, docs))])
    cuts = np.unique(np.concatenate([cu, rng.integers(0, cu[-1], 3 * docs)]))
    start, stop = cuts[:-1], cuts[1:]
    doc = np.searchsorted(cu, start, side="right") - 1
    return start, stop, rng.integers(0, ring, len(start)), cu[doc], cu[doc + 1]


def _counted(start, stop, ds, causal, window):
    """{(query run, key run): pairs} with t - k in [0, window) (causal) or |t - k| < window, one document."""
    out = {}
    for a in range(len(start)):
        t = np.arange(start[a], stop[a])[:, None]
        for b in range(len(start)):
            k = np.arange(start[b], stop[b])[None, :]
            d = t - k
            ok = (d < window) & ((d >= 0) if causal else (d > -window)) & (ds[a] == ds[b])
            if ok.any():
                out[a, b] = int(ok.sum())
    return out


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [1, 7, 40, 500])
def test_windowed_run_cells_are_the_counted_pairs_of_runs(causal, window):
    rng = np.random.default_rng(window + causal)
    start, stop, rank, ds, de = _runs(rng, 6, 4)
    qr, kr, pairs = masks._windowed_run_cells(start, stop, rank, ds, de, causal, window)
    want = _counted(start, stop, ds, causal, window)
    got = np.zeros((4, 4), dtype=np.int64)
    np.add.at(got, (qr, kr), pairs)
    expect = np.zeros((4, 4), dtype=np.int64)
    for (a, b), v in want.items():
        expect[rank[a], rank[b]] += v
    assert pairs.dtype.kind == "i" and (pairs >= 0).all()
    np.testing.assert_array_equal(got, expect)
    assert len(pairs) >= len(want)  # every pair of runs within reach has a cell (some of them empty)


def test_ramp_is_the_sum_of_min_u_nb():
    n = np.arange(-5, 40, dtype=np.int64)
    for nb in (0, 1, 3, 17):
        nbs = np.full(len(n), nb, dtype=np.int64)
        want = [sum(min(u, nb) for u in range(1, v + 1)) for v in n]
        assert masks._ramp(n, nbs).tolist() == want
    assert n[0] == -5  # the argument is left as it was


@pytest.mark.parametrize("step", [1, 4])
def test_pieces_are_the_runs_tokens_cut_every_size(step):
    rng = np.random.default_rng(step)
    n = rng.integers(1, 30, 12)
    first = np.cumsum(rng.integers(0, 5, 12)) * 100
    rank, doc = rng.integers(0, 4, 12), np.arange(12) // 3
    got = masks._pieces(first, first + step * (n - 1), step, n, rank, doc, 7)
    want = []
    for i in range(12):
        tokens = [int(first[i]) + step * u for u in range(int(n[i]))]
        for c in range(0, len(tokens), 7):
            piece = tokens[c:c + 7]
            want.append((piece[0], piece[-1], len(piece), int(rank[i]), int(doc[i])))
    assert list(zip(*(x.tolist() for x in got))) == want
