"""Packs of documents: document lengths drawn from a Workload's distribution and cut into sequences.

Packing lays the drawn documents end to end and cuts the stream every ``seq_len`` tokens, as Megatron's GPT
dataset and MagiAttention's DatasetSampler (its pack ``tail``) do: a document that crosses a cut goes on in the
next sequence, and one longer than a sequence is cut into sequence-length pieces. Each piece attends only to
itself, so a sequence's mask is its ``cu_seqlens`` (flash-attn's varlen convention: document starts, then the
sequence's end). Pure functions of their inputs; randomness comes from a numpy Generator seeded by the caller.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from .errors import PlanError
from .layout import document_bounds
from .model import DocumentLengths, Histogram, Lognormal, Workload

#: draws per refill beyond the expected count, so a refill is rare and its size does not depend on luck
DRAW_MARGIN = 16
#: bins per doubling of length when a file of lengths is summarised as a histogram (``histogram_of``)
BINS_PER_OCTAVE = 8


def mean_length(docs: DocumentLengths | Lognormal | Histogram) -> float:
    """Expected document length in tokens (for sizing draws; a lognormal's is estimated before clipping)."""
    if isinstance(docs, DocumentLengths):
        return float(np.mean(docs.lengths))
    if isinstance(docs, Lognormal):
        return float(min(max(docs.mean, docs.min), docs.max))
    lo, hi, p = _bins(docs)
    return float(np.dot(p, (lo + hi - 1) / 2.0))


def _bins(h: Histogram) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lowest length, one past the highest, probability) of each bin: integers max(edges[i], 1) <= L < edges[i+1]."""
    e = np.asarray(h.edges, dtype=np.int64)
    lo = np.maximum(e[:-1], 1)
    return lo, np.maximum(e[1:], lo + 1), _probabilities(h.weights)  # a zero-weight bin below 1 token: never drawn


def _probabilities(weights) -> np.ndarray:
    """Bin weights (finite, any scale: the Histogram checks them) as probabilities, w / sum(w)."""
    w = np.asarray(weights, dtype=float)
    with np.errstate(over="ignore"):
        total = w.sum()
    if not np.isfinite(total):  # weights near 1e308 sum to inf (w / inf is all zero): scale by the largest first,
        w = w / w.max()         # so the sum is at most the bin count
        total = w.sum()
    return w / total


def _lognormal_mu(docs: Lognormal) -> float:
    """mu of ln(length) for the lognormal's untruncated ``mean``: ln(mean) - sigma^2 / 2 (Megatron-LM's
    MockVarlenLowLevelDataset; ``Lognormal`` holds sigma within MAX_SIGMA, so sigma**2 is finite)."""
    return math.log(docs.mean) - docs.sigma ** 2 / 2


def sample_lengths(docs: DocumentLengths | Lognormal | Histogram, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` document lengths (int64, each >= 1) drawn from ``docs`` with ``rng``."""
    if isinstance(docs, DocumentLengths):
        return rng.choice(np.asarray(docs.lengths, dtype=np.int64), size=n, replace=True)
    if isinstance(docs, Lognormal):  # Megatron-LM MockVarlenLowLevelDataset: mu = ln(mean) - sigma^2/2, clip, floor
        x = np.clip(rng.lognormal(_lognormal_mu(docs), docs.sigma, size=n), docs.min, docs.max)
        return x.astype(np.int64)
    lo, hi, p = _bins(docs)  # MagiAttention generate_seqlens: a bin by its weight, then a length uniform in it
    b = rng.choice(len(p), size=n, p=p)
    return rng.integers(lo[b], hi[b])


def pack(lengths, seq_len: int, sequences: int) -> list[np.ndarray]:
    """cu_seqlens of ``sequences`` sequences of ``seq_len`` tokens cut from ``lengths`` laid end to end.

    A document that crosses a cut continues in the next sequence as its own document; the lengths must
    cover ``seq_len * sequences`` tokens."""
    need = seq_len * sequences
    ends = np.cumsum(np.asarray(lengths, dtype=np.int64))
    if not len(ends) or ends[-1] < need:
        raise PlanError("documents", f"{int(ends[-1]) if len(ends) else 0} tokens of documents for {sequences} "
                        f"sequences of {seq_len}", f"give documents covering {need} tokens")
    out = []
    for s in range(sequences):
        lo, hi = s * seq_len, (s + 1) * seq_len
        inner = ends[(ends > lo) & (ends < hi)] - lo  # document ends strictly inside this sequence
        out.append(np.concatenate([[0], inner, [seq_len]]).astype(np.int64))
    return out


def draw_packs(docs: DocumentLengths | Lognormal | Histogram, seq_len: int, sequences: int, seed: int
               ) -> list[np.ndarray]:
    """cu_seqlens of ``sequences`` packed sequences drawn from ``docs`` with ``seed`` (the same inputs, the same
    packs)."""
    rng = np.random.default_rng(seed)
    need = seq_len * sequences
    mean = mean_length(docs)
    if not 1 <= mean < math.inf:  # each length is a whole token or more: a mean below 1 sizes no draw
        raise PlanError("workload.documents", f"the mean document length is {mean:g} tokens",
                        "give a distribution of lengths of 1 token or more")
    per_draw = math.ceil(need / mean) + DRAW_MARGIN
    drawn: list[np.ndarray] = []
    total = 0
    while total < need:
        x = sample_lengths(docs, per_draw, rng)
        drawn.append(x)
        total += int(x.sum())
    return pack(np.concatenate(drawn), seq_len, sequences)


def workload_packs(work: Workload, sequences: int) -> list[np.ndarray]:
    """The workload's first ``sequences`` packs: its documents and seed, or one document per sequence (read-only
    arrays, drawn once per workload: every layout a search prices reads the same packs)."""
    return list(_workload_packs(work, sequences))


@lru_cache(maxsize=64)
def _workload_packs(work: Workload, sequences: int) -> tuple[np.ndarray, ...]:
    if work.documents is None:
        packs = [single_document(work.seq_len) for _ in range(sequences)]
    else:
        packs = draw_packs(work.documents, work.seq_len, sequences, work.seed or 0)
    for cu in packs:
        cu.flags.writeable = False
    return tuple(packs)


def single_document(seq_len: int) -> np.ndarray:
    """cu_seqlens of a sequence that is one document."""
    return np.array([0, seq_len], dtype=np.int64)


def batch_cu_seqlens(packs: list[np.ndarray]) -> np.ndarray:
    """Global cu_seqlens (int32, flash-attn's varlen convention) of the packs' sequences laid end to end."""
    out, offset = [np.zeros(1, dtype=np.int64)], 0
    for cu in packs:
        out.append(cu[1:] + offset)
        offset += int(cu[-1])
    return np.concatenate(out).astype(np.int32)


def check_cu_seqlens(cu_seqlens, seq_len: int | None = None) -> np.ndarray:
    """``cu_seqlens`` as int64 (``layout.document_bounds``: empty documents dropped), checked to end at seq_len."""
    cu = document_bounds(cu_seqlens)
    if seq_len is not None and cu[-1] != seq_len:
        raise PlanError("cu_seqlens", f"ends at {int(cu[-1])}, the sequence has {seq_len} tokens",
                        "end cu_seqlens at the sequence length")
    return cu


def histogram_of(lengths, source: str, sha256: str | None = None,
                 bins_per_octave: int = BINS_PER_OCTAVE) -> Histogram:
    """A file's document lengths summarised as a Histogram (what a plan records of them, with the file's name and
    sha256): one bin per length below ``bins_per_octave``, then edges at floor(b x 2^(k/b)) tokens, ``b`` per
    doubling (edges that floor to the same token are one: the first doubling gets fewer), each bin weighted by its
    count; lengths stay whole tokens and the bins never reach past the longest."""
    x = np.asarray(lengths, dtype=np.int64)
    if not len(x):
        raise PlanError("documents", f"{source} holds no lengths", "give a file with one length per line")
    if x.min() < 1:
        raise PlanError("documents", f"{source} has a length of {int(x.min())}", "lengths must be at least 1 token")
    top = int(x.max())
    geometric = {math.floor(bins_per_octave * 2 ** (k / bins_per_octave))
                 for k in range(bins_per_octave * (top.bit_length() + 1))}
    edges = np.array(sorted({e for e in geometric | set(range(1, bins_per_octave)) if e <= top} | {top + 1}))
    counts = np.bincount(np.searchsorted(edges, x, side="right") - 1, minlength=len(edges) - 1)
    return Histogram(edges=tuple(int(e) for e in edges), weights=tuple(float(c) for c in counts[:len(edges) - 1]),
                     source=source, sha256=sha256)
