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
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
import torch.distributed as dist

from sp_plan.planner.errors import PlanError
from sp_plan.planner.layout import check_token_layout, ring_split, ring_tokens, team_coords, team_position

from . import register
from ..kernels import BlockMask, block_attention, block_attention_backward, causal_block_mask, full_block, local_attention
from ..kernels import lse_dtype, merge
from .ring import Ring, TrailingSum, make_ring, p2p, wait_all

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
    """The ring and its cut into teams of ``team`` consecutive positions (module docstring; the layout module's
    ``team_position`` with teams inside, as the planner's ``team`` and ``team_ring`` groups)."""

    ring: Ring
    team: int

    @property
    def nodes(self) -> int:
        return self.ring.size // self.team

    @property
    def across(self) -> int:
        """Ring positions between a member and the same member of the next team (``layout.ring_split``)."""
        return ring_split(self.ring.size, self.team, None, "team_ring")[1] or self.team

    def rank(self, position: int) -> int:
        return self.ring.ranks[position % self.ring.size]

    def _member(self, step: int) -> int:
        """Global rank of the member ``step`` inner indices along in this rank's team."""
        t, a = team_coords(self.ring.size, self.team, None, self.ring.position)
        return self.rank(team_position(self.ring.size, self.team, None, t, (a + step) % self.team))

    def team_prev(self) -> int:
        """Global rank of inner index a - 1 in this rank's team (where Q goes)."""
        return self._member(-1)

    def team_next(self) -> int:
        return self._member(1)


def _row_slice(x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Rows [lo, hi) of a (batch, seq, ...) tensor, contiguous for sending."""
    return x[:, lo:hi].contiguous()


def _lse_slice(x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    return x[..., lo:hi].contiguous()


def _empty_rows(like: torch.Tensor, n: int, dtype=None) -> torch.Tensor:
    return torch.empty((like.shape[0], n, *like.shape[2:]), dtype=dtype or like.dtype, device=like.device)


def _empty_lse(like: torch.Tensor, n: int) -> torch.Tensor:
    return torch.empty((*like.shape[:-1], n), dtype=like.dtype, device=like.device)


# ---------------------------------------------------------------- one pass over the schedule

@dataclass(frozen=True)
class _Flow:
    """What a pass moves: the query tuple (Q; or Q, dO, O, LSE) and its partials (block out, LSE; or dQ)."""

    own: tuple[torch.Tensor, ...]  # this rank's query tuple; an LSE, if any, comes last
    own_lse: bool  # the query tuple ends with an LSE (rows on its last axis)
    new_part: Callable[[int], tuple[torch.Tensor, ...]]  # receive buffers of a partial of n rows
    part_dtypes: tuple  # dtype each partial tensor travels in (None: as computed)
    fold: Callable[[int, int, tuple], None]  # fold a partial of own rows [r0, r1) into the accumulators


def _take(xs: tuple, lo: int, hi: int, lse_last: bool) -> tuple:
    """Rows [lo, hi) of each tensor, contiguous for sending; a trailing LSE is cut on its last axis."""
    return tuple((_lse_slice if lse_last and t == len(xs) - 1 else _row_slice)(x, lo, hi) for t, x in enumerate(xs))


def _view(xs: tuple, lo: int, hi: int, lse_last: bool) -> tuple:
    """Rows [lo, hi) of each tensor as views; a trailing LSE is cut on its last axis."""
    return tuple(x[..., lo:hi] if lse_last and t == len(xs) - 1 else x[:, lo:hi] for t, x in enumerate(xs))


def _new_rows(like: tuple, n: int, lse_last: bool) -> tuple:
    """Receive buffers of n rows shaped like ``like``; a trailing LSE gets n entries on its last axis."""
    return tuple(_empty_lse(x, n) if lse_last and t == len(like) - 1 else _empty_rows(x, n)
                 for t, x in enumerate(like))


@dataclass
class _Exchange:
    """One step's traffic, posted as one batch (Alg. 1): Q rows to a - 1 and a partial to its owner, and their
    mirror receives: the next Q block from a + 1 and this rank's own partial from its holder."""

    reqs: list
    q_next: tuple | None = None  # the query tuple of the next step
    got: tuple | None = None  # (rows, tensors): this rank's partial

    @classmethod
    def post(cls, teams: Teams, flow: _Flow, cur: tuple, lo: int, step: TokenRingStep | None, pending,
             expect) -> _Exchange:
        """Post the step's sends and receives; ``step`` None is the final hop, partials only."""
        sends, recvs, q_next, got = [], [], None, None
        if step is not None and step.send_q is not None:
            xs = _take(cur, step.send_q[0] - lo, step.send_q[1] - lo, flow.own_lse)
            sends += [(x, teams.team_prev(), _TAG_Q + t) for t, x in enumerate(xs)]
        if step is not None and step.recv_q is not None:
            q_next = _new_rows(flow.own, step.recv_q[1] - step.recv_q[0], flow.own_lse)
            recvs += [(x, teams.team_next(), _TAG_Q + t) for t, x in enumerate(q_next)]
        if pending is not None:
            dst, xs = pending
            sends += [(x, teams.rank(dst), _TAG_PART + t) for t, x in enumerate(xs)]
        if expect is not None:
            src, (r0, r1) = expect
            got = ((r0, r1), flow.new_part(r1 - r0))
            recvs += [(x, teams.rank(src), _TAG_PART + t) for t, x in enumerate(got[1])]
        return cls(p2p(teams.ring.group, sends, recvs), q_next, got)

    def finish(self, flow: _Flow) -> None:
        """Wait for the batch and fold the partial received, if any."""
        wait_all(self.reqs)
        if self.got is not None:
            flow.fold(*self.got[0], self.got[1])


class _Pass:
    """A rank's walk through its TokenRing schedule: the query tuple it holds, the K, V block of the round
    (outer Ring of Sec. 3.3.3), and the partial in flight; the caller computes each step's block."""

    def __init__(self, teams: Teams, flow: _Flow, k: torch.Tensor, v: torch.Tensor):
        self.teams, self.flow = teams, flow
        self.cur, self.lo = flow.own, 0  # the query tuple held, and its first own row
        self.k, self.v = k, v
        self.pending = self.expect = None  # partial to send (owner, tensors); own partial due (holder, rows)
        self._ex: _Exchange | None = None
        self._kv_next, self._kv_reqs = None, []

    def begin(self, s: TokenRingStep) -> None:
        """Post the step's exchange and, at a round's first step, the K, V shift for the next round."""
        self._ex = _Exchange.post(self.teams, self.flow, self.cur, self.lo, s, self.pending, self.expect)
        self.pending = None
        if s.i == 0 and s.j < self.teams.nodes - 1:
            self._kv_next = (torch.empty_like(self.k), torch.empty_like(self.v))
            self._kv_reqs = self.teams.ring.shift([self.k, self.v], list(self._kv_next), _TAG_KV,
                                                  hops=self.teams.across)

    def block(self, bm: BlockMask) -> tuple:
        """The held query tuple's rows of block ``bm`` and the held K, V's columns (views)."""
        q = _view(self.cur, bm.row_start - self.lo, bm.row_stop - self.lo, self.flow.own_lse)
        return q, self.k[:, bm.col_start:bm.col_stop], self.v[:, bm.col_start:bm.col_stop]

    def emit(self, s: TokenRingStep, bm: BlockMask, part: tuple) -> None:
        """The step's partial: folded here at step 0 (own Q), else sent to its owner with the next exchange."""
        if s.i == 0:
            self.flow.fold(bm.row_start, bm.row_stop, part)
        else:
            wire = tuple(x.contiguous() if dt is None else x.to(dt).contiguous()
                         for x, dt in zip(part, self.flow.part_dtypes))
            self.pending = (s.owner, wire)

    def end(self, s: TokenRingStep) -> None:
        """Finish the step's exchange and take the next Q block (own Q again after a round's last step)."""
        self._ex.finish(self.flow)
        self.expect = s.recv_part
        if self._ex.q_next is not None:
            self.cur, self.lo = self._ex.q_next, s.recv_q[0]
        elif s.i == self.teams.team - 1:
            self.cur, self.lo = self.flow.own, 0

    def next_round(self, s: TokenRingStep) -> None:
        """After a round's last step, hold the K, V block received over the outer ring."""
        if s.i == self.teams.team - 1 and s.j < self.teams.nodes - 1:
            wait_all(self._kv_reqs)
            self.k, self.v = self._kv_next

    def final_hop(self) -> None:
        """The last step's partial goes to its owner after the compute ends (Alg. 1's extra phase)."""
        _Exchange.post(self.teams, self.flow, self.cur, self.lo, None, self.pending, self.expect).finish(self.flow)


# ---------------------------------------------------------------- forward

def tokenring_forward(q, k, v, teams: Teams, steps, scale, backend=None) -> tuple[torch.Tensor, torch.Tensor]:
    """TokenRing forward (Algorithm 1; hybrid: Sec. 3.3.3): Q one way, (block_out, block_lse) to their owners."""
    acc = lse_dtype(q.dtype)
    b, n, h, _ = q.shape
    out = q.new_zeros(b, n, h, v.shape[-1], dtype=acc)
    lse = torch.full((b, h, n), float("-inf"), dtype=acc, device=q.device)
    flow = _Flow(own=(q,), own_lse=False,
                 new_part=lambda m: (_empty_rows(out, m, q.dtype), _empty_lse(lse, m)), part_dtypes=(None, acc),
                 fold=lambda r0, r1, part: merge(out[:, r0:r1], lse[..., r0:r1], *part))
    run = _Pass(teams, flow, k, v)
    for s in steps:
        run.begin(s)
        if s.mask is not None:
            (cq,), ck, cv = run.block(s.mask)
            run.emit(s, s.mask, block_attention(cq, ck, cv, scale=scale, causal_offset=s.mask.causal_offset,
                                                mask=s.mask.mask, backend=backend))
        run.end(s)
        run.next_round(s)
    run.final_hop()
    return out.to(q.dtype), lse


# ---------------------------------------------------------------- backward

def tokenring_backward(dout, q, k, v, out, lse, teams: Teams, steps, scale, backend=None):
    """TokenRing backward (module docstring): (Q, dO, O, LSE) one way, dQ partials to their owners,
    dK, dV local inside a team and one round behind K, V on the outer ring."""
    acc = lse_dtype(q.dtype)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dk_own = torch.zeros(k.shape, dtype=acc, device=k.device)
    dv_own = torch.zeros(v.shape, dtype=acc, device=v.device)
    dkv = TrailingSum(teams.ring, _TAG_DKV, (dk_own, dv_own), hops=teams.across)  # across teams, one round behind
    dout = dout.contiguous()
    flow = _Flow(own=(q, dout, out, lse), own_lse=True, new_part=lambda m: (_empty_rows(q, m, acc),),
                 part_dtypes=(acc,), fold=lambda r0, r1, part: dq[:, r0:r1].add_(part[0]))
    run = _Pass(teams, flow, k, v)
    for s in steps:
        if s.i == 0:  # the held block's accumulators: this rank's own block in the first round, a fresh one after
            dk_r, dv_r = (dk_own, dv_own) if s.j == 0 else (torch.zeros_like(dk_own), torch.zeros_like(dv_own))
        run.begin(s)
        bm = s.mask
        if bm is not None:
            (cq, cdo, co, cl), ck, cv = run.block(bm)
            gq, gk, gv = block_attention_backward(cdo, cq, ck, cv, co, cl, scale=scale,
                                                  causal_offset=bm.causal_offset, mask=bm.mask, backend=backend)
            dk_r[:, bm.col_start:bm.col_stop] += gk
            dv_r[:, bm.col_start:bm.col_stop] += gv
            run.emit(s, bm, (gq,))
        run.end(s)
        if s.i == teams.team - 1 and s.j >= 1:  # the held block's dK, dV move on, one round behind K, V
            dkv.pass_on((dk_r, dv_r))
        run.next_round(s)
    run.final_hop()
    dkv.home((dk_own, dv_own))  # the last round's holder sent this rank's own block home
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
