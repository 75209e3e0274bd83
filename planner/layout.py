"""Rank arithmetic and token permutations, shared by the planner and the runtime.

A layout is a mesh of named dimensions listed innermost (fastest-varying rank) first.
For degrees {"ulysses": 2, "ring": 2, "dp": 2} and order ["ulysses", "ring", "dp"],
rank = u + 2 * r + 4 * d.

Token layouts split a sequence of ``seq_len`` tokens over the ``ring`` ranks of a ring:
- contiguous: rank r holds tokens [r*S/P, (r+1)*S/P);
- zigzag: 2P chunks, rank r holds chunks r and 2P-1-r (WallFacer, USP Algorithm 2);
- striped: token t on rank t mod P (Striped Attention, Sec. 3).
With Ulysses inside (USP), each ring rank's token list is split contiguously over the ulysses
ranks, so the Ulysses all-to-all hands every ring rank exactly its ring-level tokens in order.

With documents (a sequence's ``cu_seqlens``), the token layout is a balancing policy (``document_ring_tokens``):
contiguous as above; zigzag per document (each document's 2P chunks, Megatron's THD layout without its padding
to a multiple of 2P); striped per document; ``balanced``, a greedy assignment of documents and zigzag chunk pairs
to ranks by their work, tokens per rank within BALANCED_TOKEN_BOUND x S/P. Local lengths may differ between ranks.

WallFacer (Liu et al. 2024, Sec. 3.3) splits a ring of P into P/C teams of C and C x P/C^2
sub-rings of P/C^2 (``team_position`` and below); the token layout stays the ring's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from itertools import groupby
from math import prod

import numpy as np

from .errors import PlanError

DIMENSIONS = ("tp", "ulysses", "ring", "team", "dp", "pp")
TOKEN_LAYOUTS = ("contiguous", "zigzag", "striped")
#: token layouts of a sequence with documents: TOKEN_LAYOUTS per document, and a greedy assignment by work
BALANCE_POLICIES = TOKEN_LAYOUTS + ("balanced",)
#: ``balanced`` keeps each rank's tokens within this factor of S/P (the linear layers' memory follows the tokens)
BALANCED_TOKEN_BOUND = 1.1
#: ``balanced`` cuts a document into P zigzag chunk pairs when its work is over this share of a rank's mean work
BALANCED_SPLIT_SHARE = 0.1
#: WallFacer eq. 8: teams inside a node (collective_intra) or sub-rings inside a node (p2p_intra)
PLACEMENTS = ("collective_intra", "p2p_intra")
#: dimensions that split the sequence; their product is the sequence-parallel degree.
SEQUENCE_DIMS = ("ulysses", "ring")


def merged_name(dims: tuple[str, ...]) -> str:
    """The name a group over several dimensions goes by in a breakdown ('ulyssesxringxdp'); ``Layout.groups`` reads
    it back."""
    return "x".join(dims)


def check_degrees(degrees: dict[str, int], order: list[str]) -> None:
    """Validate names and values of degrees and that ``order`` lists each dimension once."""
    for name, size in degrees.items():
        if name not in DIMENSIONS:
            raise PlanError("degrees", f"unknown dimension {name!r}", f"use names from {list(DIMENSIONS)}")
        if not isinstance(size, int) or size < 1:
            raise PlanError(f"degrees.{name}", f"must be a positive integer, got {size!r}", "give a degree >= 1")
    if len(set(order)) != len(order):
        raise PlanError("order", f"repeats a dimension: {order}", "list each dimension once")
    for name in order:
        if name not in DIMENSIONS:
            raise PlanError("order", f"unknown dimension {name!r}", f"use names from {list(DIMENSIONS)}")
    missing = [n for n, s in degrees.items() if s > 1 and n not in order and n != "team"]
    if missing:
        raise PlanError("order", f"does not place dimension(s) {missing}", "add them to the mesh order (innermost first)")


def mesh_dims(degrees: dict[str, int], order: list[str]) -> list[tuple[str, int]]:
    """The mesh as (name, size) pairs, innermost first; the team of WallFacer lives inside ring."""
    return [(n, degrees.get(n, 1)) for n in order if n != "team"]


def world_size(degrees: dict[str, int]) -> int:
    """Ranks a layout needs: the product of all degrees (team is a factor of ring, not extra)."""
    return prod(s for n, s in degrees.items() if n != "team")


def strides(degrees: dict[str, int], order: list[str]) -> dict[str, int]:
    """Rank stride of each mesh dimension (innermost has stride 1)."""
    out, s = {}, 1
    for name, size in mesh_dims(degrees, order):
        out[name] = s
        s *= size
    return out


def coords(rank: int, degrees: dict[str, int], order: list[str]) -> dict[str, int]:
    """Mesh coordinate of ``rank`` along every dimension."""
    out = {}
    for name, size in mesh_dims(degrees, order):
        out[name] = rank % size
        rank //= size
    return out


def group_ranks(names: str | tuple[str, ...], degrees: dict[str, int], order: list[str]) -> list[list[int]]:
    """Every group of one dimension, or of several merged (e.g. ("ulysses", "ring") = sequence group).

    Inside a merged group ranks are ordered by the coordinates of ``names``, the first fastest.
    """
    if isinstance(names, str):
        names = (names,)
    st = strides(degrees, list(order))
    dims = mesh_dims(degrees, list(order))
    offs = _offsets([(n, degrees.get(n, 1)) for n in names if n in st], st)
    bases = _offsets([(n, s) for n, s in dims if n not in names], st)
    return sorted([b + o for o in offs] for b in bases)


def _offsets(chosen: list[tuple[str, int]], st: dict[str, int]) -> list[int]:
    """Rank offsets spanned by the dimensions in ``chosen``, the first varying fastest."""
    offs = [0]
    for n, s in chosen:
        offs = [o + i * st[n] for i in range(s) for o in offs]
    return offs


# ---------------------------------------------------------------- token permutations

def check_token_layout(token_layout: str) -> None:
    """A layout of a sequence without documents; ``balanced`` needs the documents' boundaries."""
    if token_layout == "balanced":
        raise PlanError("token_layout", "balanced assigns documents by their work, and needs their boundaries",
                        "pass the batch's cu_seqlens to ctx.shard, ctx.attention and ctx.gather, or use contiguous, "
                        "zigzag or striped")
    if token_layout not in TOKEN_LAYOUTS:
        raise PlanError("token_layout", f"unknown layout {token_layout!r}", f"use one of {list(TOKEN_LAYOUTS)}")


def check_balance_policy(token_layout: str) -> None:
    """A layout of a sequence with documents: one of BALANCE_POLICIES."""
    if token_layout not in BALANCE_POLICIES:
        raise PlanError("token_layout", f"unknown layout {token_layout!r}", f"use one of {list(BALANCE_POLICIES)}")


def chunks_needed(token_layout: str, ring: int, ulysses: int = 1) -> int:
    """How many equal parts the sequence must split into for this layout (seq_len % n == 0); ``balanced`` cuts
    nothing into equal parts (its ranks' lengths differ, ``document_ring_tokens``): 1."""
    if token_layout == "balanced":
        return 1
    check_token_layout(token_layout)
    per_ring = {"contiguous": 1, "zigzag": 2, "striped": 1}[token_layout]
    return ring * per_ring * ulysses


@lru_cache(maxsize=256)
def _ring_tokens(token_layout: str, ring: int, seq_len: int) -> np.ndarray:
    if token_layout == "contiguous":
        return np.arange(seq_len).reshape(ring, seq_len // ring)
    if token_layout == "zigzag":
        c = np.arange(seq_len).reshape(2 * ring, seq_len // (2 * ring))
        return np.stack([np.concatenate([c[r], c[2 * ring - 1 - r]]) for r in range(ring)])
    # striped: token t on rank t mod P
    return np.arange(seq_len).reshape(seq_len // ring, ring).T.copy()


def ring_tokens(token_layout: str, ring: int, seq_len: int) -> np.ndarray:
    """(ring, seq_len // ring) global token indices of each ring rank, in local order."""
    check_token_layout(token_layout)
    need = chunks_needed(token_layout, ring)
    if seq_len % need:
        raise PlanError("seq_len", f"{seq_len} is not divisible by {need} ({token_layout} over ring {ring})",
                        f"use a sequence length that is a multiple of {need}")
    out = _ring_tokens(token_layout, ring, seq_len)
    out.flags.writeable = False
    return out


def sp_tokens(token_layout: str, ulysses: int, ring: int, seq_len: int) -> np.ndarray:
    """(ring, ulysses, seq_len // (ring*ulysses)) tokens of sequence rank (u, r): USP Algorithm 2.

    Ring rank r's token list (``ring_tokens``) is cut into ``ulysses`` contiguous pieces; piece u
    lives on the rank with ulysses coordinate u. The Ulysses all-to-all concatenates the pieces.
    """
    need = chunks_needed(token_layout, ring, ulysses)
    if seq_len % need:
        raise PlanError("seq_len", f"{seq_len} is not divisible by {need} ({token_layout}, ring {ring} x ulysses {ulysses})",
                        f"use a sequence length that is a multiple of {need}")
    rt = ring_tokens(token_layout, ring, seq_len)
    return rt.reshape(ring, ulysses, seq_len // (ring * ulysses))


# ---------------------------------------------------------------- token permutations with documents

def document_bounds(cu_seqlens) -> np.ndarray:
    """``cu_seqlens`` as int64, checked: 0, then non-decreasing document ends, at least one token in all. An empty
    document (a repeated end, as flash-attn's varlen kernels take them, e.g. a fixed-size cu_seqlens padded with its
    last value) holds no token and is dropped."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    if cu.ndim != 1 or len(cu) < 2 or cu[0] != 0 or np.any(np.diff(cu) < 0) or cu[-1] < 1:
        raise PlanError("cu_seqlens", f"{cu.tolist()[:8]}{'...' if len(cu) > 8 else ''} is not 0 then "
                        "non-decreasing document ends", "give document boundaries as flash-attn's varlen "
                        "cu_seqlens: 0, then the end of each document")
    steps = np.diff(cu) > 0
    return cu if steps.all() else cu[np.concatenate(([True], steps))]


def _even_pieces(n: int, parts: int) -> np.ndarray:
    """Sizes of ``parts`` contiguous pieces of n tokens, the first n mod parts one longer (numpy.array_split)."""
    q, rem = divmod(n, parts)
    out = np.full(parts, q, dtype=np.int64)
    out[:rem] += 1
    return out


def _contiguous(seq_len: int, ring: int) -> list[np.ndarray]:
    """Rank r holds the r-th of P contiguous pieces of the sequence, whatever its documents."""
    ends = np.cumsum(_even_pieces(seq_len, ring))
    return [np.arange(e - n, e) for e, n in zip(ends, _even_pieces(seq_len, ring))]


def _striped(seq_len: int, ring: int) -> list[np.ndarray]:
    """Token t on rank t mod P: every document's tokens go round the ranks from where the last one stopped, so each
    document is striped and the ranks' counts differ by at most one."""
    return [np.arange(r, seq_len, ring) for r in range(ring)]


def _zigzag_extras(remainders, ring: int) -> tuple[np.ndarray, np.ndarray]:
    """Where each document's L mod 2P tokens over L // 2P per chunk go: one per rank, to the ranks holding fewest
    tokens so far, a first extra on chunk r, a second (more than P over) on chunk 2P-1-r, so every rank's count
    stays within one of the others' without padding a document to a multiple of 2P. The ranks holding fewest are
    the next ones round the ring from where the extras last stopped (ties: the lowest rank first), so the e-th extra
    of the sequence goes to rank e mod P. Returns (document, chunk) index arrays of the extra tokens."""
    rem = np.asarray(remainders, dtype=np.int64)
    doc = np.repeat(np.arange(len(rem)), rem)
    e = np.arange(len(doc))
    j = e - np.repeat(np.cumsum(rem) - rem, rem)  # the extra's place in its document
    rank = e % ring
    return doc, np.where(j < ring, rank, 2 * ring - 1 - rank)


def _zigzag_sizes(cu: np.ndarray, ring: int) -> tuple[np.ndarray, np.ndarray]:
    """(documents x 2P chunk sizes, the rank of each chunk) of the per-document zigzag: L // 2P tokens a chunk and
    the extras (``_zigzag_extras``), rank r holding chunks r and 2P-1-r of every document."""
    q, rem = np.divmod(np.diff(cu), 2 * ring)
    sizes = np.repeat(q[:, None], 2 * ring, axis=1)
    docs, chunks = _zigzag_extras(rem, ring)
    sizes[docs, chunks] += 1  # a document's extras are on distinct chunks
    return sizes, np.concatenate([np.arange(ring), np.arange(ring)[::-1]])


def _zigzag_chunks(cu: np.ndarray, ring: int) -> tuple[np.ndarray, np.ndarray]:
    """The nonzero chunks of ``_zigzag_sizes`` without its documents x 2P matrix: (document x 2P + chunk, size) in
    token order. A document of at least 2P tokens has all 2P chunks; a shorter one only its extras, one token each,
    so there are at most S + 2P entries however many documents are shorter than 2P."""
    q, rem = np.divmod(np.diff(cu), 2 * ring)
    docs, chunks = _zigzag_extras(rem, ring)
    long = np.flatnonzero(q > 0)
    n = np.repeat(q[long], 2 * ring)
    in_long = q[docs] > 0
    n[np.searchsorted(long, docs[in_long]) * 2 * ring + chunks[in_long]] += 1  # a document's extras: distinct chunks
    key = np.concatenate([(long[:, None] * 2 * ring + np.arange(2 * ring)).ravel(),
                          docs[~in_long] * 2 * ring + chunks[~in_long]])
    if in_long.all():  # every document's rows in order already
        return key, n
    n = np.concatenate([n, np.ones(int((~in_long).sum()), dtype=np.int64)])
    order = np.argsort(key, kind="stable")
    return key[order], n[order]


def _zigzag(cu: np.ndarray, ring: int) -> np.ndarray:
    """Per-document zigzag, the rank of each token (``_zigzag_sizes``)."""
    sizes, chunk_rank = _zigzag_sizes(cu, ring)
    return np.repeat(np.tile(chunk_rank, len(sizes)), sizes.ravel())


def tokens_by_owner(owner: np.ndarray, ring: int) -> list[np.ndarray]:
    """Each rank's tokens in token order, from the rank that owns each token (a stable sort: O(S), not O(P S))."""
    order = np.argsort(owner.astype(np.int32 if ring > 32767 else np.int16), kind="stable")
    return np.split(order, np.cumsum(np.bincount(owner, minlength=ring))[:-1])


def work_prefix(weights, seq_len: int):
    """``work_before`` of per-token ``weights`` (``_balanced_runs``), checked: one weight per token."""
    if weights is None:
        raise PlanError("weights", "balanced assigns documents by their work, and was given none",
                        "pass each token's work (planner.masks.row_pairs)")
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (seq_len,):
        raise PlanError("weights", f"{w.shape} weights for a sequence of {seq_len} tokens", "give one per token")
    return np.concatenate([[0.0], np.cumsum(w)]).__getitem__


def _balanced(cu: np.ndarray, ring: int, weights, bound: float = BALANCED_TOKEN_BOUND) -> np.ndarray:
    """Greedy balancing by work (``_balanced_runs``), the rank of each token."""
    start, stop, rank = _balanced_runs(cu, ring, work_prefix(weights, int(cu[-1])), bound)
    return np.repeat(rank, stop - start)


def _balanced_runs(cu: np.ndarray, ring: int, work_before, bound: float = BALANCED_TOKEN_BOUND
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Greedy balancing by work (``balanced_parts``) as maximal runs (start, stop, rank) of one rank's tokens inside
    one document, in token order."""
    return parts_runs(cu, ring, balanced_parts(cu, ring, work_before, bound))


def parts_runs(cu: np.ndarray, ring: int, parts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_balanced_runs`` of the balancer's ``parts`` (``balanced_parts``: the spread documents, the placed runs)."""
    spread, placed = parts
    return _merge_runs(*_interleaved(spread_runs(cu, ring, spread), placed), cu)


def _interleaved(ordered: tuple[np.ndarray, ...], other: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """(start, stop, rank) of two sets of disjoint runs in token order: ``ordered`` already is (the spread documents'
    chunks, documents and chunks ascending), ``other`` (the few runs placed whole or poured) is sorted and slotted in
    by one binary search each, O(runs) instead of a sort of them all."""
    o = np.argsort(other[0], kind="stable")
    at = np.searchsorted(ordered[0], other[0][o]) + np.arange(len(o))  # their places among all the runs
    mine = np.ones(len(ordered[0]) + len(o), dtype=bool)
    mine[at] = False
    out = []
    for a, b in zip(ordered, other):
        x = np.empty(len(mine), dtype=np.int64)
        x[mine], x[at] = a, b[o]
        out.append(x)
    return tuple(out)


def spread_runs(cu: np.ndarray, ring: int, spread: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, stop, rank) of the 2P zigzag chunks of each document ``balanced`` spreads: _even_pieces of it, chunk k
    on rank (k + d) mod P and chunk 2P-1-k on the same, d the document's index."""
    if not len(spread):
        return tuple(np.zeros(0, dtype=np.int64) for _ in range(3))
    chunk_rank = np.concatenate([np.arange(ring), np.arange(ring)[::-1]])
    sizes = spread_sizes(cu, ring, spread)
    stop = cu[spread][:, None] + np.cumsum(sizes, axis=1)
    return (stop - sizes).ravel(), stop.ravel(), ((chunk_rank[None, :] + spread[:, None]) % ring).ravel()


def spread_sizes(cu: np.ndarray, ring: int, spread: np.ndarray) -> np.ndarray:
    """(documents, 2P) chunk sizes of the documents ``balanced`` spreads (``_even_pieces`` of each)."""
    q, rem = np.divmod(cu[spread + 1] - cu[spread], 2 * ring)
    return q[:, None] + (np.arange(2 * ring)[None, :] < rem[:, None])


def balanced_parts(cu: np.ndarray, ring: int, work_before, bound: float = BALANCED_TOKEN_BOUND, spread_loads=None
                   ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Greedy balancing by work: (the documents spread as zigzag, the (start, stop, rank) runs of the others).
    ``work_before`` maps int64 positions x to the work (float64) of tokens [0, x): a cumulative sum of per-token
    weights, or a closed form (planner.masks) that needs no per-token array. A document whose work is over
    BALANCED_SPLIT_SHARE of a rank's mean is spread as zigzag (2P chunks; rank r holds chunks r and 2P-1-r, rotated
    by the document's index so no rank always gets the longer chunks: ``spread_runs``): even work under a causal
    mask. The other documents go whole, heaviest first (longest processing time), to the least-loaded rank with room
    for their tokens under ``bound`` x S/P; a document no rank has room for is poured, in token order, into the
    least-loaded ranks' room. ``spread_loads(cu, ring, spread)``: the spread documents' (work, tokens) per rank
    where the caller counts them in closed form (planner.masks.spread_loads), else read from ``work_before``."""
    seq_len = int(cu[-1])
    cap = max(-(-seq_len // ring), int(bound * seq_len / ring))
    starts, ends = cu[:-1], cu[1:]
    doc_work = work_before(ends) - work_before(starts)
    spread = np.flatnonzero((doc_work > BALANCED_SPLIT_SHARE * work_before(cu[-1:])[0] / ring)
                            & (ends - starts >= 2 * ring))
    load, held = _spread_loads(cu, ring, spread, work_before) if spread_loads is None else spread_loads(cu, ring, spread)
    whole = np.setdiff1d(np.arange(len(starts)), spread)
    order = whole[np.lexsort((whole, -doc_work[whole]))]  # heaviest first, ties by index
    return spread, _place_whole(order, starts.tolist(), ends.tolist(), doc_work.tolist(), work_before, load, held,
                                cap)


def _spread_loads(cu: np.ndarray, ring: int, spread: np.ndarray, work_before) -> tuple[np.ndarray, np.ndarray]:
    """(work, tokens) each rank holds of the spread documents (``spread_runs``), float64 and int64: the work read at
    each chunk boundary once (a chunk's stop is the next one's start), summed per rank in the runs' order (exact:
    integer work)."""
    chunk_rank = np.concatenate([np.arange(ring), np.arange(ring)[::-1]])
    sizes = spread_sizes(cu, ring, spread)
    ends = cu[spread][:, None] + np.concatenate([np.zeros((len(spread), 1), dtype=np.int64),
                                                 np.cumsum(sizes, axis=1)], axis=1)
    w = work_before(ends.ravel()).reshape(ends.shape)
    rank = ((chunk_rank[None, :] + spread[:, None]) % ring).ravel()
    load = np.bincount(rank, weights=(w[:, 1:] - w[:, :-1]).ravel(), minlength=ring).astype(np.float64)
    return load, np.bincount(rank, weights=sizes.ravel(), minlength=ring).astype(np.int64)


def _merge_runs(start, stop, rank, cu: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Runs in token order (sorted by start), each joined to the one before where it goes on with the same rank in the
    same document (``owner_runs``' maximal runs)."""
    new = np.ones(len(start), dtype=bool)
    new[1:] = rank[1:] != rank[:-1]
    at = np.minimum(np.searchsorted(start, cu[:-1]), len(start) - 1)  # one binary search a document, not a run
    new[at[start[at] == cu[:-1]]] = True  # a document's first run
    first = np.flatnonzero(new)
    return start[first], np.append(start[first[1:]], stop[-1]), rank[first]


def _sorted_union(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Sorted distinct values of two sorted int64 arrays (numpy.union1d's result; a stable sort merges the two runs
    in one pass)."""
    out = np.sort(np.concatenate([a, b]), kind="stable")
    keep = np.ones(len(out), dtype=bool)
    keep[1:] = out[1:] != out[:-1]
    return out[keep]


def _place_whole(order, starts, ends, doc_work, work_before, load: np.ndarray, held: np.ndarray, cap: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_balanced_runs``' longest-processing-time pass: each document (in ``order``) to the least-loaded rank with
    room (ties: the lowest rank); where none has room, its tokens poured in order into the least-loaded ranks' room
    (``load`` and ``held``: each rank's so far). The ranks with room wait in a queue sorted by (load, rank)
    (``_RoomQueue``): a rank that fills up leaves it for good, so a ring of many ranks with a few tokens of room
    each is not searched rank by rank for every document. Returns the (start, stop, rank) runs placed, in the
    order placed."""
    queue = _RoomQueue(load, held, cap)
    out: tuple[list, list, list] = ([], [], [])  # runs placed: arrays, with the whole documents' pending in whole
    whole: tuple[list, list, list] = ([], [], [])
    for d in order.tolist():
        start, end = starts[d], ends[d]
        i = queue.first_with_room(end - start)
        if i < 0:
            for o, w, x in zip(out, whole, _pour(start, end, work_before, queue)):
                o += [np.array(w, dtype=np.int64), x]
                w.clear()
            continue
        x, r, room = queue.remove(i)
        for w, v in zip(whole, (start, end, r)):
            w.append(v)
        if room > end - start:
            queue.insert(x + doc_work[d], r, room - (end - start))
    return tuple(np.concatenate(o + [np.array(w, dtype=np.int64)]) for o, w in zip(out, whole))


class _RoomQueue:
    """The ranks with room for at least one more token, sorted by (load, rank), with their room: the loads, and the
    ranks and rooms as the two rows of one array, in a buffer whose live part starts at ``head`` (a removal shifts
    the part before it right, an insertion the part before its place left, so each moves only the entries it
    passes; the least-loaded rank comes and goes without a shift)."""

    def __init__(self, load: np.ndarray, held: np.ndarray, cap: int):
        room = cap - held
        rank = np.flatnonzero(room > 0)
        by_load = load[rank]
        order = np.lexsort((rank, by_load))
        self.load, self.ranks = by_load[order], np.stack([rank[order], room[rank][order]])
        self.rank, self.room = self.ranks  # views of the rows
        self.head = 0

    def __len__(self) -> int:
        return len(self.rank) - self.head

    def first_with_room(self, n: int) -> int:
        """Position (from the head) of the least-loaded rank with room for ``n`` tokens, or -1 if none has."""
        h = self.head
        if h == len(self.rank):
            return -1
        if self.room[h] >= n:
            return 0
        fits = self.room[h:] >= n
        i = int(fits.argmax())
        return i if fits[i] else -1

    def remove(self, i: int) -> tuple[float, int, int]:
        """Take out the rank at position ``i``; returns its (load, rank, room)."""
        h = self.head
        out = float(self.load[h + i]), int(self.rank[h + i]), int(self.room[h + i])
        if i:
            self.load[h + 1:h + i + 1] = self.load[h:h + i]
            self.ranks[:, h + 1:h + i + 1] = self.ranks[:, h:h + i]
        self.head = h + 1
        return out

    def drop(self, k: int) -> None:
        """Take out the first ``k`` ranks."""
        self.head += k

    def insert(self, load: float, rank: int, room: int) -> None:
        """Put ``rank`` back with its new load and room, in (load, rank) order (after a removal: the head has a slot
        free before it)."""
        h = self.head
        live = self.load[h:]
        pos = int(live.searchsorted(load, "right"))
        if pos and live[pos - 1] == load:  # ties: by rank among the equal loads
            lo = int(live.searchsorted(load, "left"))
            pos = lo + int(self.rank[h + lo:h + pos].searchsorted(rank))
        if pos:
            self.load[h - 1:h - 1 + pos] = live[:pos]
            self.ranks[:, h - 1:h - 1 + pos] = self.ranks[:, h:h + pos]
        self.load[h - 1 + pos] = load
        self.ranks[:, h - 1 + pos] = (rank, room)
        self.head = h - 1


def _pour(start: int, end: int, work_before, queue: _RoomQueue) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A document no rank has room for, its tokens in order into the least-loaded ranks' room (ties: the lowest
    rank), each rank filled before the next; ``queue`` updated. The ranks it fills are a prefix of the queue, each
    with room for at least one token, so at most its length of them; those it fills up leave the queue, so only the
    last one's work is read (to put it back by its load). Returns its (start, stop, rank) runs."""
    h, n = queue.head, end - start
    filled = queue.room[h:h + min(n, len(queue))].cumsum()
    used = min(int(filled.searchsorted(n)) + 1, len(filled))  # ranks until the document is poured
    if not used:  # no rank has room left
        return tuple(np.zeros(0, dtype=np.int64) for _ in range(3))
    stops = start + filled[:used]
    stops[-1] = min(stops[-1], end)  # the last takes what is left
    firsts = np.concatenate([[start], stops[:-1]])
    ranks = queue.rank[h:h + used].copy()
    load, left = float(queue.load[h + used - 1]), int(filled[used - 1]) - n
    queue.drop(used)
    if left > 0:  # the last rank keeps some room
        w = work_before(np.array([firsts[-1], stops[-1]], dtype=np.int64))
        queue.insert(load + (w[1] - w[0]), int(ranks[-1]), left)
    return firsts, stops, ranks


def local_token_range(token_layout: str, ring: int, ulysses: int, seq_len: int) -> tuple[int, int] | None:
    """The fewest and most of ``seq_len`` tokens one of ring x ulysses ranks holds under a balancing policy: ring
    members within one token of each other (contiguous, zigzag and striped, per document or not), each cut evenly
    over its ulysses ranks (``numpy.array_split``), so floor and ceiling of S/R, then of those over U. None where the
    policy bounds only the most (``balanced`` over more than one ring member)."""
    if token_layout == "balanced" and ring > 1:
        return None
    lo, hi = seq_len // ring, -(-seq_len // ring)
    return lo // ulysses, -(-hi // ulysses)


def document_ring_tokens(token_layout: str, ring: int, cu_seqlens, weights=None) -> list[np.ndarray]:
    """Global token indices each of ``ring`` ranks holds of one sequence whose documents end at ``cu_seqlens``, in
    local (token) order; ``weights`` (each token's work) only for ``balanced``. A single document whose length
    ``ring_tokens`` accepts gives its tokens exactly."""
    check_balance_policy(token_layout)
    cu = document_bounds(cu_seqlens)
    if token_layout == "contiguous":
        return _contiguous(int(cu[-1]), ring)
    if token_layout == "striped":
        return _striped(int(cu[-1]), ring)
    return tokens_by_owner(document_owners(token_layout, ring, cu, weights), ring)


def owner_runs(owner: np.ndarray, cu: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Maximal runs of one rank's tokens inside one document: (start, stop, rank)."""
    S = len(owner)
    cut = np.zeros(S + 1, dtype=bool)
    cut[[0, S]] = True
    cut[1:S] = owner[1:] != owner[:-1]
    cut[cu] = True
    b = np.flatnonzero(cut)
    return b[:-1], b[1:], owner[b[:-1]]


def document_runs(token_layout: str, ring: int, cu_seqlens, weights=None, work_before=None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, stop, rank) of intervals of one rank's tokens inside one document, in token order, covering the
    sequence under a balancing policy (``document_owners``): contiguous, zigzag and balanced without a per-token
    array (balanced from ``work_before``, the work of the tokens before a position, if given, else from ``weights``),
    striped from its owners."""
    cu = document_bounds(cu_seqlens)
    check_balance_policy(token_layout)
    if token_layout == "contiguous":
        ends = np.cumsum(_even_pieces(int(cu[-1]), ring))
        bounds = _sorted_union(cu, ends)
        return bounds[:-1], bounds[1:], np.searchsorted(ends, bounds[:-1], side="right")
    if token_layout == "zigzag":
        chunk, n = _zigzag_chunks(cu, ring)
        stop = np.cumsum(n)
        return stop - n, stop, np.concatenate([np.arange(ring), np.arange(ring)[::-1]])[chunk % (2 * ring)]
    if token_layout == "balanced":
        return _balanced_runs(cu, ring, work_prefix(weights, int(cu[-1])) if work_before is None else work_before)
    return owner_runs(document_owners(token_layout, ring, cu, weights), cu)


def document_owners(token_layout: str, ring: int, cu_seqlens, weights=None) -> np.ndarray:
    """(S,) int64: the ring rank holding each token under a balancing policy (``document_ring_tokens``' inverse)."""
    check_balance_policy(token_layout)
    cu = document_bounds(cu_seqlens)
    S = int(cu[-1])
    if token_layout == "contiguous":
        return np.repeat(np.arange(ring, dtype=np.int64), _even_pieces(S, ring))
    if token_layout == "striped":
        return np.arange(S, dtype=np.int64) % ring
    return _zigzag(cu, ring) if token_layout == "zigzag" else _balanced(cu, ring, weights)


def document_sp_tokens(token_layout: str, ulysses: int, ring: int, cu_seqlens, weights=None
                       ) -> list[list[np.ndarray]]:
    """[ring rank][ulysses rank] tokens of one sequence with documents: each ring rank's tokens
    (``document_ring_tokens``) cut into ``ulysses`` contiguous pieces, as ``sp_tokens``."""
    out = []
    for t in document_ring_tokens(token_layout, ring, cu_seqlens, weights):
        ends = np.cumsum(_even_pieces(len(t), ulysses))
        out.append([t[e - n:e] for e, n in zip(ends, _even_pieces(len(t), ulysses))])
    return out


@dataclass(frozen=True)
class Layout:
    """Everything a rank needs to know about a plan's placement: groups and its tokens."""

    degrees: dict[str, int]
    order: tuple[str, ...]
    token_layout: str = "contiguous"
    placement: str | None = None  # WallFacer eq. 8 (None: collective_intra)
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        check_degrees(self.degrees, list(self.order))
        check_balance_policy(self.token_layout)
        check_team(self.degree("ring"), self.degree("team"), self.placement, wallfacer=self.placement is not None)

    @property
    def world_size(self) -> int:
        return world_size(self.degrees)

    def degree(self, name: str) -> int:
        return self.degrees.get(name, 1)

    def coords(self, rank: int) -> dict[str, int]:
        return coords(rank, self.degrees, list(self.order))

    def groups(self, names: str | tuple[str, ...]) -> list[list[int]]:
        """All groups of a dimension (or merged dimensions, e.g. ("ulysses", "ring") = "sp")."""
        key = names if isinstance(names, tuple) else tuple(names.split("x"))  # a merged_name reads back
        if key == ("sp",):
            key = SEQUENCE_DIMS
        if key not in self._cache:
            if key in (("team",), ("sub_ring",), ("team_ring",)):
                self._cache[key] = self._team_groups(key[0])
            else:
                self._cache[key] = group_ranks(key, self.degrees, list(self.order))
        return self._cache[key]

    def _team_groups(self, name: str) -> list[list[int]]:
        """Teams (by member index), WallFacer's sub-rings (in ring order, Sec. 3.3) or TokenRing x Ring's rings
        across teams of every ring group."""
        P, C = self.degree("ring"), self.degree("team")
        if name == "sub_ring":
            check_team(P, C, self.placement, wallfacer=True)
        parts = {"team": team_positions, "sub_ring": sub_ring_positions,
                 "team_ring": team_ring_positions}[name](P, C, self.placement)
        return sorted([ring[p] for p in part] for ring in self.groups("ring") for part in parts)

    def group_of(self, names: str | tuple[str, ...], rank: int) -> list[int]:
        """The group of ``names`` that contains ``rank``."""
        for g in self.groups(names):
            if rank in g:
                return g
        raise PlanError("rank", f"{rank} is outside a world of {self.world_size}", "run with the plan's world size")

    def all_groups(self) -> dict[str, list[list[int]]]:
        """Groups of every dimension of degree > 1, plus the merged sequence group ``sp``."""
        out = {n: self.groups(n) for n, s in mesh_dims(self.degrees, list(self.order))}
        out["sp"] = self.groups("sp")
        if self.degree("team") > 1 and self.placement is not None:  # a WallFacer layout: teams and sub-rings
            out["team"], out["sub_ring"] = self.groups("team"), self.groups("sub_ring")
        return out

    def tokens(self, rank: int, seq_len: int) -> np.ndarray:
        """Global token indices this rank holds, in local order."""
        c = self.coords(rank)
        t = sp_tokens(self.token_layout, self.degree("ulysses"), self.degree("ring"), seq_len)
        return t[c.get("ring", 0), c.get("ulysses", 0)]

    def sp_rank(self, rank: int) -> int:
        """Position of ``rank`` inside its sequence group (ulysses fastest, then ring)."""
        c = self.coords(rank)
        return c.get("ulysses", 0) + self.degree("ulysses") * c.get("ring", 0)

    def sequence_permutation(self, seq_len: int) -> np.ndarray:
        """Concatenation of the tokens of sequence ranks 0..sp-1 (the all-gather order)."""
        t = sp_tokens(self.token_layout, self.degree("ulysses"), self.degree("ring"), seq_len)
        # sequence rank index = u + U * r  -> order ring-major with ulysses inner
        return t.reshape(-1)

    def document_tokens(self, rank: int, cu_seqlens, weights=None) -> np.ndarray:
        """Tokens of one sequence with documents at ``cu_seqlens`` that this rank holds, in local order
        (``weights``: each token's work, which ``balanced`` needs; planner.masks.row_pairs gives it)."""
        c = self.coords(rank)
        t = document_sp_tokens(self.token_layout, self.degree("ulysses"), self.degree("ring"), cu_seqlens, weights)
        return t[c.get("ring", 0)][c.get("ulysses", 0)]

    def document_permutation(self, cu_seqlens, weights=None) -> np.ndarray:
        """Concatenation of the tokens of sequence ranks 0..sp-1 for a sequence with documents (the all-gather
        order; ranks' local lengths may differ)."""
        t = document_sp_tokens(self.token_layout, self.degree("ulysses"), self.degree("ring"), cu_seqlens, weights)
        return np.concatenate([piece for ring_rank in t for piece in ring_rank])


# ---------------------------------------------------------------- causal work per ring round

def _diagonal_pairs(token_layout: str, c: int) -> int:
    """Causal pairs of a rank's own block of c tokens: c(c+1)/2, or zigzag's two halves h(h+1) + h^2."""
    if token_layout == "zigzag":
        h = c // 2
        return h * (h + 1) + h * h
    return c * (c + 1) // 2


def block_pairs(token_layout: str, c: int) -> tuple[int, int, int]:
    """Causal pairs of a c-token block against an earlier rank's block, its own, and a later rank's.

    Contiguous: c^2, c(c+1)/2, 0. Striped (Striped Attention Sec. 3, token t on rank t mod P): c(c+1)/2 if
    the K, V rank is not after the Q rank, else c(c-1)/2. Zigzag (chunks r and 2P-1-r of c/2): exactly
    half, c^2/2, off the diagonal on either side, h(h+1) + h^2 on it.
    """
    diag = _diagonal_pairs(token_layout, c)
    if token_layout == "striped":
        return diag, diag, c * (c - 1) // 2
    if token_layout == "zigzag":
        return c * c // 2, diag, c * c // 2
    return c * c, diag, 0


def block_fractions(token_layout: str, c: int) -> tuple[float, float, float]:
    """``block_pairs`` as fractions of the c^2 pairs of a full block."""
    return tuple(x / float(c * c) for x in block_pairs(token_layout, c))


@lru_cache(maxsize=1024)
def causal_work(token_layout: str, ring: int, seq_len: int) -> np.ndarray:
    """(ring, ring) fraction of a full block that rank r computes on rank j's K, V under a causal mask.

    Striped Attention Sec. 3: contiguous rings leave rank r idle on later ranks' blocks and busy
    on earlier ones; striped and zigzag give every rank about half a block every round (``block_pairs``).
    """
    check_token_layout(token_layout)
    earlier, own, later = block_fractions(token_layout, seq_len // ring)
    r = np.arange(ring)[:, None]
    j = np.arange(ring)[None, :]
    w = np.where(j < r, earlier, np.where(j == r, own, later))
    w.flags.writeable = False
    return w


@lru_cache(maxsize=4096)
def _round_work(token_layout: str, ring: int, seq_len: int) -> tuple[float, ...]:
    """Per-round maximum of ``causal_work``; closed forms for large rings (tests check they agree)."""
    if ring > 64:
        diag, later = _large_ring_work(token_layout, ring, seq_len)
        return (diag,) + (later,) * (ring - 1)
    w = causal_work(token_layout, ring, seq_len)
    r = np.arange(ring)
    return tuple(w[r, (r[None, :] - r[:, None]) % ring].max(axis=1).tolist())  # row i: round i's blocks


def _large_ring_work(token_layout: str, ring: int, seq_len: int) -> tuple[float, float]:
    """``_round_work``'s closed form past 64 ranks: (the diagonal round's fraction, every later round's)."""
    c = seq_len // ring
    diag = (c + 1) / (2 * c) if token_layout != "zigzag" else causal_work(token_layout, 2, 2 * c)[0, 0]
    later = {"contiguous": 1.0, "striped": (c + 1) / (2 * c), "zigzag": 0.5}[token_layout]
    return float(diag), later


#: rings up to this size carry per-round balances (Compute.balance): they matter only where ranks share cores
#: (CPU worlds of a few ranks; Params.solo_speedup is 1 on GPUs), and a larger ring's would cost O(ring) a schedule
BALANCE_MAX_RING = 256


@lru_cache(maxsize=4096)
def round_balance(token_layout: str, ring: int, seq_len: int, causal: bool, q_travels: bool = False
                  ) -> tuple[float, ...]:
    """Per ring round i, the ranks' mean causal block fraction over the busiest's (Striped Attention Sec. 3: a
    contiguous ring's round i has P - i ranks on a whole earlier block and i on a masked later one). Ring
    attention: rank r holds the K, V of rank r - i; ``q_travels`` (TokenRing, seeds/001): rank r holds the Q of
    rank r - i against its own K, V. Even rounds (zigzag, non-causal) give 1.0; closed forms past 64 ranks."""
    if not causal:
        return (1.0,) * ring
    c = seq_len // ring
    if ring > 64:
        earlier, own, later = block_fractions(token_layout, c)
        out = [1.0]
        for i in range(1, ring):
            ahead = i if q_travels else ring - i  # ranks whose block in this round is an earlier one
            mean = (ahead * earlier + (ring - ahead) * later) / ring
            out.append(mean / max(earlier, later) if max(earlier, later) > 0 else 1.0)
        return tuple(out)
    w = causal_work(token_layout, ring, seq_len)
    r = np.arange(ring)
    held = (r[None, :] - r[:, None]) % ring  # [i, r]: the rank whose block rank r holds in round i
    x = w[held, r] if q_travels else w[r, held]  # row i: round i's blocks, as the loop over rounds indexed them
    top = x.max(axis=1)
    mean = x.mean(axis=1)  # along each contiguous row: the same pairwise sums as one row's own mean
    return tuple(float(m / t) if t > 0 else 1.0 for m, t in zip(mean.tolist(), top.tolist()))


@lru_cache(maxsize=4096)
def ring_balance(token_layout: str, ring: int, seq_len: int, causal: bool, q_travels: bool = False
                 ) -> tuple[float, ...]:
    """``round_balance`` pooled over the ring, the same for every round: sum_i mean_i / sum_i max_i, mean_i and max_i
    the ranks' mean and the busiest's block fraction in round i. Ranks that share cores do not wait for each other
    round by round: the next round's blocks are posted before this round's kernel (double-buffered), so a rank with
    no block in a round goes on, and the host's cores work through the ranks' total over the ring (Compute.balance).
    The busiest fraction of round i is the same whichever of K, V or Q travels (``_round_work``)."""
    bal = round_balance(token_layout, ring, seq_len, causal, q_travels)
    if min(bal) >= 1.0:
        return bal
    busiest = _round_work(token_layout, ring, seq_len)
    pooled = sum(b * m for b, m in zip(bal, busiest)) / sum(busiest)
    return (float(pooled),) * ring


@lru_cache(maxsize=4096)
def round_work_runs(token_layout: str, ring: int, seq_len: int, causal: bool) -> tuple[tuple[float, int], ...]:
    """``round_work`` run-length encoded: ((fraction, rounds), ...) in round order (past 64 ranks from
    ``_large_ring_work``'s two values, without listing the rounds)."""
    if not causal:
        return ((1.0, ring),)
    if ring > 64:
        diag, later = _large_ring_work(token_layout, ring, seq_len)
        return ((diag, ring),) if diag == later else ((diag, 1), (later, ring - 1))
    return _runs(_round_work(token_layout, ring, seq_len))


def _runs(values: tuple[float, ...]) -> tuple[tuple[float, int], ...]:
    """``values`` run-length encoded: ((the run's first value, its length), ...), equal neighbours (``==``) in one run."""
    return tuple((f, len(list(run))) for f, run in groupby(values))


def round_work(token_layout: str, ring: int, seq_len: int, causal: bool) -> list[float]:
    """Busiest rank's block fraction in each ring round i (rank r holds the K, V of rank r - i)."""
    if not causal:
        return [1.0] * ring
    return list(_round_work(token_layout, ring, seq_len))


@lru_cache(maxsize=4096)
def tokenring_step_work(token_layout: str, ring: int, seq_len: int, causal: bool) -> tuple[float, float]:
    """Busiest rank's block fraction in TokenRing's first step and in every later one (seeds/001 Sec. 3.3).

    Step 0 computes every rank's own (diagonal) block; in any later step some rank holds a Q block after
    its K, V block: a whole block (contiguous), c(c+1)/2 of c^2 (striped, Striped Attention Sec. 3) or
    exactly half (zigzag's equal halves); the same for every team size of TokenRing x Ring.
    """
    if not causal:
        return 1.0, 1.0
    c = seq_len // ring
    diag = _diagonal_pairs(token_layout, c) / float(c * c)
    later = {"contiguous": 1.0, "striped": diag, "zigzag": 0.5}[token_layout]
    return diag, later


# ---------------------------------------------------------------- WallFacer teams and sub-rings
#
# A ring of P positions holds P/C teams of C (t, member a). Teams t = g*P/C^2 + i form team group g;
# member a of the teams of group g is sub-ring (g, a), whose i-th member is the i-th team's.
# collective_intra: position p = t*C + a (a team's members adjacent; sub-rings at stride C);
# p2p_intra: p = a*P/C + t (sub-rings adjacent; a team's members P/C apart), as Orders._ring_split.

def check_team(ring: int, team: int, placement: str | None = None, wallfacer: bool = True) -> None:
    """Teams of C divide the ring; WallFacer's (Sec. 3.2.1) need P/C^2 an integer and a placement of eq. 8."""
    if placement is not None and placement not in PLACEMENTS:
        raise PlanError("placement", f"unknown placement {placement!r}", f"use one of {list(PLACEMENTS)}")
    if team > 1 and ring % team:
        raise PlanError("degrees.team", f"team {team} does not divide the ring {ring}", "choose a team dividing ring")
    if wallfacer and team > 1 and ring % (team * team):
        raise PlanError("degrees.team", f"team {team} needs a ring divisible by C^2 = {team * team}, not {ring}",
                        "choose C with C^2 dividing the ring degree (C = 1 is Ring attention)")


def _team_inner(placement: str | None) -> bool:
    return placement != "p2p_intra"


def team_group_size(ring: int, team: int) -> int:
    """Teams per team group = ranks per sub-ring = rounds: P/C^2 (WallFacer Sec. 3.2.1)."""
    return ring // (team * team)


def team_position(ring: int, team: int, placement: str | None, t: int, a: int) -> int:
    """Ring position of member ``a`` of team ``t`` under a placement of WallFacer eq. 8."""
    return t * team + a if _team_inner(placement) else a * (ring // team) + t


def team_coords(ring: int, team: int, placement: str | None, position: int) -> tuple[int, int]:
    """(team t, member a) of a ring position: inverse of ``team_position``."""
    if _team_inner(placement):
        return divmod(position, team)
    a, t = divmod(position, ring // team)
    return t, a


@lru_cache(maxsize=4096)
def team_positions(ring: int, team: int, placement: str | None = None) -> tuple[tuple[int, ...], ...]:
    """Ring positions of every team, members in order a = 0..C-1 (the all-gather order)."""
    return tuple(tuple(team_position(ring, team, placement, t, a) for a in range(team)) for t in range(ring // team))


def team_ring_positions(ring: int, team: int, placement: str | None = None) -> tuple[tuple[int, ...], ...]:
    """Ring positions of every ring across teams (member a of each team, in team order): the ``team_ring`` that
    ``ring_split`` sizes."""
    return tuple(tuple(team_position(ring, team, placement, t, a) for t in range(ring // team)) for a in range(team))


def sub_ring_coords(ring: int, team: int, placement: str | None, position: int) -> tuple[int, int, int]:
    """(team group g, member a, index i in the sub-ring) of a ring position (WallFacer Fig. 5)."""
    t, a = team_coords(ring, team, placement, position)
    g, i = divmod(t, team_group_size(ring, team))
    return g, a, i


@lru_cache(maxsize=4096)
def sub_ring_positions(ring: int, team: int, placement: str | None = None) -> tuple[tuple[int, ...], ...]:
    """Ring positions of every sub-ring (g, a), in ring order: member a of teams g*P/C^2 + i (Algorithm 3)."""
    tgs = team_group_size(ring, team)
    return tuple(tuple(team_position(ring, team, placement, g * tgs + i, a) for i in range(tgs))
                 for g in range(team) for a in range(team))


@lru_cache(maxsize=None)
def ring_split(ring: int, team: int, placement: str | None, name: str) -> tuple[int, int]:
    """(size, step in ring positions) of the groups ``name`` inside a ring: ``team`` (C ranks), WallFacer's
    ``sub_ring`` (P/C^2 ranks, Algorithm 3) or ``team_ring`` (the first members of the P/C teams, TokenRing x
    Ring's ring across teams); every such group is evenly spaced under both placements of eq. 8."""
    if name == "team":
        size, first, second = team, (0, 0), (0, 1)  # members a = 0, 1 of team 0
    elif name == "sub_ring":
        size, first, second = team_group_size(ring, team), (0, 0), (1, 0)  # member 0 of teams 0, 1 (sub-ring 0)
    else:
        size, first, second = ring // team, (0, 0), (1, 0)  # the first members of teams 0, 1
    if size <= 1:
        return 1, 0
    return size, team_position(ring, team, placement, *second) - team_position(ring, team, placement, *first)


def init_send(ring: int, team: int, placement: str | None, position: int) -> int:
    """WallFacer Algorithm 2 (get_init_send): where this rank sends its team's K, V to seed a sub-ring."""
    r_t, r_a = team_coords(ring, team, placement, position)
    target_team = r_a * team_group_size(ring, team) + r_t // team
    return team_position(ring, team, placement, target_team, r_t % team)


def init_recv(ring: int, team: int, placement: str | None, position: int) -> int:
    """Inverse of Algorithm 2: the position whose team K, V this rank holds first (team i*C + a, member g)."""
    g, a, i = sub_ring_coords(ring, team, placement, position)
    return team_position(ring, team, placement, i * team + a, g)


def p2p_neighbours(ring: int, team: int, placement: str | None, position: int) -> tuple[int, int]:
    """WallFacer Algorithm 3 (get_P2P_config): (next, last) ring positions in this rank's sub-ring."""
    r_t, r_a = team_coords(ring, team, placement, position)
    tgs = team_group_size(ring, team)
    base = tgs * (r_t // tgs)
    nxt, last = (r_t + 1) % tgs + base, (r_t - 1) % tgs + base
    return team_position(ring, team, placement, nxt, r_a), team_position(ring, team, placement, last, r_a)


@lru_cache(maxsize=256)
def wallfacer_pairs(ring: int, team: int, placement: str | None, backward: bool = False) -> np.ndarray:
    """(P, P/C^2, 2): (query team, K/V team) each ring position attends in each sub-ring round.

    Forward (Algorithm 1): Q of the own team stays, round r brings the K, V seeded (Algorithm 2) at
    sub-ring index i - r, i.e. team C((i - r) mod P/C^2) + a. Backward (Sec. 3.2.1): the K, V seeded
    here stay, round r brings the Q of the sub-ring's (i - r)-th member, team g P/C^2 + (i - r).
    """
    tgs = team_group_size(ring, team)
    p = np.arange(ring)
    if _team_inner(placement):  # team_coords, vectorized
        t, a = p // team, p % team
    else:
        a, t = p // (ring // team), p % (ring // team)
    g, i = (t // tgs)[:, None], (t % tgs)[:, None]
    j = (i - np.arange(tgs)[None, :]) % tgs
    a = a[:, None]
    out = np.empty((ring, tgs, 2), dtype=np.int64)
    out[..., 0] = g * tgs + j if backward else g * tgs + i
    out[..., 1] = team * i + a if backward else team * j + a
    out.flags.writeable = False
    return out


@lru_cache(maxsize=256)
def team_tokens(token_layout: str, ring: int, team: int, placement: str | None, seq_len: int) -> np.ndarray:
    """(P/C, C N/P) global tokens of each team after the all-gather: its members' ring tokens in order a."""
    rt = ring_tokens(token_layout, ring, seq_len)
    out = np.stack([np.concatenate([rt[p] for p in members]) for members in team_positions(ring, team, placement)])
    out.flags.writeable = False
    return out


def busiest_team_block(token_layout: str, ring: int, team: int, placement: str | None, seq_len: int) -> float:
    """Closed form of the largest causal fraction of a team block, for rings too large for the exact sums.

    With c = N/P tokens per rank: zigzag (and striped with interleaved teams, p2p_intra) 1/2 + 1/(2cC),
    a team's own block; striped with contiguous teams (c + 1)/(2c) (Striped Attention Sec. 3);
    contiguous a whole earlier block for contiguous teams, else C(C+1)/2 of the C^2 member blocks.
    """
    c = seq_len // ring
    inner = _team_inner(placement) or team == 1
    if token_layout == "zigzag" or (token_layout == "striped" and not inner):
        return 0.5 + 1 / (2 * c * team)
    if token_layout == "striped":
        return (c + 1) / (2 * c)
    return 1.0 if inner else (team + 1) / (2 * team)


def _team_values(token_layout: str, ring: int, team: int, placement: str | None, seq_len: int
                 ) -> tuple[float, float, float]:
    """``team_work``'s three values: a team block against an earlier team's, its own, a later team's."""
    check_token_layout(token_layout)
    C = team
    earlier, own, later = block_fractions(token_layout, seq_len // ring)
    mixed = C * (C - 1) / 2 * (earlier + later)  # member pairs split C(C-1)/2 each way (off the diagonal)
    if _team_inner(placement):  # position t C + a: whole teams before or after; a team's own block is mixed
        return earlier, (C * own + mixed) / (C * C), later
    # position a P/C + t: pairs of other members split; the C same-member pairs follow the teams' order
    return (mixed + C * earlier) / (C * C), (mixed + C * own) / (C * C), (mixed + C * later) / (C * C)


@lru_cache(maxsize=256)
def team_work(token_layout: str, ring: int, team: int, placement: str | None, seq_len: int) -> np.ndarray:
    """(P/C, P/C) causal fraction of a (C N/P)^2 team block: the mean of ``causal_work`` over the members'
    blocks (``team_positions``: members adjacent under collective_intra, P/C apart under p2p_intra), in closed
    form from ``block_pairs`` (``_team_values``: an earlier team's block, the own one, a later one's)."""
    lt, eq, gt = _team_values(token_layout, ring, team, placement, seq_len)
    t = np.arange(ring // team)
    u, v = t[:, None], t[None, :]
    w = np.where(v < u, lt, np.where(v == u, eq, gt))
    w.flags.writeable = False
    return w


#: rings past this size take ``busiest_team_block``'s closed form in every sub-ring round
WALLFACER_CLOSED_RING = 1024


@lru_cache(maxsize=1024)
def _wallfacer_round_work(token_layout: str, ring: int, team: int, placement: str | None, seq_len: int,
                          backward: bool) -> tuple[float, ...]:
    tgs = team_group_size(ring, team)
    if ring > WALLFACER_CLOSED_RING:
        return (busiest_team_block(token_layout, ring, team, placement, seq_len),) * tgs
    # team_work[u, v] takes one of three values by the order of the teams u, v (_team_values): a round's busiest
    # rank is the largest value whose order occurs among its wallfacer_pairs (_round_orders)
    best = np.full(tgs, -np.inf)
    for present, x in zip(_round_orders(ring, team, placement, backward),
                          _team_values(token_layout, ring, team, placement, seq_len)):
        best = np.where(present, np.maximum(best, x), best)
    return tuple(float(x) for x in best)


@lru_cache(maxsize=1024)
def _round_orders(ring: int, team: int, placement: str | None, backward: bool
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per sub-ring round, whether ``wallfacer_pairs`` pairs some Q team with an earlier, the same, a later K, V
    team (once per ring, team and placement: not per token layout or length)."""
    tgs = team_group_size(ring, team)
    if team == 1:  # round r pairs Q team p with K, V team p - r mod P (backward: p - r with p), every p: the same
        # team in the first round (r = 0) alone, an earlier and a later one (p = r, p = 0) in every other round
        same = np.arange(ring) == 0
        other = ~same
        for x in (same, other):
            x.flags.writeable = False
        return other, same, other
    # In closed form: every (team t = g P/C^2 + i, member a) occurs under either placement, so the pairs of round r
    # are, forward, (g tgs + i, C ((i - r) mod tgs) + a), backward (g tgs + (i - r) mod tgs, C i + a), over all
    # g, a < C and i < tgs. A team meets itself in round r for exactly the teams u (forward: Q team u, so i = u mod
    # tgs and j = u // C; backward: K, V team u, so i = u // C, j = u mod tgs) with r = (i - j) mod tgs; with C >= 2
    # some Q team is later than its K, V team in every round (j = 0, g = C - 1) and some earlier (a = C - 1 and j or
    # i at tgs - 1, g = 0).
    u = np.arange(ring // team)
    r = ((u // team - u % tgs) if backward else (u % tgs - u // team)) % tgs
    same = np.zeros(tgs, dtype=bool)
    same[r] = True
    every = np.ones(tgs, dtype=bool)
    for x in (every, same):
        x.flags.writeable = False
    return every, same, every


@lru_cache(maxsize=4096)
def wallfacer_round_runs(token_layout: str, ring: int, team: int, placement: str | None, seq_len: int,
                         causal: bool, backward: bool = False) -> tuple[tuple[float, int], ...]:
    """``wallfacer_round_work`` run-length encoded: ((fraction, rounds), ...) in round order (past
    ``WALLFACER_CLOSED_RING`` one run, without listing the rounds)."""
    if not causal or ring > WALLFACER_CLOSED_RING:
        tgs = team_group_size(ring, team)
        f = busiest_team_block(token_layout, ring, team, placement, seq_len) if causal else 1.0
        return ((f, tgs),) if tgs else ()
    return _runs(_wallfacer_round_work(token_layout, ring, team, placement, seq_len, backward))


def wallfacer_round_work(token_layout: str, ring: int, team: int, placement: str | None, seq_len: int,
                         causal: bool, backward: bool = False) -> list[float]:
    """Busiest rank's fraction of a full (C N/P)^2 team block in each of the P/C^2 sub-ring rounds."""
    if not causal:
        return [1.0] * team_group_size(ring, team)
    return list(_wallfacer_round_work(token_layout, ring, team, placement, seq_len, backward))
