"""Which mask placed a batch's packed documents, so that ``ctx.attention`` and ``ctx.gather`` read the tokens as
``ctx.shard`` laid them out.

A ``balanced`` layout assigns packed documents to ranks by their attention work, and the work depends on the mask:
causal or not, and the window. A shard placed by one mask and an attention that lays the same documents out by
another can hold the same token counts on every rank and still pair queries with the wrong keys, a wrong result with
no error. ``ctx.shard`` records the mask it placed each batch's documents by (the latest ``KEEP`` batches);
``ctx.attention`` and ``ctx.gather`` check that their mask places the tokens alike, or, for documents no
``ctx.shard`` of this context placed, that it places them as the plan's own mask does. The other layouts place
tokens by the documents alone, so any mask reads them.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable

import numpy as np

from sp_plan.planner.errors import PlanError

#: batches whose placing mask is remembered: a training step shards one batch and its layers then read it
KEEP = 64

#: (cu_seqlens, causal, window) -> the tokens each rank of the sequence group holds, by rank
Pieces = Callable[[tuple, bool, "int | None"], dict]


def describe(causal: bool, window: int | None) -> str:
    """A mask in words: "causal, window 5", "bidirectional, no window"."""
    return f"{'causal' if causal else 'bidirectional'}, {'no window' if window is None else f'window {window}'}"


class Placements:
    """The mask ``ctx.shard`` placed each recent batch's documents by, and the checks that a call reads them alike."""

    def __init__(self, token_layout: str, pieces: Pieces, planned_causal: bool):
        self.depends = token_layout == "balanced"  # the only layout whose placement reads the mask
        self.pieces = pieces
        self.planned_causal = planned_causal  # the plan's own mask (its window is cut to each batch's documents)
        self._placed: OrderedDict = OrderedDict()  # cu_seqlens -> (causal, window)
        self._agreed: OrderedDict = OrderedDict()  # (cu_seqlens, a call's mask, the placing mask) read alike

    def record(self, cu: tuple, causal: bool, window: int | None) -> None:
        """``ctx.shard`` places the documents ``cu`` by this mask (its window already cut to the documents); a batch
        it placed by another mask before, with other tokens, is refused: its tensors would not line up."""
        if not self.depends:
            return
        mine = (bool(causal), window)
        placed = self._placed.setdefault(cu, mine)
        if placed != mine and not _same(self.pieces(cu, *placed), self.pieces(cu, *mine)):
            _refuse("ctx.shard", mine, placed, True)
        self._placed.move_to_end(cu)
        while len(self._placed) > KEEP:
            self._placed.popitem(last=False)

    def check(self, cu: tuple, causal: bool, window: int | None, caller: str, planned_window: int | None) -> None:
        """``caller``'s mask places ``cu``'s tokens as the recorded shard did (or, none recorded, as the plan's own
        mask, whose window cut to these documents is ``planned_window``), else a PlanError naming the field."""
        mine = (bool(causal), window)
        placed = self._placed.get(cu, (self.planned_causal, planned_window))
        key = (cu, mine, placed)
        if not self.depends or key in self._agreed:
            return
        if placed != mine and not _same(self.pieces(cu, *placed), self.pieces(cu, *mine)):
            _refuse(caller, mine, placed, cu in self._placed)
        self._agreed[key] = True
        while len(self._agreed) > KEEP:
            self._agreed.popitem(last=False)


def _refuse(caller: str, mine: tuple, placed: tuple, recorded: bool) -> None:
    """The error of a call whose mask places the balanced layout's tokens otherwise than the batch's shard."""
    field = "window" if mine[1] != placed[1] else "causal"
    by = "ctx.shard placed" if recorded else "the plan's mask places"
    raise PlanError(field, f"{caller} with a {describe(*mine)} mask lays the balanced layout's tokens out as that mask "
                    f"places them, and {by} this batch's documents by a {describe(*placed)} mask: the layout "
                    "assigns documents to ranks by their work under the mask, so ranks would read other tokens than "
                    "they hold", "pass ctx.shard, ctx.attention and ctx.gather the same causal and window (layers "
                    "that mix windows or masks need a zigzag, striped or contiguous plan, which place by the "
                    "documents alone)")


def _same(a: dict, b: dict) -> bool:
    """Two placements (rank -> global tokens) hold the same tokens on every rank, in the same order."""
    return a.keys() == b.keys() and all(np.array_equal(a[r], b[r]) for r in a)
