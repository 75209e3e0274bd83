"""A pack's tiles counted from only the (document, rank) cells its runs hold (planner/masks/): the same tiles,
entries and entries over length as from the documents x P table, at rings where that table would be mostly empty."""
import numpy as np
import pytest

from sp_plan.planner import masks
from sp_plan.planner.documents import draw_packs
from sp_plan.profiles.documents import load_documents


def _packs(name: str, seq_len: int, seeds=range(2)) -> list[np.ndarray]:
    return [draw_packs(load_documents(name), seq_len, 1, s)[0] for s in seeds]


@pytest.mark.parametrize("token_layout", ["contiguous", "zigzag", "balanced", "striped"])
@pytest.mark.parametrize("causal, window", [(True, None), (False, None), (True, 300), (False, 7)])
def test_tiles_from_the_held_cells_are_those_of_the_whole_table(monkeypatch, token_layout, causal, window):
    packs = _packs("magi-short", 20000) + _packs("megatron-dcp", 30001) + [np.array([0, 1, 2, 9000])]
    for cu in packs:
        for ring in (3, 64, 4096):
            for reader in (masks.tiling, masks.striped_tiles):  # the modules that read it
                monkeypatch.setattr(reader, "DENSE_CELLS_PER_RUN", 10 ** 9)
            table = masks.pack_tiles(token_layout, ring, cu, causal, window)
            for reader in (masks.tiling, masks.striped_tiles):
                monkeypatch.setattr(reader, "DENSE_CELLS_PER_RUN", 0)
            held = masks.pack_tiles(token_layout, ring, cu, causal, window)
            assert held == table


def test_document_rank_sizes_keep_the_held_cells_in_document_then_rank_order():
    doc, rank, n = np.array([0, 0, 0, 2]), np.array([5, 1, 5, 0]), np.array([3, 4, 2, 7])
    sizes, owner = masks._document_rank_sizes(doc, rank, n, 3, 10 ** 6)
    assert sizes.tolist() == [4.0, 5.0, 7.0] and owner.tolist() == [0, 0, 2]


def test_run_documents_are_the_binary_search_of_every_run():
    from sp_plan.planner.masks import layout_runs, run_documents
    for cu in _packs("magi-short", 20000) + [np.array([0, 1, 2, 9000]), np.array([0, 5])]:
        for token_layout in ("contiguous", "zigzag", "balanced"):
            for ring in (1, 3, 4096):
                start = layout_runs(token_layout, ring, cu)[0]
                assert run_documents(start, cu).tolist() == (np.searchsorted(cu, start, side="right") - 1).tolist()
