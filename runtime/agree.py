"""The ranks of a sequence group call ``ctx.attention`` alike: the same mask, scale, K/V chunks and shard shapes.

Each rank reads only its own arguments, so a rank passed another ``window``, ``causal`` flag or ``cu_seqlens`` than
its peers computes a wrong attention without any error, and a rank of another head count or batch aborts inside a
collective. ``MaskAgreement`` compares a digest of each field over the group and names the first field that
differs: by default once per distinct call (one small all-gather; then cached, as a model's layers repeat a batch's
call), or on every call where ``SP_PLAN_CHECK_CALLS=every``. The cache is each rank's own: a rank that repeats a
call its group agreed on while its peers make another compares nothing, and only the every-call mode finds it.
"""
from __future__ import annotations

import hashlib
import os
from collections import OrderedDict

import numpy as np
import torch
import torch.distributed as dist

from sp_plan.planner.errors import PlanError

#: the fields compared, in the order an error names them
FIELDS = ("causal", "window", "scale", "kv_chunks", "cu_seqlens", "shapes")
#: distinct calls remembered as agreed (a batch's layers repeat one; packed batches bring a new one each step)
KEEP = 64
#: the environment variable that chooses when calls are compared, and its values: each distinct call once (the
#: default), or every call (a small all-gather each, for finding a rank that strays into an earlier call)
CHECK_ENV = "SP_PLAN_CHECK_CALLS"
MODES = ("new", "every")


def check_mode(environ=None) -> str:
    """``SP_PLAN_CHECK_CALLS``'s mode (unset or empty: "new"), or a PlanError naming it."""
    mode = (os.environ if environ is None else environ).get(CHECK_ENV, "").strip() or "new"
    if mode not in MODES:
        raise PlanError(CHECK_ENV, f"unknown mode {mode!r}", f"set {CHECK_ENV} to new (each distinct call compared "
                        "once) or every (every call compared), or unset it")
    return mode


def digest(value) -> int:
    """A signed 64-bit digest of ``value``'s repr (the fields are ints, floats, bools, tuples and None)."""
    return int.from_bytes(hashlib.blake2b(repr(value).encode(), digest_size=8).digest(), "little", signed=True)


def shapes(q, k, v) -> tuple:
    """What every rank's shards share: the dimensions, batch, heads and head dimension of q, k and v, and their dtype
    (local sequence lengths may differ under packed documents); read before the shards are checked."""
    out = []
    for x in (q, k, v):  # a loop, not a generator: this runs on every call of every layer
        if isinstance(x, torch.Tensor):
            s = x.shape
            out.append((len(s), *s[:1], *s[2:], x.dtype))
        else:
            out.append(type(x).__name__)
    return tuple(out)


def plain(value):
    """``value`` alike on every rank that means it alike: a tensor or array as a tuple of its values, whole numbers
    as ints."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return tuple(int(x) if isinstance(x, (int, np.integer)) and not isinstance(x, bool) else x for x in value)
    return value


class MaskAgreement:
    """The calls a rank's sequence group agreed on (``check``), the latest ``KEEP``."""

    def __init__(self, group, every: bool = False):
        self.group = group  # None: a group of one
        self.alone = group is None or dist.get_world_size(group) == 1  # nothing to compare: no key built either
        self.every = every  # compare every call, not only the ones this rank has not made before
        self.agreed: OrderedDict = OrderedDict()

    def check(self, device: torch.device, q, k, v, **fields) -> None:
        """Every rank of the group passed these ``fields`` (``FIELDS``; ``shapes`` read from q, k and v), or a
        PlanError naming the first that differs, on every rank. Called before the fields are checked: a rank whose
        own call is wrong then fails with its peers, not alone while they wait for it."""
        if self.alone:
            return
        fields["shapes"] = shapes(q, k, v)
        key = tuple(plain(fields[f]) for f in FIELDS)
        try:
            hash(key)
        except TypeError:  # a field of no hashable value (refused by the checks after this one): its digest
            key = tuple(digest(v) for v in key)
        if key in self.agreed and not self.every:
            self.agreed.move_to_end(key)
            return
        self._compare(key, device)
        self.agreed[key] = None
        if len(self.agreed) > KEEP:
            self.agreed.popitem(last=False)

    def _compare(self, key: tuple, device: torch.device) -> None:
        """All-gather the fields' digests over the group; raise on the first field a rank holds otherwise."""
        mine = torch.tensor([digest(v) for v in key], dtype=torch.int64, device=device)
        rows = [torch.empty_like(mine) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(rows, mine, group=self.group)
        table = [r.tolist() for r in rows]
        ranks = [dist.get_global_rank(self.group, i) for i in range(len(rows))]  # in the gather's (group) order
        for i, name in enumerate(FIELDS):
            other = next((r for r, row in zip(ranks, table) if row[i] != table[0][i]), None)
            if other is not None:
                raise PlanError(name, f"rank {other} passed ctx.attention another {name} than rank {ranks[0]}",
                                "give every rank of a sequence group the same causal, window, scale, kv_chunks "
                                "and cu_seqlens, and shards of the same batch, heads and dtype")


def first_difference(values: dict, world: int) -> tuple[str, int, object, object] | None:
    """Over every rank of the world (one all_gather_object): the first of ``values``' keys, in their order, where a
    rank holds another value than rank 0, as (key, that rank, its value, rank 0's); None where all agree."""
    every: list = [None] * world
    dist.all_gather_object(every, values)
    for key in values:
        for r, theirs in enumerate(every):
            if theirs.get(key) != every[0].get(key):
                return key, r, theirs.get(key), every[0].get(key)
    return None
