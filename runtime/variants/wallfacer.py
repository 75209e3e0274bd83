"""WallFacer attention (Liu et al. 2024, Algorithms 1-3): teams of C ranks inside a ring of P.

Layout (``planner.layout``): ring position p holds the ring's tokens (``ring_tokens``); it is
member a of team t (``team_coords``: a team's members adjacent for collective_intra, sub-rings
adjacent for p2p_intra, WallFacer eq. 8). Teams t = g P/C^2 + i form team group g; member a of
those teams is sub-ring (g, a), whose i-th rank belongs to team g P/C^2 + i.

Forward (Algorithm 1). The team all-gathers Q, K, V (members in order a), so each member holds
its team's C N/P tokens. Algorithm 2 sends the team's K, V to member t mod C of team
a P/C^2 + t // C, so sub-ring (g, a) starts with the K, V of teams i C + a, i < P/C^2: the C
sub-rings of a team's members see disjoint C-ths of the sequence's K, V, together all of it.
P/C^2 double-buffered rounds follow: attend the team's Q to the K, V block held, merge (out, lse)
online, pass the block to the next sub-ring rank (Algorithm 3). The C members' partial results
then combine by their LSE: all-gather the LSE in the team, lse = logsumexp over members,
scale each partial output by exp(lse_m - lse) and reduce-scatter the sum, so member a ends with
the exact output of its own tokens.

Backward (Sec. 3.2.1). The team all-gathers Q, K, V, O and dO; K, V take Algorithm 2's places
again and stay, accumulating dK, dV. The Q bundle (Q, O, dO and the team's LSE saved by the
forward) goes round the sub-ring, one round ahead, with its dQ accumulator one hop behind, as
FlashAttention-2's block backward (``kernels.block_attention_backward``) runs against the fixed
K, V with the global (O, LSE). After P/C^2 rounds dQ takes a final hop home; dK, dV return to the
team whose K, V they are (Algorithm 2 reversed); a reduce-scatter in the team sums the C partial
dQ, dK, dV and leaves each member the gradients of its own tokens.

Masks come from the global token indices of the team blocks (``planner.layout.team_tokens``), so
contiguous, zigzag and striped layouts are all exact. Under a causal mask a team block runs as its
C^2 member blocks, each cut to its attended rows and columns as in Ring attention; fully masked
ones are skipped, but their rank still takes part in every transfer. Accumulators and the
combine run in float32 (float64 for float64 input); tensors are (batch, local seq, heads, head
dim) and K, V may have fewer heads (GQA).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.distributed as dist

from sp_plan.planner.errors import PlanError
from sp_plan.planner.layout import (check_team, init_recv, init_send, p2p_neighbours, sub_ring_coords,
                                    team_coords, team_positions, team_tokens, wallfacer_pairs)

from . import register
from ..kernels import (BlockMask, block_attention, block_attention_backward, causal_block_mask, full_block, lse_dtype,
                      local_attention, merge)
from .ring import Carried, Ring

_TAG_PLACE, _TAG_KV, _TAG_Q, _TAG_DQ, _TAG_RETURN = 10, 20, 30, 40, 50


@dataclass(frozen=True)
class Teams:
    """This rank's place in WallFacer: ring (global ranks in ring order), C, placement, team and sub-ring."""

    ring: tuple[int, ...]
    C: int
    placement: str | None
    position: int
    team_group: dist.ProcessGroup | None
    p2p_group: dist.ProcessGroup | None  # the sub-ring's (Algorithm 3)
    ring_group: dist.ProcessGroup | None = None  # Algorithm 2's transfers (None: the world)

    @property
    def P(self) -> int:
        return len(self.ring)

    @property
    def rounds(self) -> int:
        """P/C^2 sub-ring rounds (Algorithm 1, line 5)."""
        return self.P // (self.C * self.C)

    @property
    def team_ranks(self) -> tuple[int, ...]:
        """Global ranks of this rank's team, by member index a (the all-gather order)."""
        t, _ = team_coords(self.P, self.C, self.placement, self.position)
        return tuple(self.ring[p] for p in team_positions(self.P, self.C, self.placement)[t])

    @property
    def member(self) -> int:
        return team_coords(self.P, self.C, self.placement, self.position)[1]

    @property
    def send_to(self) -> int:
        """Algorithm 2: where this rank's team K, V go first."""
        return self.ring[init_send(self.P, self.C, self.placement, self.position)]

    @property
    def recv_from(self) -> int:
        """Inverse of Algorithm 2: whose team K, V this rank holds first."""
        return self.ring[init_recv(self.P, self.C, self.placement, self.position)]

    def sub_ring(self) -> Ring:
        """Algorithm 3's sub-ring as a ``ring.Ring`` (its shift sends to next, receives from last)."""
        _, _, i = sub_ring_coords(self.P, self.C, self.placement, self.position)
        nxt, last = p2p_neighbours(self.P, self.C, self.placement, self.position)
        n = self.rounds
        # a ring of n ranks in order whose neighbours are Algorithm 3's
        ranks, p = [None] * n, self.position
        ranks[i] = self.ring[p]
        for k in range(1, n):
            p = p2p_neighbours(self.P, self.C, self.placement, p)[0]
            ranks[(i + k) % n] = self.ring[p]
        assert ranks[(i + 1) % n] == self.ring[nxt] and ranks[(i - 1) % n] == self.ring[last]
        return Ring(tuple(ranks), i, self.p2p_group)


def placement_of(ring: tuple[int, ...], team: tuple[int, ...]) -> str | None:
    """Which placement of eq. 8 puts ``team`` (global ranks by member) together in ``ring``."""
    P, C = len(ring), len(team)
    if C == 1:
        return None
    for pl in ("collective_intra", "p2p_intra"):
        for members in team_positions(P, C, pl):
            if tuple(ring[p] for p in members) == tuple(team):
                return pl
    raise PlanError("ranks.team", f"team {list(team)} is a team of neither placement of ring {list(ring)}",
                    "pass the layout's team (planner.layout.Layout.groups(('team',)))")


def make_teams(ring_ranks, team_ranks, team_group=None, p2p_group=None, ring_group=None) -> Teams:
    """This rank's Teams from its ring (global ranks in ring order) and its team (global ranks by member)."""
    ring = tuple(int(r) for r in ring_ranks)
    team = tuple(int(r) for r in team_ranks)
    check_team(len(ring), len(team))
    me = dist.get_rank()
    if me not in ring or me not in team:
        raise PlanError("ranks", f"rank {me} is not in ring {list(ring)} and team {list(team)}",
                        "call wallfacer attention with this rank's own ring and team")
    return Teams(ring, len(team), placement_of(ring, team), ring.index(me), team_group, p2p_group, ring_group)


# ---------------------------------------------------------------- masks

@lru_cache(maxsize=1024)
def round_masks(token_layout: str, P: int, C: int, placement: str | None, seq_len: int, position: int,
                causal: bool, backward: bool) -> tuple[tuple[BlockMask, ...], ...]:
    """Attended pieces of each sub-ring round's team block pair (``wallfacer_pairs``), in team coordinates.

    Causal: one piece per (query member, K/V member) pair, each reduced as a ring block
    (``causal_block_mask``: full, diagonal offset or mask; fully masked pairs are dropped), so a
    team block costs what its C^2 ring blocks cost. Full attention: the whole team block.
    """
    pairs = wallfacer_pairs(P, C, placement, backward)[position]
    n = seq_len // P
    if not causal:
        return tuple((full_block(C * n, C * n),) for _ in pairs)
    tok = team_tokens(token_layout, P, C, placement, seq_len)
    out = []
    for qt, kt in pairs:
        pieces = []
        for a in range(C):
            for b in range(C):
                bm = causal_block_mask(tok[qt][a * n:(a + 1) * n], tok[kt][b * n:(b + 1) * n])
                if bm is not None:
                    pieces.append(BlockMask(bm.row_start + a * n, bm.row_stop + a * n, bm.col_start + b * n,
                                            bm.col_stop + b * n, bm.causal_offset, bm.mask))
        out.append(tuple(pieces))
    return tuple(out)


def _rows_cols(bm: BlockMask) -> tuple[slice, slice]:
    return slice(bm.row_start, bm.row_stop), slice(bm.col_start, bm.col_stop)


# ---------------------------------------------------------------- team collectives

def _group_order(w: Teams) -> list[int]:
    """Member index of each group rank (all_gather and reduce_scatter follow sorted global ranks)."""
    team = w.team_ranks
    return [team.index(r) for r in sorted(team)]


def team_gather(w: Teams, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """All-gather (Algorithm 1, line 1) of several (b, n, ., .) tensors in one call; the team's along dim 1."""
    if w.C == 1:
        return list(tensors)
    flat = torch.cat([t.contiguous().reshape(-1) for t in tensors])
    parts = [torch.empty_like(flat) for _ in range(w.C)]
    dist.all_gather(parts, flat, group=w.team_group)
    by_member = [None] * w.C
    for j, a in enumerate(_group_order(w)):
        by_member[a] = parts[j]
    out, off = [], 0
    for t in tensors:
        k = t.numel()
        out.append(torch.cat([p[off:off + k].view(t.shape) for p in by_member], dim=1))
        off += k
    return out


def team_reduce_scatter(w: Teams, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Reduce-scatter (sum) of several team-length tensors: member a keeps its slice a along dim 1."""
    if w.C == 1:
        return list(tensors)
    pieces = [[t.chunk(w.C, dim=1)[a] for t in tensors] for a in range(w.C)]
    flats = [torch.cat([p.contiguous().reshape(-1) for p in pieces[a]]) for a in _group_order(w)]
    out = torch.empty_like(flats[0])
    dist.reduce_scatter(out, flats, group=w.team_group)
    res, off = [], 0
    for p in pieces[w.member]:
        res.append(out[off:off + p.numel()].view(p.shape))
        off += p.numel()
    return res


def _exchange(w: Teams, send: list[torch.Tensor], dst: int, src: int, tag: int) -> list[torch.Tensor]:
    """Send tensors to ``dst`` and receive as many of the same shapes from ``src`` (Algorithm 2)."""
    me = dist.get_rank()
    if dst == me:
        assert src == me
        return send
    recv = [torch.empty_like(t) for t in send]
    ops = [dist.P2POp(dist.isend, t.contiguous(), dst, w.ring_group, tag + j) for j, t in enumerate(send)]
    ops += [dist.P2POp(dist.irecv, t, src, w.ring_group, tag + j) for j, t in enumerate(recv)]
    for r in dist.batch_isend_irecv(ops):
        r.wait()
    return recv


# ---------------------------------------------------------------- forward

def wallfacer_forward(q, k, v, w: Teams, masks, scale, backend=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Algorithm 1: (out of this rank's tokens, lse of the team's tokens)."""
    acc = lse_dtype(q.dtype)
    q_t, k_t, v_t = team_gather(w, [q, k, v])
    cur_k, cur_v = _exchange(w, [k_t, v_t], w.send_to, w.recv_from, _TAG_PLACE)  # Algorithm 2
    ring = w.sub_ring()
    b, n, h, _ = q_t.shape
    out = q_t.new_zeros(b, n, h, v.shape[-1], dtype=acc)
    lse = torch.full((b, h, n), float("-inf"), dtype=acc, device=q.device)
    spare = None
    for i in range(ring.size):
        last = i + 1 == ring.size
        if not last:
            nxt = spare if spare is not None else (torch.empty_like(cur_k), torch.empty_like(cur_v))
            reqs = ring.shift([cur_k, cur_v], list(nxt), _TAG_KV)
        for bm in masks[i]:
            rows, cols = _rows_cols(bm)
            b_out, b_lse = block_attention(q_t[:, rows], cur_k[:, cols], cur_v[:, cols], scale=scale,
                                           causal_offset=bm.causal_offset, mask=bm.mask, backend=backend)
            merge(out[:, rows], lse[..., rows], b_out, b_lse)
        if not last:
            for r in reqs:
                r.wait()
            spare = (cur_k, cur_v) if cur_k is not k else None  # never write into the caller's k, v
            cur_k, cur_v = nxt
    if w.C == 1:
        return out.to(q.dtype), lse
    # ReduceScatter_combine (Algorithm 1, line 11): weights exp(lse_m - lse) of the members' partials
    parts = [torch.empty_like(lse) for _ in range(w.C)]
    dist.all_gather(parts, lse, group=w.team_group)
    lse_team = torch.logsumexp(torch.stack(parts), dim=0)
    ref = lse_team.masked_fill(torch.isneginf(lse_team), 0.0)
    out.mul_(torch.exp(lse - ref).transpose(1, 2).unsqueeze(-1))
    (mine,) = team_reduce_scatter(w, [out])
    return mine.to(q.dtype), lse_team


# ---------------------------------------------------------------- backward

def wallfacer_backward(dout, q, k, v, out, lse_team, w: Teams, masks, scale, backend=None):
    """Sec. 3.2.1: K, V (and dK, dV) stay; the Q bundle and dQ go round the sub-ring; dQ hops home."""
    acc = lse_dtype(q.dtype)
    q_t, k_t, v_t, o_t, do_t = team_gather(w, [q, k, v, out, dout])
    kk, vv = _exchange(w, [k_t, v_t], w.send_to, w.recv_from, _TAG_PLACE)  # Algorithm 2 again
    ring = w.sub_ring()
    dk = torch.zeros(kk.shape, dtype=acc, device=kk.device)
    dv = torch.zeros(vv.shape, dtype=acc, device=vv.device)
    bundle, spare = (q_t, o_t, do_t, lse_team.contiguous()), None
    carried = Carried(ring, _TAG_DQ)
    for i in range(ring.size):
        last = i + 1 == ring.size
        if not last:
            nxt = spare if spare is not None else tuple(torch.empty_like(t) for t in bundle)
            q_reqs = ring.shift(list(bundle), list(nxt), _TAG_Q)
        (dq,) = carried.take(i == 0, lambda: (torch.zeros(q_t.shape, dtype=acc, device=q.device),))
        qq, oo, ddo, ll = bundle
        for bm in masks[i]:
            rows, cols = _rows_cols(bm)
            g = block_attention_backward(ddo[:, rows], qq[:, rows], kk[:, cols], vv[:, cols], oo[:, rows],
                                         ll[..., rows], scale=scale, causal_offset=bm.causal_offset, mask=bm.mask,
                                         backend=backend)
            dq[:, rows] += g[0]
            dk[:, cols] += g[1]
            dv[:, cols] += g[2]
        if ring.size > 1:  # dQ one hop behind its bundle; after the last round this is the hop home
            carried.send((dq,))
        if not last:
            for r in q_reqs:
                r.wait()
            spare = bundle if i > 0 else None  # round 0's bundle holds the gathered tensors: keep them
            bundle = nxt
    if ring.size > 1:
        (dq,) = carried.home()
    dk_t, dv_t = _exchange(w, [dk, dv], w.recv_from, w.send_to, _TAG_RETURN)  # Algorithm 2 reversed
    dq_l, dk_l, dv_l = team_reduce_scatter(w, [dq, dk_t, dv_t])
    return dq_l.to(q.dtype), dk_l.to(k.dtype), dv_l.to(v.dtype)


class _WallFacerAttention(torch.autograd.Function):
    """Autograd wrapper: Algorithm 1 forward, the Sec. 3.2.1 backward."""

    @staticmethod
    def forward(ctx, q, k, v, teams, causal, token_layout, scale, backend):
        w = teams
        seq = q.shape[1] * w.P
        causal = bool(causal)
        fwd = round_masks(token_layout, w.P, w.C, w.placement, seq, w.position, causal, False)
        out, lse_team = wallfacer_forward(q, k.contiguous(), v.contiguous(), w, fwd, scale, backend)
        ctx.save_for_backward(q, k, v, out, lse_team)
        ctx.w, ctx.scale, ctx.backend = w, scale, backend
        ctx.bwd = round_masks(token_layout, w.P, w.C, w.placement, seq, w.position, causal, True)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse_team = ctx.saved_tensors
        dq, dk, dv = wallfacer_backward(dout.contiguous(), q, k, v, out, lse_team, ctx.w, ctx.bwd, ctx.scale,
                                        ctx.backend)
        return dq, dk, dv, None, None, None, None, None


def wallfacer_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, ring_ranks, team_ranks,
                        team_group: dist.ProcessGroup | None = None, p2p_group: dist.ProcessGroup | None = None,
                        ring_group: dist.ProcessGroup | None = None, causal: bool = False,
                        token_layout: str = "contiguous", scale: float | None = None,
                        backend: str | None = None) -> torch.Tensor:
    """WallFacer attention on (batch, local seq, heads, dim) shards of a ring's token layout.

    ``ring_ranks``: the ring's global ranks in ring order (ring position p holds
    ``ring_tokens(token_layout, P, S)[p]``); ``team_ranks``: this rank's team by member index
    (``Layout.groups(("team",))``), whose placement is recognised; ``team_group`` its process
    group (needed for C > 1); ``p2p_group`` the sub-ring's and ``ring_group`` the ring's, for the
    point-to-point transfers (default: the world).
    """
    w = make_teams(ring_ranks, team_ranks, team_group, p2p_group, ring_group)
    if w.C > 1 and team_group is None:
        raise PlanError("groups.team", f"team of {w.C} ranks without a process group",
                        "pass the team's process group (runtime.context builds it)")
    return _WallFacerAttention.apply(q, k, v, w, causal, token_layout, scale, backend)


def _attention(q, k, v, *, groups, ranks, causal, token_layout, scale, backend=None):
    """The registry's entry: groups/ranks as ``runtime.context`` passes them ("ring", "team", "sub_ring")."""
    ring_g = groups.get("ring")
    ring_ranks = ranks.get("ring") or (dist.get_process_group_ranks(ring_g) if ring_g is not None else None)
    if ring_ranks is None or len(ring_ranks) == 1:
        return local_attention(q, k, v, causal=causal, scale=scale, backend=backend)
    team = ranks.get("team") or [dist.get_rank()]
    return wallfacer_attention(q, k, v, ring_ranks=ring_ranks, team_ranks=team, team_group=groups.get("team"),
                               p2p_group=groups.get("sub_ring"), ring_group=ring_g, causal=causal,
                               token_layout=token_layout, scale=scale, backend=backend)


register("wallfacer", _attention)
