"""Ring and all-gather blocks under document masks and windows are tiles inside one document: together they cover
exactly the mask (``kernels.attended``) of a member's queries against another member's keys, each attended pair
once, and a 128k-token packed sequence's tiles at world 8 are built without any matrix over a block."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from sp_plan.runtime import kernels as T
from sp_plan.runtime.variants.allgather import chunk_masks
from sp_plan.runtime.variants.ring import member_tokens, round_masks, runs_of_members

LAYOUTS = ("contiguous", "zigzag", "striped", "balanced")


def _tile_dense(bm, n_q: int, n_k: int) -> np.ndarray:
    """The (queries, keys) pairs one tile attends, over the whole block."""
    out = np.zeros((n_q, n_k), dtype=np.int64)
    r, c = bm.row_stop - bm.row_start, bm.col_stop - bm.col_start
    if bm.mask is not None:
        sub = bm.mask.numpy()
    elif bm.causal_offset is not None:
        sub = np.arange(c)[None, :] <= np.arange(r)[:, None] + bm.causal_offset
    else:
        sub = np.ones((r, c), dtype=bool)
    out[bm.row_start:bm.row_stop, bm.col_start:bm.col_stop] = sub
    return out


def _cases():
    """(layout, world, seq, causal, cu_seqlens, window): short and long documents, one document, windows."""
    for layout in LAYOUTS:
        for world in (2, 3, 4, 8):
            for causal in (True, False):
                for cu, window in (((0, 5, 40, 41, 97, 160), None), ((0, 5, 40, 41, 97, 160), 7),
                                   ((0, 160), 20), ((0, 3, 130, 160), 33), ((0, 160), None)):
                    yield layout, world, 160, causal, cu, window
                if layout != "balanced" and 160 % (2 * world) == 0:
                    yield layout, world, 160, causal, None, 11


@pytest.mark.parametrize("layout", LAYOUTS)
def test_tiles_cover_every_block_mask_exactly(layout):
    """Every (queries, keys) member block: the tiles' union is the mask and no pair is attended twice."""
    for lay, world, seq, causal, cu, window in _cases():
        if lay != layout:
            continue
        tokens = member_tokens(layout, world, seq, causal, cu, window)
        docs = None if cu is None else T.document_ids(cu, seq)
        for p in range(world):
            masks = chunk_masks(layout, world, seq, p, causal, cu, window)
            rounds = round_masks(layout, world, seq, p, causal, cu, window)
            for r in range(world):
                want = T.attended(tokens[p], tokens[r], causal=causal, documents=docs, window=window)
                case = (layout, world, causal, cu, window, p, r)
                for block in (masks[r], rounds[(p - r) % world]):
                    got = sum((_tile_dense(bm, *want.shape) for bm in block or ()), np.zeros(want.shape, np.int64))
                    assert got.max(initial=0) <= 1, case
                    assert np.array_equal(got.astype(bool), want), case
                    assert (block is None) == (not want.any()), case


def test_striped_runs_are_progressions_not_single_tokens():
    """A striped member's tokens in one document form one run of step P, so its tiles stay few."""
    runs = runs_of_members("striped", 8, 1024, True, (0, 100, 1024), None)
    assert [len(r) for r in runs] == [2] * 8


def test_a_128k_packed_sequence_builds_its_tiles_without_a_block_matrix(monkeypatch):
    """World 8, 128k tokens of packed documents (short ones and one spanning several ranks), with and without a
    window: every rank's ring rounds and all-gather chunks are built, the largest mask built is a window's band,
    and the memory traced while building one layout's blocks stays far below one S/P x S/P boolean matrix."""
    seq, world, window = 131072, 8, 1024
    lengths = np.random.default_rng(0).integers(64, 3000, size=40)
    cu = tuple(int(x) for x in np.concatenate([[0], np.cumsum(lengths)])) + (seq,)
    largest, built = [0], T.attended

    def spy(q, k, **kw):
        largest[0] = max(largest[0], len(q) * len(k))
        return built(q, k, **kw)

    monkeypatch.setattr(T, "attended", spy)
    for cached in (T.window_band, round_masks, chunk_masks, runs_of_members, member_tokens):
        cached.cache_clear()
    bound = max(window, T.MIN_TILE) ** 2  # a band over two tiles of at most a window's reach each
    block = (seq // world) ** 2  # bytes of one S/P x S/P boolean matrix: 256 MiB
    tracemalloc.start()
    try:
        for layout in LAYOUTS:
            for w in (None, window):
                base = tracemalloc.get_traced_memory()[0]
                tracemalloc.reset_peak()
                for p in range(world):
                    for masks in (round_masks(layout, world, seq, p, True, cu, w),
                                  chunk_masks(layout, world, seq, p, True, cu, w)):
                        assert any(m is not None for m in masks)
                        assert all(bm.mask is None or bm.mask.numel() <= bound for m in masks for bm in m or ())
                assert tracemalloc.get_traced_memory()[1] - base < block // 4, (layout, w)
    finally:
        tracemalloc.stop()
    assert 0 < largest[0] <= bound < block
