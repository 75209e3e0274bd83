"""TokenRing attention (seeds/001, Algorithm 1) and its hybrid with Ring across nodes (Sec. 3.3.3).

Notation. The ring group's P ranks, listed in ring order (``ranks``, global ranks), hold the
token blocks of ``planner.layout.ring_tokens`` (contiguous, zigzag or striped); ring position p
holds Q_p, K_p, V_p. The hybrid ``tokenring_ring`` cuts the ring into N = P / C *teams* of C
consecutive positions (the ranks of one node): team n is positions nC .. nC + C - 1, and inner
index a = p mod C. A plan states it as ``degrees={"ring": P, "team": C}``; plain ``tokenring``
is the case C = P (one team, no outer ring).

Forward (Algorithm 1, Sec. 3.2, with the outer Ring of Sec. 3.3.3). The outer loop runs N rounds;
in round j every rank holds the K, V block of position ((n - j) mod N) C + a, received over the
outer ring from the same inner index of the previous team while round j - 1 computed (Ring
attention's double buffering, one hop of C positions). Inside a round, C TokenRing steps: at
inner step i rank (n, a) computes the block of Q_o, o = nC + (a + i) mod C, against the K, V it
holds, while
- Q travels one way: the Q block of step i goes to inner index a - 1 for its step i + 1;
- block outputs travel the other way: the (block_out, block_lse) of step i - 1 go straight to
  their owner o (a direct link on a full mesh or a switch) while step i computes,
so each step sends Q to one neighbour and a partial result towards the other side of the ring at
the same time (bidirectional use of the links). The owner folds every partial into its (out,
lse) accumulators with the online-softmax ``merge``; the partial of the last step takes one final
hop to its owner after the compute ends (the paper's "additional communication phase").
Step i = 0 of every round is the rank's own Q and is merged locally.

Causal masks and zigzag. Every block's mask comes from the global token indices (query t sees
key t' iff t >= t'); fully masked blocks are skipped. Only the query rows a block can still use
travel: a Q block carries the rows that see a key of some later holder in the round, and a
partial carries the rows its block attended. With zigzag (the paper's Sec. 3.3.2 choice) the
early chunk of Q_o is needed only by positions before o, so once Q passes position 0 only its
late chunk travels on; with a contiguous layout Q_o stops travelling altogether.

Backward (designed here; the paper gives only the forward). It mirrors the forward: the tuple
(Q, dO, O, LSE) of a query block travels one way exactly as Q did; at each step the rank runs
the FlashAttention-2 block backward against the K, V it holds with the *global* O and LSE, so
block gradients add up exactly (``kernels.block_attention_backward``). dQ of the block is a
partial result and goes straight to its owner (final hop after the last step, as in the
forward); dK, dV of the held block accumulate locally, because K, V never move inside a team.
Across teams (hybrid), K, V circulate again over the outer ring, and the dK, dV accumulator of a
block follows it one round behind: the holder of round j >= 1 adds its team's contributions to
the accumulator received from the holder of round j - 1 and passes it on; the holder of the last
round sends it home, where the owner adds its own round-0 contribution (N - 1 hops, like METP
Algorithm 2's gradient travel).

All traffic is point-to-point on the ring group, addressed by global rank, so no subgroups are
created (``dist.new_group`` would need every rank of the world, which a per-ring call cannot
promise when dp > 1). The team size comes from ``ranks["team"]`` (an int, or this rank's team
as a list of global ranks) or, when absent, from the hostnames of the ring's members (all ranks
of one node that are consecutive in ring order), derived once per ring and cached.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
import torch.distributed as dist

from sp_plan.planner.errors import PlanError
from sp_plan.planner.layout import check_token_layout, ring_tokens

from . import register
from ..kernels import BlockMask, block_attention, block_attention_backward, causal_block_mask, full_block, local_attention
from ..kernels import lse_dtype, merge
from .ring import Ring, make_ring, p2p, wait_all

_TAG_Q, _TAG_PART, _TAG_KV, _TAG_DKV = 100, 110, 120, 130


# ---------------------------------------------------------------- the per-rank schedule

@dataclass(frozen=True)
class TokenRingStep:
    """What one rank does in round j, inner step i (module docstring)."""

    j: int
    i: int
    owner: int  # ring position whose Q block is computed
    kv: int  # ring position whose K, V are held
    mask: BlockMask | None  # the block's mask; None: fully masked, skipped
    send_q: tuple[int, int] | None  # rows of Q_owner sent to inner index a - 1 for step i + 1
    recv_q: tuple[int, int] | None  # rows of the Q block received from inner index a + 1 for step i + 1
    recv_part: tuple[int, tuple[int, int]] | None  # (holder, rows) of this rank's own partial computed now


def _rows(q_tokens: np.ndarray, kmin: int | None, causal: bool) -> tuple[int, int] | None:
    """Query rows that see some key >= kmin: their span, the whole block if not contiguous (as ``_span``)."""
    n = len(q_tokens)
    if not causal:
        return (0, n)
    if kmin is None:
        return None
    idx = np.flatnonzero(q_tokens >= kmin)
    if len(idx) == 0:
        return None
    lo, hi = int(idx[0]), int(idx[-1]) + 1
    return (lo, hi) if hi - lo == len(idx) else (0, n)


@lru_cache(maxsize=256)
def tokenring_schedule(token_layout: str, size: int, team: int, seq_len: int, position: int,
                       causal: bool) -> tuple[TokenRingStep, ...]:
    """Every step of ring position ``position``: N = size/team rounds of ``team`` TokenRing steps (Alg. 1)."""
    check_token_layout(token_layout)
    tokens = ring_tokens(token_layout, size, seq_len)
    n = tokens.shape[1]
    kmin = tokens.min(axis=1)
    C, N = team, size // team
    node, a = divmod(position, C)

    def kvpos(inner: int, j: int) -> int:
        return ((node - j) % N) * C + inner

    def q_need(o: int, j: int, i_from: int):
        """Rows of Q_o that some holder of steps i_from .. C-1 of round j attends."""
        if i_from >= C:
            return None
        return _rows(tokens[o], min(int(kmin[kvpos((o % C - i) % C, j)]) for i in range(i_from, C)), causal)

    steps = []
    for j in range(N):
        kv = kvpos(a, j)
        for i in range(C):
            o = node * C + (a + i) % C
            mask = causal_block_mask(tokens[o], tokens[kv]) if causal else full_block(n, n)
            if mask is not None:
                assert (mask.row_start, mask.row_stop) == _rows(tokens[o], int(kmin[kv]), causal)
            nxt = node * C + (a + i + 1) % C
            recv_part = None
            if i >= 1:
                holder = (a - i) % C
                r = _rows(tokens[position], int(kmin[kvpos(holder, j)]), causal)
                recv_part = (node * C + holder, r) if r is not None else None
            steps.append(TokenRingStep(j, i, o, kv, mask, q_need(o, j, i + 1), q_need(nxt, j, i + 1), recv_part))
    return tuple(steps)


# ---------------------------------------------------------------- point-to-point helpers

@dataclass(frozen=True)
class Teams:
    """The ring and its cut into teams of ``team`` consecutive positions (module docstring)."""

    ring: Ring
    team: int

    @property
    def nodes(self) -> int:
        return self.ring.size // self.team

    def rank(self, position: int) -> int:
        return self.ring.ranks[position % self.ring.size]

    def team_prev(self) -> int:
        """Global rank of inner index a - 1 in this rank's team (where Q goes)."""
        p, C = self.ring.position, self.team
        return self.rank((p // C) * C + (p % C - 1) % C)

    def team_next(self) -> int:
        p, C = self.ring.position, self.team
        return self.rank((p // C) * C + (p % C + 1) % C)


def _row_slice(x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Rows [lo, hi) of a (batch, seq, ...) tensor, contiguous for sending."""
    return x[:, lo:hi].contiguous()


def _lse_slice(x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    return x[..., lo:hi].contiguous()


def _empty_rows(like: torch.Tensor, n: int, dtype=None) -> torch.Tensor:
    return torch.empty((like.shape[0], n, *like.shape[2:]), dtype=dtype or like.dtype, device=like.device)


def _empty_lse(like: torch.Tensor, n: int) -> torch.Tensor:
    return torch.empty((*like.shape[:-1], n), dtype=like.dtype, device=like.device)


# ---------------------------------------------------------------- forward

def _outer_kv_shift(g, teams, cur_k: torch.Tensor, cur_v: torch.Tensor):
    """Outer Ring of TokenRing x Ring: send this K, V block one team on, receive the previous team's."""
    p, C = teams.ring.position, teams.team
    kv_next = (torch.empty_like(cur_k), torch.empty_like(cur_v))
    reqs = p2p(g, [(cur_k, teams.rank(p + C), _TAG_KV), (cur_v, teams.rank(p + C), _TAG_KV + 1)],
               [(kv_next[0], teams.rank(p - C), _TAG_KV), (kv_next[1], teams.rank(p - C), _TAG_KV + 1)])
    return kv_next, reqs


def tokenring_forward(q, k, v, teams: Teams, steps, scale, backend=None) -> tuple[torch.Tensor, torch.Tensor]:
    """TokenRing forward (Algorithm 1; hybrid: Sec. 3.3.3): Q one way, (block_out, block_lse) to their owners."""
    ring, C, N = teams.ring, teams.team, teams.nodes
    g = ring.group
    acc = lse_dtype(q.dtype)
    b, n, h, _ = q.shape
    out = q.new_zeros(b, n, h, v.shape[-1], dtype=acc)
    lse = torch.full((b, h, n), float("-inf"), dtype=acc, device=q.device)
    cur_q, lo = q, 0
    cur_k, cur_v = k, v
    pending = None  # (owner position, block_out, block_lse): partial of the previous step
    expect = None  # (holder position, rows): this rank's partial computed in the previous step
    kv_reqs, kv_next = [], None
    for s in steps:
        sends, recvs = [], []
        nxt_q = None
        if s.send_q is not None:
            sends.append((_row_slice(cur_q, s.send_q[0] - lo, s.send_q[1] - lo), teams.team_prev(), _TAG_Q))
        if s.recv_q is not None:
            nxt_q = _empty_rows(q, s.recv_q[1] - s.recv_q[0])
            recvs.append((nxt_q, teams.team_next(), _TAG_Q))
        if pending is not None:
            dst, p_out, p_lse = pending
            sends += [(p_out, teams.rank(dst), _TAG_PART), (p_lse, teams.rank(dst), _TAG_PART + 1)]
        got = None
        if expect is not None:
            src, (r0, r1) = expect
            got = (_empty_rows(out, r1 - r0, q.dtype), _empty_lse(lse, r1 - r0), (r0, r1))
            recvs += [(got[0], teams.rank(src), _TAG_PART), (got[1], teams.rank(src), _TAG_PART + 1)]
        reqs = p2p(g, sends, recvs)
        if s.i == 0 and s.j < N - 1:  # outer Ring: the K, V block for round j + 1
            kv_next, kv_reqs = _outer_kv_shift(g, teams, cur_k, cur_v)
        pending = None
        bm = s.mask
        if bm is not None:
            r0, r1 = bm.row_start, bm.row_stop
            b_out, b_lse = block_attention(cur_q[:, r0 - lo:r1 - lo], cur_k[:, bm.col_start:bm.col_stop],
                                           cur_v[:, bm.col_start:bm.col_stop], scale=scale,
                                           causal_offset=bm.causal_offset, mask=bm.mask, backend=backend)
            if s.i == 0:
                merge(out[:, r0:r1], lse[..., r0:r1], b_out, b_lse)
            else:
                pending = (s.owner, b_out.contiguous(), b_lse.to(acc).contiguous())
        wait_all(reqs)
        if got is not None:
            r0, r1 = got[2]
            merge(out[:, r0:r1], lse[..., r0:r1], got[0], got[1])
        expect = s.recv_part
        if nxt_q is not None:
            cur_q, lo = nxt_q, s.recv_q[0]
        elif s.i == C - 1:
            cur_q, lo = q, 0
        if s.i == C - 1 and s.j < N - 1:
            wait_all(kv_reqs)
            cur_k, cur_v = kv_next
    # the final hop: the last step's partial goes to its owner
    sends, recvs, got = [], [], None
    if pending is not None:
        dst, p_out, p_lse = pending
        sends += [(p_out, teams.rank(dst), _TAG_PART), (p_lse, teams.rank(dst), _TAG_PART + 1)]
    if expect is not None:
        src, (r0, r1) = expect
        got = (_empty_rows(out, r1 - r0, q.dtype), _empty_lse(lse, r1 - r0), (r0, r1))
        recvs += [(got[0], teams.rank(src), _TAG_PART), (got[1], teams.rank(src), _TAG_PART + 1)]
    wait_all(p2p(g, sends, recvs))
    if got is not None:
        r0, r1 = got[2]
        merge(out[:, r0:r1], lse[..., r0:r1], got[0], got[1])
    return out.to(q.dtype), lse


# ---------------------------------------------------------------- backward

def tokenring_backward(dout, q, k, v, out, lse, teams: Teams, steps, scale, backend=None):
    """TokenRing backward (module docstring): (Q, dO, O, LSE) one way, dQ partials to their owners,
    dK, dV local inside a team and one round behind K, V on the outer ring."""
    ring, C, N = teams.ring, teams.team, teams.nodes
    g = ring.group
    acc = lse_dtype(q.dtype)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dk_own = torch.zeros(k.shape, dtype=acc, device=k.device)
    dv_own = torch.zeros(v.shape, dtype=acc, device=v.device)
    dout = dout.contiguous()
    own = (q, dout, out, lse)
    cur, lo = own, 0
    cur_k, cur_v = k, v
    pending = expect = None
    kv_reqs, kv_next = [], None
    dkv_reqs, dkv_in = [], None  # the accumulator arriving from the previous team's holder
    dk_r = dv_r = None
    for s in steps:
        if s.i == 0:
            dk_r, dv_r = (dk_own, dv_own) if s.j == 0 else (torch.zeros_like(dk_own), torch.zeros_like(dv_own))
        sends, recvs = [], []
        nxt = None
        if s.send_q is not None:
            a0, a1 = s.send_q[0] - lo, s.send_q[1] - lo
            dst = teams.team_prev()
            sends += [(_row_slice(x, a0, a1), dst, _TAG_Q + t) for t, x in enumerate(cur[:3])]
            sends.append((_lse_slice(cur[3], a0, a1), dst, _TAG_Q + 3))
        if s.recv_q is not None:
            m = s.recv_q[1] - s.recv_q[0]
            nxt = (_empty_rows(q, m), _empty_rows(dout, m), _empty_rows(out, m), _empty_lse(lse, m))
            recvs += [(x, teams.team_next(), _TAG_Q + t) for t, x in enumerate(nxt)]
        if pending is not None:
            sends.append((pending[1], teams.rank(pending[0]), _TAG_PART))
        got = None
        if expect is not None:
            src, (r0, r1) = expect
            got = (_empty_rows(q, r1 - r0, acc), (r0, r1))
            recvs.append((got[0], teams.rank(src), _TAG_PART))
        reqs = p2p(g, sends, recvs)
        if s.i == 0 and s.j < N - 1:  # outer Ring: the K, V block for round j + 1
            kv_next, kv_reqs = _outer_kv_shift(g, teams, cur_k, cur_v)
        pending = None
        bm = s.mask
        if bm is not None:
            r0, r1 = bm.row_start - lo, bm.row_stop - lo
            c0, c1 = bm.col_start, bm.col_stop
            cq, cdo, co, cl = cur
            gq, gk, gv = block_attention_backward(cdo[:, r0:r1], cq[:, r0:r1], cur_k[:, c0:c1], cur_v[:, c0:c1],
                                                  co[:, r0:r1], cl[..., r0:r1], scale=scale,
                                                  causal_offset=bm.causal_offset, mask=bm.mask,
                                                  backend=backend)
            dk_r[:, c0:c1] += gk
            dv_r[:, c0:c1] += gv
            if s.i == 0:
                dq[:, bm.row_start:bm.row_stop] += gq
            else:
                pending = (s.owner, gq.to(acc).contiguous())
        wait_all(reqs)
        if got is not None:
            r0, r1 = got[1]
            dq[:, r0:r1] += got[0]
        expect = s.recv_part
        if nxt is not None:
            cur, lo = nxt, s.recv_q[0]
        elif s.i == C - 1:
            cur, lo = own, 0
        if s.i == C - 1 and s.j >= 1:  # the held block's dK, dV move on, one round behind K, V
            wait_all(dkv_reqs)
            if dkv_in is not None:
                dk_r += dkv_in[0]
                dv_r += dkv_in[1]
            dkv_in = (torch.empty_like(dk_own), torch.empty_like(dv_own))
            dkv_reqs = p2p(g, [(dk_r, teams.rank(ring.position + C), _TAG_DKV),
                                (dv_r, teams.rank(ring.position + C), _TAG_DKV + 1)],
                            [(dkv_in[0], teams.rank(ring.position - C), _TAG_DKV),
                             (dkv_in[1], teams.rank(ring.position - C), _TAG_DKV + 1)])
        if s.i == C - 1 and s.j < N - 1:
            wait_all(kv_reqs)
            cur_k, cur_v = kv_next
    sends, recvs, got = [], [], None
    if pending is not None:
        sends.append((pending[1], teams.rank(pending[0]), _TAG_PART))
    if expect is not None:
        src, (r0, r1) = expect
        got = (_empty_rows(q, r1 - r0, acc), (r0, r1))
        recvs.append((got[0], teams.rank(src), _TAG_PART))
    wait_all(p2p(g, sends, recvs))
    if got is not None:
        dq[:, got[1][0]:got[1][1]] += got[0]
    if N > 1:  # the last round's holder sent this rank's own block home
        wait_all(dkv_reqs)
        dk_own += dkv_in[0]
        dv_own += dkv_in[1]
    return dq.to(q.dtype), dk_own.to(k.dtype), dv_own.to(v.dtype)


# ---------------------------------------------------------------- autograd and entry points

class _TokenRingAttention(torch.autograd.Function):
    """Autograd wrapper: TokenRing forward and backward (module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, group, causal, token_layout, scale, ranks, team, backend=None):
        ring = make_ring(group, ranks)
        teams = Teams(ring, team or ring.size)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        steps = tokenring_schedule(token_layout, ring.size, teams.team, q.shape[1] * ring.size, ring.position,
                                   bool(causal))
        out, lse = tokenring_forward(q, k, v, teams, steps, scale, backend)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.teams, ctx.steps, ctx.scale, ctx.backend = teams, steps, scale, backend
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = tokenring_backward(dout, q, k, v, out, lse, ctx.teams, ctx.steps, ctx.scale,
                                         ctx.backend)
        return dq, dk, dv, None, None, None, None, None, None, None


def _check_team(team: int, size: int) -> None:
    if team < 1 or size % team:
        raise PlanError("degrees.team", f"team {team} does not divide the ring of {size}",
                        "choose a team size (ranks per node) that divides the ring degree")


def tokenring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: dist.ProcessGroup | None = None, *,
                        causal: bool = False, token_layout: str = "contiguous", scale: float | None = None,
                        ranks=None, backend: str | None = None) -> torch.Tensor:
    """TokenRing attention (seeds/001 Algorithm 1) on (batch, local seq, heads, dim) blocks of the ring group.

    Ring position p holds ``ring_tokens(token_layout, P, S)[p]``; ``ranks`` lists the group's
    global ranks in ring order (default: sorted). K/V may have fewer heads than Q (GQA).
    """
    return _TokenRingAttention.apply(q, k, v, group, causal, token_layout, scale,
                                     None if ranks is None else tuple(int(r) for r in ranks), None, backend)


def tokenring_ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             group: dist.ProcessGroup | None = None, *, team: int, causal: bool = False,
                             token_layout: str = "contiguous", scale: float | None = None,
                             ranks=None, backend: str | None = None) -> torch.Tensor:
    """TokenRing inside teams of ``team`` consecutive ring positions, Ring across teams (seeds/001 Sec. 3.3.3)."""
    size = dist.get_world_size(group) if group is not None else dist.get_world_size()
    _check_team(int(team), size)
    return _TokenRingAttention.apply(q, k, v, group, causal, token_layout, scale,
                                     None if ranks is None else tuple(int(r) for r in ranks), int(team), backend)


_NODE_TEAMS: dict = {}


def node_team(group, ranks) -> int:
    """Ranks per node of a ring: consecutive ring positions sharing a hostname (collective on the ring, cached)."""
    ring = make_ring(group, ranks)
    key = ring.ranks
    if key not in _NODE_TEAMS:
        hosts: list = [None] * ring.size
        dist.all_gather_object(hosts, socket.gethostname(), group=group)
        by_rank = dict(zip(sorted(ring.ranks), hosts))  # all_gather fills in group-rank order
        order = [by_rank[r] for r in ring.ranks]
        runs = [1]
        for x, y in zip(order, order[1:]):
            runs[-1:] = [runs[-1] + 1] if x == y else [runs[-1], 1]
        if len(set(runs)) != 1 or len(set(order)) != len(runs):
            raise PlanError("ranks.ring", f"the ring's nodes hold uneven or scattered runs of ranks ({runs})",
                            "place each node's ranks next to each other in the ring, the same number per node, "
                            "or pass ranks['team']")
        _NODE_TEAMS[key] = runs[0]
    return _NODE_TEAMS[key]


def _team_from(ranks: dict, group) -> int:
    t = ranks.get("team")
    if t is None:
        return node_team(group, ranks.get("ring"))
    return int(t) if isinstance(t, (int, np.integer)) else len(t)


def _registered_tokenring(q, k, v, *, groups, ranks, causal, token_layout, scale, backend=None):
    group = groups.get("ring")
    if group is None or dist.get_world_size(group) == 1:
        return local_attention(q, k, v, causal=causal, scale=scale, backend=backend)
    return tokenring_attention(q, k, v, group, causal=causal, token_layout=token_layout, scale=scale,
                               ranks=ranks.get("ring"), backend=backend)


def _registered_tokenring_ring(q, k, v, *, groups, ranks, causal, token_layout, scale, backend=None):
    group = groups.get("ring")
    if group is None or dist.get_world_size(group) == 1:
        return local_attention(q, k, v, causal=causal, scale=scale, backend=backend)
    return tokenring_ring_attention(q, k, v, group, team=_team_from(ranks, group), causal=causal,
                                    token_layout=token_layout, scale=scale, ranks=ranks.get("ring"),
                                    backend=backend)


register("tokenring", _registered_tokenring)
register("tokenring_ring", _registered_tokenring_ring)
