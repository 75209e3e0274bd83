"""Which mask placed a batch's packed documents, so that ``ctx.attention`` and ``ctx.gather`` read the tokens as
``ctx.shard`` laid them out.

A ``balanced`` layout assigns packed documents to ranks by their attention work, and the work depends on the mask:
causal or not, and the window. A shard placed by one mask and an attention that lays the same documents out by
another can hold the same token counts on every rank and still pair queries with the wrong keys, a wrong result with
no error. ``ctx.shard`` records the mask it placed each batch's documents by (the latest ``KEEP`` batches).
``ctx.attention``, ``ctx.gather`` and a second ``ctx.shard`` of the batch check that their mask places the tokens
alike; documents no ``ctx.shard`` of this context placed are checked against its latest shard of a sequence of
that length, else against the plan's own mask. The other
layouts place tokens by the documents alone, so any mask reads them. A sequence read with other documents than
its shard (none where it was sharded whole, some where it was sharded per document, or another pack's) is checked
too: zigzag places each otherwise, at the same count a rank.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable

import numpy as np

from sp_plan.planner.errors import PlanError

#: batches whose placing mask is remembered (a few small tuples each): a training step shards one batch and its
#: layers then read it, or shards every micro-batch of a pipeline ahead of their attention (hundreds of them)
KEEP = 1024

#: (cu_seqlens, causal, window) -> the tokens each rank of the sequence group holds, by rank
Pieces = Callable[[tuple, bool, "int | None"], dict]


def describe(causal: bool, window: int | None) -> str:
    """A mask in words: "causal, window 5", "bidirectional, no window"."""
    return f"{'causal' if causal else 'bidirectional'}, {'no window' if window is None else f'window {window}'}"


class Placements:
    """How ``ctx.shard`` placed recent batches, and the checks that a call reads the tokens where they are."""

    def __init__(self, token_layout: str, pieces: Pieces, planned_causal: bool, whole: Callable[[int], dict]):
        self.token_layout = token_layout
        self.depends = token_layout == "balanced"  # the only layout whose placement reads the mask
        self.pieces = pieces
        self.whole = whole  # sequence length -> each rank's tokens laid out over the whole sequence (no documents)
        self.planned_causal = planned_causal  # the plan's own mask (its window is cut to each batch's documents)
        self._placed: OrderedDict = OrderedDict()  # cu_seqlens -> the (causal, window) ctx.shard placed them by
        self._latest: OrderedDict = OrderedDict()  # sequence length -> the cu_seqlens of its latest shard (None: none)
        self._agreed: OrderedDict = OrderedDict()  # (a call, what it was checked against): read alike
        self.version = 0  # counts the shards recorded: a call checked at one version is still right at it

    def wants(self, end: int) -> bool:
        """Whether a call whose sequence ends at ``end`` has anything to check: a balanced layout, or a shard of a
        sequence of that length."""
        return self.depends or end in self._latest

    def record_whole(self, seq_len: int) -> None:
        """``ctx.shard`` laid a sequence of ``seq_len`` tokens out whole, without documents."""
        remember(self._latest, seq_len, None)
        self.version += 1

    def record(self, cu: tuple, causal: bool, window: int | None) -> None:
        """``ctx.shard`` places the documents ``cu`` by this mask (its window already cut to the documents); a batch
        it placed by another mask before, with other tokens, is refused: its tensors would not line up."""
        mine = (bool(causal), window)
        placed = self._placed.get(cu, mine)
        if self.depends and placed != mine and not _same(self.pieces(cu, *placed), self.pieces(cu, *mine)):
            _refuse("ctx.shard", mine, placed, "ctx.shard placed")
        remember(self._placed, cu, placed)
        remember(self._latest, cu[-1], cu)
        self.version += 1

    def check(self, cu: tuple, causal: bool, window: int | None, caller: str, planned_window: int | None) -> None:
        """``caller`` reads the documents ``cu`` where ``ctx.shard`` put them: by their own shard's mask, else as
        the latest shard of a sequence of that length placed it (whole, or other documents), else as the plan's
        own mask places them (``planned_window``: its window cut to these documents); a PlanError naming the
        field otherwise."""
        mine = (bool(causal), window)
        if cu in self._placed:
            theirs, by = (cu, self._placed[cu]), "ctx.shard placed"
        elif cu[-1] in self._latest:
            other = self._latest[cu[-1]]
            theirs, by = (other, self._placed.get(other)), "ctx.shard placed"
        else:
            theirs, by = (cu, (self.planned_causal, planned_window)), "the plan's mask places"
        other, mask = theirs
        key = (cu, mine, theirs)
        if key in self._agreed or (other == cu and (mask == mine or not self.depends)):
            return
        if other is not None and mask is None:  # that shard's record is gone: nothing to compare with
            return
        held = self.whole(cu[-1]) if other is None else self.pieces(other, *mask)
        if not _same(held, self.pieces(cu, *mine)):
            if other != cu:
                _refuse_documents(caller, cu[-1], other, self.token_layout)
            _refuse(caller, mine, mask, by)
        remember(self._agreed, key, True)

    def check_length(self, local: int, ranks: int, caller: str, field: str = "q") -> None:
        """``caller``'s shards of ``local`` tokens on each of ``ranks`` make a sequence ``ctx.shard`` placed: refused
        where it placed sequences and none of that length (shards of SDPA's (batch, heads, seq, head dim) layout,
        or the full tensors where shards were meant, which would run as a longer sequence, with no error)."""
        if not self._latest or local * ranks in self._latest:
            return
        placed = ", ".join(f"{n:,}" for n in sorted(self._latest)[:4]) + (", ..." if len(self._latest) > 4 else "")
        fix = ("pass each rank's shards of q, k and v (ctx.shard of the full tensors on dim 1), in (batch, local seq, "
               "heads, head dim); from SDPA's (batch, heads, seq, head dim), transpose(1, 2) first" if field == "q"
               else f"pass this rank's shard ({field} as ctx.shard or ctx.attention gave it), not the full tensor")
        raise PlanError(field, f"{caller} reads {local:,} tokens a rank, a sequence of {local * ranks:,} over {ranks} "
                        f"ranks, and ctx.shard placed sequences of {placed} tokens", fix)

    def check_whole(self, seq_len: int, caller: str) -> None:
        """``caller`` reads a sequence of ``seq_len`` tokens whole, without documents: refused where ``ctx.shard``
        last placed a sequence of that length per document, elsewhere than a whole layout puts its tokens."""
        cu = self._latest.get(seq_len)
        key = (seq_len, cu)
        if cu is None or cu not in self._placed or key in self._agreed:
            return
        if not _same(self.whole(seq_len), self.pieces(cu, *self._placed[cu])):
            raise PlanError("cu_seqlens", f"{caller} reads a sequence of {seq_len:,} tokens without cu_seqlens, and "
                            f"ctx.shard placed it per document ({self.token_layout}, with cu_seqlens): ranks would "
                            "read other tokens than they hold", "pass it the cu_seqlens ctx.shard was given")
        remember(self._agreed, key, True)


def remember(kept: OrderedDict, key, value) -> None:
    """``kept[key] = value`` as the latest of at most ``KEEP``."""
    kept[key] = value
    kept.move_to_end(key)
    while len(kept) > KEEP:
        kept.popitem(last=False)


#: what to do when a read's mask places a balanced batch otherwise than its shard, by the field that differs
FIXES = {"window": "pass ctx.shard, ctx.attention and ctx.gather the same window (the transformers integration: "
                   "shard_inputs(..., window=)); layers that mix windows need a zigzag, striped or contiguous plan, "
                   "which place by the documents alone",
         "causal": "pass ctx.shard, ctx.attention and ctx.gather the same causal, or make the plan for the model's "
                   "mask (sp-plan plan --no-causal for a bidirectional model)"}


def _refuse(caller: str, mine: tuple, placed: tuple, by: str) -> None:
    """The error of a call whose mask places the balanced layout's tokens otherwise than the batch's shard."""
    field = "window" if mine[1] != placed[1] else "causal"
    raise PlanError(field, f"{caller} with a {describe(*mine)} mask lays the balanced layout's tokens out as that "
                    f"mask places them, and {by} this batch's documents by a {describe(*placed)} mask: the layout "
                    "assigns documents to ranks by their work under the mask, so ranks would read other tokens than "
                    "they hold", FIXES[field])


def _refuse_documents(caller: str, seq_len: int, placed, token_layout: str) -> None:
    """The error of a call whose documents are laid out otherwise than the shard of its sequence."""
    how = "without cu_seqlens, whole" if placed is None else "with other cu_seqlens"
    raise PlanError("cu_seqlens", f"{caller} reads packed documents laid out per document, and ctx.shard placed "
                    f"this sequence of {seq_len:,} tokens {how} ({token_layout}): ranks would read other tokens than "
                    "they hold", "pass ctx.shard, ctx.attention and ctx.gather the batch's same cu_seqlens")


def _same(a: dict, b: dict) -> bool:
    """Two placements (rank -> global tokens) hold the same tokens on every rank, in the same order."""
    return a.keys() == b.keys() and all(np.array_equal(a[r], b[r]) for r in a)
