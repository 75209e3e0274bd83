"""Contiguous, zigzag and the balancer counted per document in closed form (planner/masks/ ``contiguous_pack``,
``zigzag_pack``, ``balanced_pack``, ``spread_loads``): the same per-rank score entries as the token-by-token
reference, the same tiles, entries and runs as their runs give, up to rings where every chunk is one token or
none."""
import numpy as np
import pytest

from sp_plan.planner import masks
from sp_plan.planner.documents import draw_packs
from sp_plan.planner.layout import _spread_loads, balanced_parts
from sp_plan.profiles.documents import load_documents


def _packs() -> list[np.ndarray]:
    """Packs of one to thousands of documents, with documents shorter than a rank's share and spanning the ring."""
    drawn = [draw_packs(load_documents(name), seq_len, 1, seed)[0]
             for name, seq_len in (("magi-short", 20000), ("megatron-dcp", 30001), ("magi-long", 65536))
             for seed in range(2)]
    tiny = np.concatenate([[0], np.cumsum(np.random.default_rng(3).integers(1, 40, size=600))])
    return drawn + [tiny, np.array([0, 1, 2, 9000]), np.array([0, 4099]), np.array([0, 7, 4000, 4095, 12289])]


RINGS = (2, 3, 64, 1000, 4096, 16384)


def _cases():
    for cu in _packs():
        for ring in RINGS:
            if ring <= cu[-1]:
                yield cu, ring


CLOSED = {"contiguous": (masks.contiguous_pack, masks.contiguous_runs), "zigzag": (masks.zigzag_pack, masks.zigzag_runs)}


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("layout", sorted(CLOSED))
def test_a_closed_form_pack_is_its_tokens_and_runs(layout, causal):
    """contiguous from its rank bounds, zigzag per document: the pairs, run count and tiles of the token lists."""
    pack, count = CLOSED[layout]
    extra = [(np.array([0, 3, 700, 1000]), 4096)] if layout == "contiguous" else []  # more ranks than tokens
    for cu, ring in list(_cases()) + extra:
        p, tiles = pack(cu, ring, causal)
        reference = masks.rank_pairs(masks.layout_tokens(layout, ring, cu, causal), cu, causal)
        assert p.tolist() == reference.tolist(), (cu[:4], ring)
        runs = masks.layout_runs(layout, ring, cu, causal)
        assert count(cu, ring) == len(runs[0])
        exact = masks.pack_tiles(layout, ring, cu, causal, runs=runs)
        assert tiles[:2] == exact[:2] and tiles[2] == pytest.approx(exact[2], rel=1e-11)


@pytest.mark.parametrize("causal", [True, False])
def test_balancer_per_document_is_its_tokens_and_runs(causal):
    for cu, ring in _cases():
        p, tiles, runs = masks.balanced_pack(cu, ring, masks.closed_balanced_parts(cu, ring, causal), causal)
        reference = masks.rank_pairs(masks.layout_tokens("balanced", ring, cu, causal), cu, causal)
        assert p.tolist() == reference.tolist(), (cu[:4], ring)
        exact_runs = masks.layout_runs("balanced", ring, cu, causal)
        assert runs == len(exact_runs[0])
        exact = masks.pack_tiles("balanced", ring, cu, causal, runs=exact_runs)
        assert tiles[:2] == exact[:2] and tiles[2] == pytest.approx(exact[2], rel=1e-11)


@pytest.mark.parametrize("causal", [True, False])
def test_spread_loads_are_the_work_read_at_every_chunk(causal):
    for cu, ring in _cases():
        before = masks.work_before(cu, causal, None)
        spread = np.flatnonzero(np.diff(cu) >= 2 * ring)
        load, held = masks.spread_loads(cu, ring, spread, causal)
        read_load, read_held = _spread_loads(cu, ring, spread, before)
        assert load.tolist() == read_load.tolist() and held.tolist() == read_held.tolist()
        closed = masks.closed_balanced_parts(cu, ring, causal)
        read = balanced_parts(cu, ring, before)
        assert closed[0].tolist() == read[0].tolist()
        assert all(a.tolist() == b.tolist() for a, b in zip(closed[1], read[1]))


@pytest.mark.parametrize("token_layout", ["contiguous", "zigzag", "balanced"])
def test_a_pack_past_the_counted_rounds_prices_as_its_runs(monkeypatch, token_layout):
    """pack_work's closed form where the rounds are taken as even, against its runs' count (the closed form off)."""
    for cu in _packs()[:4]:
        for causal in (True, False):
            for reader in (masks.work, masks.rounds, masks.striped_tiles):  # the modules that read it
                monkeypatch.setattr(reader, "ROUND_CELLS", 1 << 12)
            fast = masks.pack_work(token_layout, 4096, cu, causal)
            monkeypatch.setattr(masks.work, "zigzag_runs", lambda *a: 0)  # where pack_work reads them
            monkeypatch.setattr(masks.work, "contiguous_runs", lambda *a: 0)
            monkeypatch.setattr(masks.work, "balanced_runs", lambda *a: 0)
            runs = masks.pack_work(token_layout, 4096, cu, causal)
            monkeypatch.undo()
            for a, b in zip(fast[:3], runs[:3]):
                assert np.asarray(a).tolist() == np.asarray(b).tolist()
            assert fast[3][:2] == runs[3][:2] and fast[3][2] == pytest.approx(runs[3][2], rel=1e-11)


def test_even_rounds_are_one_float_repeated_and_the_same_values():
    for x in (np.full(5, 7.0), np.array([3.0, 1.0, 3.0]), np.zeros(4), np.zeros(0)):
        got = masks._per_round(x, 8)
        assert got == tuple((x / 8).tolist()) and all(type(v) is float for v in got)
    assert len({id(v) for v in masks._per_round(np.full(5, 7.0), 8)}) == 1


@pytest.mark.parametrize("token_layout", ["contiguous", "zigzag", "striped", "balanced"])
def test_a_sample_pack_per_rank_is_its_token_lists(token_layout):
    """``sample_rank_work`` (what ``sp-plan show`` prints) from runs and closed forms: each rank's tokens and entries
    as its token list gives them."""
    from sp_plan.planner.model import Workload
    for causal, window in ((True, None), (False, None), (True, 100)):
        work = Workload(seq_len=20000, causal=causal, documents=load_documents("magi-short"))
        for ring in (1, 3, 1000):
            s = masks.sample_rank_work(work, token_layout, ring, window, sample=1)
            tokens = masks.layout_tokens(token_layout, ring, s.cu_seqlens, causal, window)
            assert s.tokens.tolist() == [len(t) for t in tokens]
            assert s.pairs.tolist() == masks.rank_pairs(tokens, s.cu_seqlens, causal, window).tolist()


@pytest.mark.parametrize("cells_over", [-1, 0])
def test_rounds_are_taken_as_even_only_past_round_cells(monkeypatch, cells_over):
    """A zigzag pack whose runs x ranks exceed ROUND_CELLS by one takes its rounds as even; at ROUND_CELLS it counts
    them, and its busiest round is then above the mean (two long documents' chunks meet in some rounds)."""
    cu = np.concatenate([[0], np.cumsum([5000, 3192] * 4)])
    cells = masks.chunked.zigzag_runs(cu, 64) * 64
    for reader in (masks.work, masks.rounds, masks.striped_tiles):
        monkeypatch.setattr(reader, "ROUND_CELLS", cells + cells_over)
    _, busiest, mean, _ = masks.pack_work("zigzag", 64, cu, True)
    even = cells > cells + cells_over
    assert (len(set(np.asarray(busiest).tolist())) == 1) == even
    assert max(busiest) == (pytest.approx(np.mean(busiest)) if even else 17540)


def test_a_pack_past_the_real_round_cells_takes_its_rounds_as_even():
    """A million tokens of long documents on 512 ranks is past ROUND_CELLS: even rounds, in closed form."""
    cu = np.concatenate([[0], np.cumsum([40000, 25536] * 8)])
    assert masks.chunked.zigzag_runs(cu, 512) * 512 > masks.ROUND_CELLS
    _, busiest, _, _ = masks.pack_work("zigzag", 512, cu, True)
    assert len(set(np.asarray(busiest).tolist())) == 1
