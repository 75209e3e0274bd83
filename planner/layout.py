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
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from math import prod

import numpy as np

from .errors import PlanError

DIMENSIONS = ("tp", "ulysses", "ring", "team", "dp", "pp")
TOKEN_LAYOUTS = ("contiguous", "zigzag", "striped")
#: dimensions that split the sequence; their product is the sequence-parallel degree.
SEQUENCE_DIMS = ("ulysses", "ring")


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


@lru_cache(maxsize=4096)
def _groups(size: int, stride: int, world: int) -> tuple[tuple[int, ...], ...]:
    bases = [r for r in range(world) if (r // stride) % size == 0]
    return tuple(tuple(b + i * stride for i in range(size)) for b in bases)


def dim_groups(size: int, stride: int, world: int) -> tuple[tuple[int, ...], ...]:
    """All groups of one mesh dimension of ``size`` ranks spaced ``stride`` apart in ``world``."""
    return _groups(size, stride, world)


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
    if token_layout not in TOKEN_LAYOUTS:
        raise PlanError("token_layout", f"unknown layout {token_layout!r}", f"use one of {list(TOKEN_LAYOUTS)}")


def chunks_needed(token_layout: str, ring: int, ulysses: int = 1) -> int:
    """How many equal parts the sequence must split into for this layout (seq_len % n == 0)."""
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


@dataclass(frozen=True)
class Layout:
    """Everything a rank needs to know about a plan's placement: groups and its tokens."""

    degrees: dict[str, int]
    order: tuple[str, ...]
    token_layout: str = "contiguous"
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        check_degrees(self.degrees, list(self.order))
        check_token_layout(self.token_layout)

    @property
    def world_size(self) -> int:
        return world_size(self.degrees)

    def degree(self, name: str) -> int:
        return self.degrees.get(name, 1)

    def coords(self, rank: int) -> dict[str, int]:
        return coords(rank, self.degrees, list(self.order))

    def groups(self, names: str | tuple[str, ...]) -> list[list[int]]:
        """All groups of a dimension (or merged dimensions, e.g. ("ulysses", "ring") = "sp")."""
        key = names if isinstance(names, tuple) else (names,)
        if key == ("sp",):
            key = SEQUENCE_DIMS
        if key not in self._cache:
            self._cache[key] = group_ranks(key, self.degrees, list(self.order))
        return self._cache[key]

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


# ---------------------------------------------------------------- causal work per ring round

def _clamp_sum(t, n):
    """sum_{x=1..t} min(max(x, 0), n), elementwise over numpy arrays."""
    t = np.asarray(t, dtype=np.int64)
    tri = t * (t + 1) // 2
    return np.where(t <= 0, 0, np.where(t <= n, tri, n * (n + 1) // 2 + (t - n) * n))


def _causal_pairs(q0, q1, k0, k1):
    """Pairs (i in [q0, q1), j in [k0, k1)) with j <= i, for token ranges (closed form, elementwise)."""
    n = k1 - k0
    return _clamp_sum(q1 - k0, n) - _clamp_sum(q0 - k0, n)


@lru_cache(maxsize=1024)
def causal_work(token_layout: str, ring: int, seq_len: int) -> np.ndarray:
    """(ring, ring) fraction of a full block that rank r computes on rank j's K, V under a causal mask.

    Striped Attention Sec. 3: contiguous rings leave rank r idle on later ranks' blocks and busy
    on earlier ones; striped and zigzag give every rank about half a block every round.
    """
    check_token_layout(token_layout)
    c = seq_len // ring
    r = np.arange(ring)[:, None]
    j = np.arange(ring)[None, :]
    if token_layout == "striped":  # token t on rank t mod P: c(c+1)/2 interactions if j <= r, else c(c-1)/2
        pairs = np.where(j <= r, c * (c + 1) // 2, c * (c - 1) // 2)
    elif token_layout == "contiguous":
        pairs = _causal_pairs(r * c, (r + 1) * c, j * c, (j + 1) * c)
    else:  # zigzag: chunks r and 2P-1-r of size c/2
        h = c // 2
        qs = [(r * h, (r + 1) * h), ((2 * ring - 1 - r) * h, (2 * ring - r) * h)]
        ks = [(j * h, (j + 1) * h), ((2 * ring - 1 - j) * h, (2 * ring - j) * h)]
        pairs = sum(_causal_pairs(q0, q1, k0, k1) for q0, q1 in qs for k0, k1 in ks)
    w = np.broadcast_to(pairs, (ring, ring)) / float(c * c)
    w = np.array(w)
    w.flags.writeable = False
    return w


@lru_cache(maxsize=4096)
def _round_work(token_layout: str, ring: int, seq_len: int) -> tuple[float, ...]:
    """Per-round maximum of ``causal_work``; closed forms for large rings (tests check they agree)."""
    c = seq_len // ring
    if ring > 64:
        diag = (c + 1) / (2 * c) if token_layout != "zigzag" else causal_work(token_layout, 2, 2 * c)[0, 0]
        later = {"contiguous": 1.0, "striped": (c + 1) / (2 * c), "zigzag": 0.5}[token_layout]
        return (float(diag),) + (later,) * (ring - 1)
    w = causal_work(token_layout, ring, seq_len)
    r = np.arange(ring)
    return tuple(float(w[r, (r - i) % ring].max()) for i in range(ring))


@lru_cache(maxsize=4096)
def round_work_runs(token_layout: str, ring: int, seq_len: int, causal: bool) -> tuple[tuple[float, int], ...]:
    """``round_work`` run-length encoded: ((fraction, rounds), ...) in round order."""
    runs: list[list] = []
    for f in round_work(token_layout, ring, seq_len, causal):
        if runs and runs[-1][0] == f:
            runs[-1][1] += 1
        else:
            runs.append([f, 1])
    return tuple((f, k) for f, k in runs)


def round_work(token_layout: str, ring: int, seq_len: int, causal: bool) -> list[float]:
    """Busiest rank's block fraction in each ring round i (rank r holds the K, V of rank r - i)."""
    if not causal:
        return [1.0] * ring
    return list(_round_work(token_layout, ring, seq_len))
