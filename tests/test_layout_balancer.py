"""The balancer's placement of whole documents, against a plain reading of its rule, rank by rank; zigzag runs.

``balanced_parts`` keeps the ranks with room in a queue sorted by (load, rank) so that rings of many ranks with a few
tokens of room each are fast; these tests pin that it places every document exactly where the rule says: the
least-loaded rank with room for it (ties: the lowest rank), else its tokens poured in order into the least-loaded
ranks' room, each filled before the next.
"""
import numpy as np
import pytest

from sp_plan.planner.documents import draw_packs
from sp_plan.planner.layout import (BALANCED_SPLIT_SHARE, BALANCED_TOKEN_BOUND, _zigzag_sizes, balanced_parts,
                                    document_runs, spread_runs, work_prefix)
from sp_plan.planner.masks import work_before
from sp_plan.planner.model import Histogram, Lognormal


def reference_parts(cu, ring, before, bound=BALANCED_TOKEN_BOUND):
    """``balanced_parts`` read off its docstring: every rank looked at for every document."""
    seq_len = int(cu[-1])
    cap = max(-(-seq_len // ring), int(bound * seq_len / ring))
    starts, ends = cu[:-1], cu[1:]
    doc_work = before(ends) - before(starts)
    spread = np.flatnonzero((doc_work > BALANCED_SPLIT_SHARE * before(cu[-1:])[0] / ring) & (ends - starts >= 2 * ring))
    s, e, r = spread_runs(cu, ring, spread)
    w = before(np.concatenate([s, e]))
    load = np.bincount(r, weights=w[len(s):] - w[:len(s)], minlength=ring).tolist()
    held = np.bincount(r, weights=e - s, minlength=ring).astype(np.int64).tolist()
    whole = [d for d in range(len(starts)) if d not in set(spread.tolist())]
    runs = []
    for d in sorted(whole, key=lambda d: (-doc_work[d], d)):
        a, b = int(starts[d]), int(ends[d])
        fits = [x for x in range(ring) if held[x] + (b - a) <= cap]
        if fits:
            x = min(fits, key=lambda x: (load[x], x))
            runs.append((a, b, x))
            load[x] += float(doc_work[d])
            held[x] += b - a
            continue
        for x in sorted(range(ring), key=lambda x: (load[x], x)):
            take = min(max(cap - held[x], 0), b - a)
            if take:
                piece = before(np.array([a, a + take]))
                runs.append((a, a + take, x))
                load[x] += float(piece[1] - piece[0])
                held[x] += take
                a += take
            if a == b:
                break
    return spread, tuple(np.array([run[i] for run in runs], dtype=np.int64) for i in range(3))


def _same(got, want):
    assert np.array_equal(got[0], want[0])
    for g, w in zip(got[1], want[1]):
        assert g.dtype == np.int64 and np.array_equal(g, w)


MAGI_LIKE = Histogram(edges=(1, 64, 512, 2048, 8192, 32768), weights=(30.0, 30.0, 20.0, 15.0, 5.0))


@pytest.mark.parametrize("ring", [2, 3, 8, 64, 256, 1024])
@pytest.mark.parametrize("docs", [MAGI_LIKE, Lognormal(min=128, max=8192, mean=1024, sigma=1.5)])
def test_queue_places_every_document_as_the_rule_says(ring, docs):
    """Rings from a few ranks with room for many documents to many ranks with room for a few tokens (pours)."""
    for cu in draw_packs(docs, 16384, 3, seed=ring):
        for causal, window in [(True, None), (False, None), (True, 300)]:
            before = work_before(cu, causal, window)
            _same(balanced_parts(cu, ring, before), reference_parts(cu, ring, before))


def test_ties_go_to_the_lowest_rank_and_a_tight_bound_pours():
    """Equal documents on idle ranks (every load ties), a bound that leaves room for no whole document after the
    first ones, and per-token weights (work_prefix) instead of a closed form."""
    cu = np.arange(0, 4097, 64, dtype=np.int64)
    for ring, bound in [(8, 1.0), (16, 1.0), (48, 1.05), (100, 1.3)]:
        before = work_prefix(np.ones(4096), 4096)
        got, want = balanced_parts(cu, ring, before, bound), reference_parts(cu, ring, before, bound)
        _same(got, want)
    assert got[1][2][0] == 0  # the first document (heaviest, lowest index) to rank 0


def test_poured_ranks_keep_their_room_for_later_documents():
    """A rank a pour leaves part-filled takes later documents that fit its room, in (load, rank) order."""
    cu = np.concatenate([[0], np.cumsum([700, 650, 90, 30, 7, 5, 3, 1, 1, 1])]).astype(np.int64)
    before = work_before(cu, True, None)
    for ring in (4, 5, 7, 9, 13):
        _same(balanced_parts(cu, ring, before), reference_parts(cu, ring, before))


def test_runs_cover_the_sequence_once_at_a_large_ring():
    """At a ring of many ranks with eight tokens of room each, every token is on one rank and no rank holds more
    than the bound allows."""
    seq_len, ring = 1 << 17, 1 << 14
    cu = draw_packs(MAGI_LIKE, seq_len, 1, seed=3)[0]
    start, stop, rank = document_runs("balanced", ring, cu, work_before=work_before(cu, True, None))
    assert start[0] == 0 and stop[-1] == seq_len and np.array_equal(start[1:], stop[:-1])
    held = np.bincount(rank, weights=stop - start, minlength=ring)
    assert held.max() <= max(-(-seq_len // ring), int(BALANCED_TOKEN_BOUND * seq_len / ring))


@pytest.mark.parametrize("ring", [1, 2, 5, 64, 700])
def test_zigzag_runs_are_the_nonzero_chunks_of_every_document(ring):
    """Zigzag runs read from the nonzero chunks alone equal the documents x 2P chunk matrix read row by row: long
    documents (all 2P chunks), short ones (their extras only) and both in one sequence."""
    rng = np.random.default_rng(ring)
    for _ in range(20):
        S = int(rng.integers(1, 5000))
        cu = np.unique(np.concatenate([[0, S], rng.integers(1, S, size=int(rng.integers(0, 30)))])).astype(np.int64)
        sizes, chunk_rank = _zigzag_sizes(cu, ring)
        chunk = np.flatnonzero(sizes)
        n = sizes.ravel()[chunk]
        start, stop, rank = document_runs("zigzag", ring, cu)
        assert np.array_equal(stop, np.cumsum(n)) and np.array_equal(start, stop - n)
        assert np.array_equal(rank, chunk_rank[chunk % (2 * ring)])
