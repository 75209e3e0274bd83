"""Ring attention over a process group (Liu et al. 2023, Ring Attention with Blockwise Transformers).

Forward. Ring rank p holds its query block and starts with its own K,V block. In round i it
attends to the K,V block of ring rank (p - i) mod P while the block for round i + 1 is already in
flight from its predecessor (double buffering: one batched isend/irecv to the ring neighbours per
round), and folds the block's (out, lse) into its accumulators with the online-softmax merge.

Backward (zhuzilin/ring-flash-attention scheme). The K,V blocks go round again in the same order.
In round i rank p runs the FlashAttention-2 block backward against the K,V block of rank
(p - i) mod P, using the *global* out and lse saved by the forward, so the block's probabilities
are the final ones and the block gradients add up exactly. dq stays local. dk and dv of that
block are added to an accumulator that travels one hop behind the block: rank p receives it from
its predecessor (which added the contributions of ranks (p - i) .. (p - 1)), adds its own, and
sends it on. After P rounds every accumulator has visited every rank and arrives back at the
owner of its block, which ends with the exact dk, dv of its tokens. Fully masked (causal) blocks
are skipped, but their accumulators still travel so the schedule is the same on every rank.

Causal masks. Each round's mask is derived from the global token indices of the query and the
K,V owner (``planner.layout.ring_tokens``: contiguous, zigzag, striped) and reduced to row/column
ranges plus a diagonal offset or explicit mask (``kernels.causal_block_mask``).

Documents and windows. With ``cu_seqlens`` or a ``window`` each round is a set of tiles over each member's tokens
(``member_tokens``, per document): pairs of runs inside one document within the window's reach, full or diagonal,
with a small explicit mask only at a window's edge (``kernels.block_tiles``). A round the mask empties runs no
kernel, and K, V travel only as many rounds as some member's mask needs (``needed_rounds``): a windowed ring talks
to its near neighbours; the backward's last hop then takes each dk, dv accumulator straight back to its owner.
"""
from __future__ import annotations

import numbers
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
import torch.distributed as dist

from sp_plan.planner.documents import check_cu_seqlens
from sp_plan.planner.errors import PlanError
from sp_plan.planner.layout import check_token_layout, document_ring_tokens, local_token_range, ring_tokens
from sp_plan.planner.masks import row_pairs
from sp_plan.planner.model import masking_window

from ..kernels import (BlockMask, block_attention, block_attention_backward, block_tiles, causal_block_mask, full_block,
                      layout_step, local_attention, lse_dtype, member_runs, merge)
from ..overlap import DoubleBuffer
from . import degree, register

_TAG_K, _TAG_V, _TAG_DK, _TAG_DV = 0, 1, 2, 3
#: blocks the kernels ran on in this process, by pass ("forward", "backward"); a block its mask empties never counts
BLOCKS: Counter = Counter()
#: K, V blocks a ring rank sent on in this process, by pass ("forward", "backward"): none past the rounds a mask needs
SENT: Counter = Counter()


def p2p(group, sends: list, recvs: list) -> list:
    """Post isends (tensor, global dst, tag) and irecvs (tensor, global src, tag) as one batch; the requests."""
    ops = [dist.P2POp(dist.isend, t, dst, group, tag) for t, dst, tag in sends]
    ops += [dist.P2POp(dist.irecv, t, src, group, tag) for t, src, tag in recvs]
    return dist.batch_isend_irecv(ops) if ops else []


def wait_all(reqs) -> None:
    for r in reqs:
        r.wait()


@dataclass(frozen=True)
class Ring:
    """This rank's place in a ring: global ranks in ring order and its position; ``shift`` reaches its neighbours."""

    ranks: tuple[int, ...]
    position: int
    group: dist.ProcessGroup | None

    @property
    def size(self) -> int:
        return len(self.ranks)

    def shift(self, send: list[torch.Tensor], recv: list[torch.Tensor], tag: int, hops: int = 1) -> list:
        """Send tensors ``hops`` ranks on (default: the next rank) and receive as many from as far back (batched
        p2p)."""
        dst, src = self.ranks[(self.position + hops) % self.size], self.ranks[(self.position - hops) % self.size]
        return p2p(self.group, [(t, dst, tag + j) for j, t in enumerate(send)],
                   [(t, src, tag + j) for j, t in enumerate(recv)])


def make_ring(group: dist.ProcessGroup | None = None, ranks=None) -> Ring:
    """The ring of ``group`` in the order ``ranks`` (global ranks; default: the group's, sorted)."""
    members = sorted(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))
    order = tuple(int(r) for r in ranks) if ranks is not None else tuple(members)
    if sorted(order) != members:
        raise PlanError("ranks", f"ring order {list(order)} is not a permutation of the group's ranks {members}",
                        "pass the group's global ranks in ring order")
    me = dist.get_rank()
    if me not in order:
        raise PlanError("group", f"rank {me} is not in the ring {list(order)}", "call ring attention on members only")
    return Ring(order, order.index(me), group)


class Carried:
    """Accumulators carried round the ring one hop behind their block (the ring backward's dk, dv; WallFacer's dQ):
    each holder takes the one received and adds its terms, then sends it on; the last hop takes it home. The
    buffer sent two rounds back is reused for the next receive."""

    def __init__(self, ring: Ring, tag: int):
        self.ring, self.tag = ring, tag
        self._reqs, self._sent, self._recv, self._spare = None, None, None, None

    def take(self, first: bool, fresh) -> tuple:
        """This round's accumulators: ``fresh()`` in the first round, else the ones received from the last holder."""
        if first:
            return fresh()
        wait_all(self._reqs)
        self._spare = self._sent
        return self._recv

    def send(self, acc: tuple, hops: int = 1) -> None:
        """Send the accumulators ``hops`` ranks on and post the receive of the next ones."""
        self._recv = self._spare if self._spare is not None else tuple(torch.empty_like(t) for t in acc)
        self._sent = acc
        self._reqs = self.ring.shift(list(acc), list(self._recv), self.tag, hops)

    def home(self) -> tuple:
        """The accumulators of this rank's own block, back after the last hop."""
        wait_all(self._reqs)
        return self._recv


class TrailingSum:
    """Accumulators that follow their block one hop behind, each holder adding its terms to the sum received and
    passing it on; the holder of the last round sends it home (METP Algorithm 2 lines 12-13)."""

    def __init__(self, ring: Ring, tag: int, like: tuple, hops: int = 1):
        self.ring, self.tag, self.like, self.hops = ring, tag, like, hops
        self._reqs, self._in = [], None  # the sum arriving from the previous holder

    def pass_on(self, acc: tuple) -> None:
        """Add the sum received (none before the first pass) to ``acc`` in place and send the total on."""
        wait_all(self._reqs)
        if self._in is not None:
            self._add(acc)
        self._in = tuple(torch.empty_like(t) for t in self.like)
        self._reqs = self.ring.shift(list(acc), list(self._in), self.tag, self.hops)

    def home(self, own: tuple) -> None:
        """Add the sum over the other holders, sent home by the last one, into ``own`` (none travelled: nothing)."""
        if self._in is None:
            return
        wait_all(self._reqs)
        self._add(own)

    def _add(self, acc: tuple) -> None:
        for a, x in zip(acc, self._in):
            a += x


@lru_cache(maxsize=256)
def member_tokens(token_layout: str, size: int, seq_len: int, causal: bool, cu_seqlens: tuple[int, ...] | None,
                  window: int | None) -> tuple:
    """Global tokens each member holds (ring order): the layout over the whole sequence, or with packed documents
    the layout per document (``layout.document_ring_tokens``: zigzag per document, ``balanced`` by work), whose
    members may hold different numbers of tokens."""
    if cu_seqlens is None:
        check_token_layout(token_layout)
        return tuple(ring_tokens(token_layout, size, seq_len))
    weights = row_pairs(cu_seqlens, causal, window) if token_layout == "balanced" else None
    return tuple(document_ring_tokens(token_layout, size, cu_seqlens, weights))


@lru_cache(maxsize=256)
def member_pieces(token_layout: str, ulysses: int, ring: int, seq_len: int, causal: bool,
                  cu_seqlens: tuple[int, ...] | None, window: int | None) -> tuple[tuple[np.ndarray, ...], ...]:
    """[ring member][ulysses member] tokens (USP Algorithm 2): each ring member's tokens (``member_tokens``) cut
    into ``ulysses`` contiguous pieces, the first (length mod ulysses) one token longer (``layout.sp_tokens``,
    ``layout.document_sp_tokens``)."""
    members = member_tokens(token_layout, ring, seq_len, causal, cu_seqlens, window)
    return tuple(tuple(np.array_split(t, ulysses)) for t in members)


def sees(q_tokens, k_tokens, causal: bool, cu_seqlens, window: int | None, seq_len: int) -> bool:
    """Whether any query of ``q_tokens`` attends any key of ``k_tokens`` (``kernels.attended``'s mask) without the
    pair matrix: key t' is seen by queries in [t', t' + W) causal, (t' - W, t' + W) not, within its document."""
    k = np.asarray(k_tokens, dtype=np.int64)
    q = np.sort(np.asarray(q_tokens, dtype=np.int64))
    if cu_seqlens is None:
        start, end = np.zeros_like(k), np.full_like(k, seq_len)
    else:
        cu = np.asarray(cu_seqlens, dtype=np.int64)
        doc = np.searchsorted(cu, k, side="right") - 1
        start, end = cu[doc], cu[doc + 1]
    lo = k if causal else (start if window is None else np.maximum(start, k - window + 1))
    hi = end if window is None else np.minimum(end, k + window)
    return bool(np.any(np.searchsorted(q, lo) < np.searchsorted(q, hi)))


@lru_cache(maxsize=256)
def needed_rounds(token_layout: str, ring: int, seq_len: int, causal: bool, cu_seqlens: tuple[int, ...] | None,
                  window: int | None) -> int:
    """How many leading rounds some member's mask needs (1 + the last round i in which a member p sees the keys of
    member p - i): the ring's K, V go no further, so a windowed ring talks to its near neighbours only."""
    tokens = member_tokens(token_layout, ring, seq_len, causal, cu_seqlens, window)
    for i in range(ring - 1, 0, -1):
        if any(sees(tokens[p], tokens[(p - i) % ring], causal, cu_seqlens, window, seq_len) for p in range(ring)):
            return i + 1
    return 1


@lru_cache(maxsize=256)
def runs_of_members(token_layout: str, ring: int, seq_len: int, causal: bool, cu_seqlens: tuple[int, ...] | None,
                    window: int | None) -> tuple[np.ndarray, ...]:
    """Every member's runs of tokens (``kernels.member_runs``), in ring order."""
    tokens = member_tokens(token_layout, ring, seq_len, causal, cu_seqlens, window)
    step = layout_step(token_layout, ring)
    return tuple(member_runs(t, cu_seqlens, step, window) for t in tokens)


def member_block(token_layout: str, ring: int, seq_len: int, causal: bool, cu_seqlens: tuple[int, ...] | None,
                 window: int | None, queries: int, keys: int) -> tuple[BlockMask, ...] | None:
    """The tiles of member ``queries``' tokens against member ``keys``' (``kernels.block_tiles``); None = skip."""
    runs = runs_of_members(token_layout, ring, seq_len, causal, cu_seqlens, window)
    return block_tiles(runs[queries], runs[keys], layout_step(token_layout, ring), causal, window)


@lru_cache(maxsize=1024)
def round_masks(token_layout: str, ring: int, seq_len: int, position: int, causal: bool,
                cu_seqlens: tuple[int, ...] | None = None, window: int | None = None) -> tuple:
    """Mask of each round i (K,V of ring rank (position - i) mod ring); None = fully masked, skip.

    Derived from the global token indices of ``member_tokens``. Without documents or a window, a round is one
    ``BlockMask`` (``kernels.causal_block_mask``). With them, query t sees key t' iff t >= t' (causal), both lie in
    one packed document of ``cu_seqlens`` and t - t' < ``window``, and a round is a tuple of tiles inside one
    document each (``member_block``), with no matrix over the block. Key blocks of members holding fewer tokens
    travel padded to the longest; the padding is never attended.
    """
    if cu_seqlens is None and window is None:
        check_token_layout(token_layout)
        tokens = ring_tokens(token_layout, ring, seq_len)
        n = tokens.shape[1]
        if not causal:
            return tuple(full_block(n, n) for _ in range(ring))
        return tuple(causal_block_mask(tokens[position], tokens[(position - i) % ring]) for i in range(ring))
    return tuple(member_block(token_layout, ring, seq_len, causal, cu_seqlens, window, position, (position - i) % ring)
                 for i in range(ring))


def _rows_cols(bm: BlockMask) -> tuple[slice, slice]:
    return slice(bm.row_start, bm.row_stop), slice(bm.col_start, bm.col_stop)


def _post(ring: Ring, rd, bufs: list, like: tuple, tag: int, trace) -> list:
    """Round ``rd`` of a ``DoubleBuffer``: send the compute slot on, receive the next block into ``rd.recv``."""
    if rd.recv is None:
        return []
    if bufs[rd.recv] is None:
        bufs[rd.recv] = tuple(torch.empty_like(t) for t in like)
    if trace is not None:
        trace.append(("post", rd.index, rd.compute, rd.recv))
    return ring.shift(list(bufs[rd.compute]), list(bufs[rd.recv]), tag)


def _start_round(ring: Ring, rd, bufs: list, kv: tuple, trace, pass_: str) -> tuple:
    """Post round ``rd``'s K, V shift (counted in ``SENT[pass_]``): its requests and the K, V block to compute on."""
    reqs = _post(ring, rd, bufs, kv, _TAG_K, trace)
    SENT[pass_] += rd.recv is not None
    cur_k, cur_v = bufs[rd.compute]
    if trace is not None:
        trace.append(("compute", rd.index, rd.compute, cur_k.data_ptr()))
    return reqs, cur_k, cur_v


def _wait(rd, reqs, trace) -> None:
    wait_all(reqs)
    if trace is not None and rd.recv is not None:
        trace.append(("wait", rd.index))


def tiles_of(bm) -> tuple[BlockMask, ...]:
    """A block's mask as its tiles: a ``BlockMask`` alone, a tuple of tiles as is, None (skipped) none."""
    return () if bm is None else (bm,) if isinstance(bm, BlockMask) else tuple(bm)


def attend_block(q, k, v, bm, out, lse, scale, backend=None):
    """Fold one K,V block's attention (mask ``bm``: a ``BlockMask`` or a tuple of tiles; None = skip) into the (out,
    lse) accumulators (None: none yet), tile by tile. A block counts once in ``BLOCKS``, whatever its tiles."""
    tiles = tiles_of(bm)
    if tiles:
        BLOCKS["forward"] += 1
    n = q.shape[1]
    for tile in tiles:
        rows, cols = _rows_cols(tile)
        b_out, b_lse = block_attention(q[:, rows], k[:, cols], v[:, cols], scale=scale,
                                       causal_offset=tile.causal_offset, mask=tile.mask, backend=backend)
        if out is None and tile.full_rows(n):  # the first tile over every row starts the accumulators
            out, lse = b_out.to(lse_dtype(q.dtype)), b_lse.to(lse_dtype(q.dtype))
            continue
        if out is None:
            out = q.new_zeros(*q.shape[:3], v.shape[-1], dtype=lse_dtype(q.dtype))
            lse = torch.full((q.shape[0], q.shape[2], n), float("-inf"), dtype=out.dtype, device=q.device)
        merge(out[:, rows], lse[..., rows], b_out, b_lse)
    return out, lse


def attend_block_backward(dout, q, k, v, out, lse, bm, dq, dkv=None, scale=None, backend=None):
    """One K,V block's backward (mask ``bm`` as ``attend_block``; None = nothing), tile by tile: dq accumulated
    (None: none yet), and the block's dk, dv added into ``dkv`` (accumulators of K's and V's shape; None: made here
    where a tile runs). Returns (dq, dkv)."""
    tiles = tiles_of(bm)
    if tiles:
        BLOCKS["backward"] += 1
    acc = lse_dtype(q.dtype)
    for tile in tiles:
        rows, cols = _rows_cols(tile)
        g_q, g_k, g_v = block_attention_backward(dout[:, rows], q[:, rows], k[:, cols], v[:, cols], out[:, rows],
                                                 lse[..., rows], scale=scale, causal_offset=tile.causal_offset,
                                                 mask=tile.mask, backend=backend)
        if dq is None and tile.full_rows(q.shape[1]):
            dq = g_q.to(acc)
        else:
            if dq is None:
                dq = torch.zeros(q.shape, dtype=acc, device=q.device)
            dq[:, rows] += g_q
        if dkv is None:
            dkv = (torch.zeros(k.shape, dtype=acc, device=k.device), torch.zeros(v.shape, dtype=acc, device=v.device))
        dkv[0][:, cols] += g_k
        dkv[1][:, cols] += g_v
    return dq, dkv


def attend_chunks(q, ks, vs, masks, scale, backend=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries against a list of K/V chunks (masks[j] for chunk j; None = skip), folded by the lse merge: (out, lse).
    Rows that see no key get out 0 and lse -inf."""
    out = lse = None
    for k, v, bm in zip(ks, vs, masks):
        out, lse = attend_block(q, k, v, bm, out, lse, scale, backend)
    if out is None:
        out, lse = seen_nothing(q, vs[0])
    return out.to(q.dtype), lse


def seen_nothing(q: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of queries that see no key (every block masked, or no queries at all): 0 and -inf."""
    out = q.new_zeros(*q.shape[:3], v.shape[-1], dtype=lse_dtype(q.dtype))
    return out, torch.full((q.shape[0], q.shape[2], q.shape[1]), float("-inf"), dtype=out.dtype, device=q.device)


def attend_chunks_backward(dout, q, ks, vs, out, lse, masks, scale, backend=None):
    """Backward of ``attend_chunks`` from the global (out, lse) (FlashAttention-2 Alg. 2 per chunk): dq and every
    chunk's dk, dv, in the accumulation dtype."""
    acc = lse_dtype(q.dtype)
    dq, dks, dvs = None, [], []
    for k, v, bm in zip(ks, vs, masks):
        dkv = (torch.zeros(k.shape, dtype=acc, device=k.device), torch.zeros(v.shape, dtype=acc, device=v.device))
        dq, _ = attend_block_backward(dout, q, k, v, out, lse, bm, dq, dkv, scale, backend)
        dks.append(dkv[0])
        dvs.append(dkv[1])
    if dq is None:
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    return dq, dks, dvs


def ring_forward(q, k, v, ring: Ring, masks, scale, backend=None, trace=None,
                 rounds: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Ring attention forward, zhuzilin/ring-flash-attention scheme: K,V go round, (out, lse) merge.

    The transfers follow ``overlap.DoubleBuffer``; ``trace`` (a list) records its events in order. ``rounds``: the
    first rounds any member's mask needs (``needed_rounds``; default all), so K, V go no further than they feed.
    """
    out = lse = None
    bufs: list = [(k, v), None, None]
    for rd in DoubleBuffer(rounds or ring.size).rounds:
        reqs, cur_k, cur_v = _start_round(ring, rd, bufs, (k, v), trace, "forward")
        out, lse = attend_block(q, cur_k, cur_v, masks[rd.index], out, lse, scale, backend)
        _wait(rd, reqs, trace)
    if out is None:  # a member holding no tokens of a packed sequence
        out, lse = seen_nothing(q, v)
    return out.to(q.dtype), lse


def ring_backward(dout, q, k, v, out, lse, ring: Ring, masks, scale, backend=None, trace=None,
                  rounds: int | None = None):
    """Ring attention backward, zhuzilin/ring-flash-attention scheme: dk, dv travel home behind K, V.

    K, V go round as in the forward (``overlap.DoubleBuffer``; ``trace`` records its events). Over fewer
    ``rounds`` than ranks the last hop sends each dk, dv accumulator straight back to its block's owner.
    """
    acc = lse_dtype(q.dtype)
    n = rounds or ring.size
    dq = None
    bufs: list = [(k, v), None, None]
    dkv = Carried(ring, _TAG_DK)
    for rd in DoubleBuffer(n).rounds:
        i = rd.index
        kv_reqs, cur_k, cur_v = _start_round(ring, rd, bufs, (k, v), trace, "backward")
        acc_kv = dkv.take(i == 0, lambda: (torch.zeros(k.shape, dtype=acc, device=k.device),
                                           torch.zeros(v.shape, dtype=acc, device=v.device)))
        dq, (dk, dv) = attend_block_backward(dout, q, cur_k, cur_v, out, lse, masks[i], dq, acc_kv, scale, backend)
        if n > 1:  # the last round's hop takes the accumulator home: n - 1 ranks back (1 on for n = P)
            dkv.send((dk, dv), 1 if i < n - 1 else 1 - n)
        _wait(rd, kv_reqs, trace)
    if n > 1:
        dk, dv = dkv.home()
    if dq is None:
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    """Autograd wrapper: ring forward, and the ring backward with circulating dk, dv."""

    @staticmethod
    def forward(ctx, q, k, v, group, causal, token_layout, scale, ranks, backend, cu_seqlens=None, window=None):
        ring = make_ring(group, ranks)
        seq_len = q.shape[1] * ring.size if cu_seqlens is None else cu_seqlens[-1]
        n = max(len(t) for t in held_tokens(token_layout, ring, seq_len, q.shape[1], bool(causal), cu_seqlens,
                                            window))
        k, v = pad_tokens(k, n).contiguous(), pad_tokens(v, n).contiguous()  # sent at the longest member's length
        masks = round_masks(token_layout, ring.size, seq_len, ring.position, bool(causal), cu_seqlens, window)
        rounds = ring.size if cu_seqlens is None and window is None else needed_rounds(
            token_layout, ring.size, seq_len, bool(causal), cu_seqlens, window)
        out, lse = ring_forward(q, k, v, ring, masks, scale, backend, rounds=rounds)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.masks, ctx.scale, ctx.backend, ctx.n_kv = ring, masks, scale, backend, q.shape[1]
        ctx.rounds = rounds
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(dout, q, k, v, out, lse, ctx.ring, ctx.masks, ctx.scale, ctx.backend,
                                   rounds=ctx.rounds)
        return dq, dk[:, :ctx.n_kv], dv[:, :ctx.n_kv], None, None, None, None, None, None, None, None


def pad_tokens(x: torch.Tensor, n: int, fill=0) -> torch.Tensor:
    """``x`` with its token dimension (1) padded with ``fill`` to ``n`` (a member holding fewer tokens than another)."""
    return x if x.shape[1] == n else torch.cat([x, x.new_full((x.shape[0], n - x.shape[1], *x.shape[2:]), fill)], dim=1)


def check_share(n_local: int, token_layout: str, ring: int, ulysses: int, seq_len: int) -> None:
    """This rank's token count against what the layout can give one of ring x ulysses ranks of ``seq_len``
    (``layout.local_token_range``), checked before any per-token array of the sequence is built: a ``cu_seqlens``
    that does not match the inputs fails at once, however far its end is from them."""
    span = local_token_range(token_layout, ring, ulysses, seq_len)
    if span is not None and not span[0] <= n_local <= span[1]:
        held = f"{span[0]:,}" if span[0] == span[1] else f"{span[0]:,}-{span[1]:,}"
        gives = ("a sequence group of one rank holds every token" if ring * ulysses == 1 else
                 f"the {token_layout} layout gives each of {ring * ulysses} ranks {held} tokens")
        raise PlanError("cu_seqlens", f"ends at {seq_len:,}: {gives}, and this rank holds {n_local:,} tokens",
                        "pass the global cu_seqlens of the batch the inputs were sharded from, as to ctx.shard")


def held_tokens(token_layout, ring: Ring, seq_len: int, n_local: int, causal, cu_seqlens, window) -> tuple:
    """Every member's tokens (``member_tokens``), after checking that this rank holds what the layout gives it."""
    check_share(n_local, token_layout, ring.size, 1, seq_len)
    tokens = member_tokens(token_layout, ring.size, seq_len, causal, cu_seqlens, window)
    if len(tokens[ring.position]) != n_local:
        raise PlanError("q", f"this rank holds {n_local} tokens; the {token_layout} layout gives it "
                        f"{len(tokens[ring.position])}", "shard the inputs with ctx.shard(x, cu_seqlens=...)")
    return tokens


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: dist.ProcessGroup | None = None, *,
                   causal: bool = False, token_layout: str = "contiguous", scale: float | None = None,
                   ranks=None, backend: str | None = None, cu_seqlens=None, window: int | None = None) -> torch.Tensor:
    """Ring attention (zhuzilin/ring-flash-attention scheme) on (batch, local seq, heads, dim) blocks.

    Ring rank p holds the tokens ``ring_tokens(token_layout, P, S)[p]`` of a sequence of
    S = P * local seq tokens; ``ranks`` lists the group's global ranks in ring order (default:
    sorted). K/V may have fewer heads than Q (GQA); only the K/V heads circulate. ``cu_seqlens`` (0, ..., S)
    packs documents that attend only to themselves, ``window`` is a sliding window; rounds they empty are skipped.
    """
    cu, w = check_masks(cu_seqlens, window, None)
    return _RingAttention.apply(q, k, v, group, causal, token_layout, scale,
                                None if ranks is None else tuple(int(r) for r in ranks), backend, cu, w)


def _whole(cu_seqlens):
    """``cu_seqlens`` if it is a sequence of whole numbers (an int cast would cut 5.7 to 5 silently), else a clear
    error."""
    try:
        x = np.asarray(cu_seqlens, dtype=np.float64)
    except (TypeError, ValueError):
        x = None
    if x is None or x.ndim != 1 or not np.all(np.isfinite(x) & (x == np.floor(x))):
        raise PlanError("cu_seqlens", f"{str(cu_seqlens)[:60]} is not a list of whole token positions",
                        "give document boundaries as whole numbers: 0, the end of each document (int32)")
    return cu_seqlens


def check_masks(cu_seqlens, window, seq_len: int | None) -> tuple[tuple[int, ...] | None, int | None]:
    """``cu_seqlens`` as a tuple (checked, against the global ``seq_len`` where given) and ``window`` as an int, or
    None where it covers the longest document (``model.masking_window``: full attention, run as such, so that
    ``ctx.shard`` and the attention lay tokens out alike)."""
    if isinstance(cu_seqlens, torch.Tensor):  # flash-attn's varlen convention: an int32 tensor, on the GPU too
        cu_seqlens = cu_seqlens.tolist()
    if window is not None and (isinstance(window, bool) or not isinstance(window, numbers.Real)
                               or int(window) != window or int(window) < 1):  # "4" from a config, or True
        raise PlanError("window", f"window {window!r} is not a positive whole number of tokens",
                        "pass an int window >= 1, or None")
    w = None if window is None else int(window)
    if cu_seqlens is None:
        return None, w if seq_len is None else masking_window(w, seq_len)
    cu = check_cu_seqlens(_whole(cu_seqlens), seq_len)
    return tuple(int(x) for x in cu), masking_window(w, int(np.diff(cu).max()))


def _registered_ring(q, k, v, *, groups, ranks, causal, token_layout, scale, backend=None, cu_seqlens=None,
                     window=None):
    """The registry's entry: ring attention over groups["ring"] (degree 1: local attention, in tiles under masks)."""
    group = groups.get("ring")
    if degree(group) == 1 and cu_seqlens is None and window is None:
        return local_attention(q, k, v, causal=causal, scale=scale, backend=backend)
    if degree(group) == 1:
        from .ulysses import masked_ulysses  # ulysses imports this module

        cu, w = check_masks(cu_seqlens, window, None)
        return masked_ulysses(q, k, v, None, causal=causal, scale=scale, backend=backend, token_layout=token_layout,
                              cu_seqlens=cu, window=w)
    return ring_attention(q, k, v, group, causal=causal, token_layout=token_layout, scale=scale,
                          ranks=ranks.get("ring"), backend=backend, cu_seqlens=cu_seqlens, window=window)


register("ring", _registered_ring)
