"""Which mask placed a batch's packed documents, so that ``ctx.attention`` and ``ctx.gather`` read the tokens as
``ctx.shard`` laid them out.

A ``balanced`` layout assigns packed documents to ranks by their attention work, and the work depends on the mask:
causal or not, and the window. A shard placed by one mask and an attention that lays the same documents out by
another can hold the same token counts on every rank and still pair queries with the wrong keys, a wrong result with
no error. ``ctx.shard`` records the mask it placed each batch's documents by (the latest ``KEEP`` batches).
``ctx.attention``, ``ctx.gather`` and a second ``ctx.shard`` of the batch check that their mask places the tokens
alike; for documents no ``ctx.shard`` of this context placed, the check is against the plan's own mask. The other
layouts place tokens by the documents alone, so any mask reads them. A sequence ``ctx.shard`` laid out whole,
without documents, and then read per document is checked too: zigzag per document and zigzag over the whole
sequence give a rank the same count and other tokens.
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

    def __init__(self, token_layout: str, pieces: Pieces, planned_causal: bool, whole: Callable[[int], dict]):
        self.token_layout = token_layout
        self.depends = token_layout == "balanced"  # the only layout whose placement reads the mask
        self.pieces = pieces
        self.whole = whole  # sequence length -> each rank's tokens laid out over the whole sequence (no documents)
        self.planned_causal = planned_causal  # the plan's own mask (its window is cut to each batch's documents)
        self._placed: OrderedDict = OrderedDict()  # cu_seqlens -> (causal, window)
        self._unpacked: OrderedDict = OrderedDict()  # lengths ctx.shard placed without cu_seqlens
        self._agreed: OrderedDict = OrderedDict()  # (cu_seqlens, a call's mask, the placing mask) read alike

    def wants(self, end: int) -> bool:
        """Whether a call with documents ending at ``end`` has anything to check (``check``): a balanced layout, or
        a sequence of that length sharded without documents."""
        return self.depends or end in self._unpacked

    def record_unpacked(self, seq_len: int) -> None:
        """``ctx.shard`` placed a sequence of ``seq_len`` tokens without cu_seqlens (over the whole sequence)."""
        _remember(self._unpacked, seq_len, True)

    def record(self, cu: tuple, causal: bool, window: int | None) -> None:
        """``ctx.shard`` places the documents ``cu`` by this mask (its window already cut to the documents); a batch
        it placed by another mask before, with other tokens, is refused: its tensors would not line up."""
        if not self.depends:
            return
        mine = (bool(causal), window)
        placed = self._placed.get(cu, mine)
        if placed != mine and not _same(self.pieces(cu, *placed), self.pieces(cu, *mine)):
            _refuse("ctx.shard", mine, placed, True)
        _remember(self._placed, cu, placed)

    def check(self, cu: tuple, causal: bool, window: int | None, caller: str, planned_window: int | None) -> None:
        """``caller``'s mask places ``cu``'s tokens as the recorded shard did (or, none recorded, as the plan's own
        mask, whose window cut to these documents is ``planned_window``), else a PlanError naming the field."""
        mine = (bool(causal), window)
        if cu not in self._placed and cu[-1] in self._unpacked:
            self._check_unpacked(cu, mine, caller)
            return
        placed = self._placed.get(cu, (self.planned_causal, planned_window))
        key = (cu, mine, placed)
        if not self.depends or key in self._agreed:
            return
        if placed != mine and not _same(self.pieces(cu, *placed), self.pieces(cu, *mine)):
            _refuse(caller, mine, placed, cu in self._placed)
        _remember(self._agreed, key, True)

    def _check_unpacked(self, cu: tuple, mine: tuple, caller: str) -> None:
        """Documents ``cu`` read per document where ``ctx.shard`` laid their sequence out whole: the same tokens
        for contiguous and striped, others for zigzag (per document, or over the whole sequence)."""
        key = (cu, mine, "whole")
        if key in self._agreed:
            return
        if not _same(self.whole(cu[-1]), self.pieces(cu, *mine)):
            raise PlanError("cu_seqlens", f"{caller} reads packed documents laid out per document, and ctx.shard "
                            f"placed this sequence of {cu[-1]:,} tokens without cu_seqlens, {self.token_layout} over "
                            "the whole sequence: ranks would read other tokens than they hold",
                            "pass ctx.shard (and ctx.gather) the batch's cu_seqlens and window, as ctx.attention")
        _remember(self._agreed, key, True)


def _remember(kept: OrderedDict, key, value) -> None:
    """``kept[key] = value`` as the latest of at most ``KEEP``."""
    kept[key] = value
    kept.move_to_end(key)
    while len(kept) > KEEP:
        kept.popitem(last=False)


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
