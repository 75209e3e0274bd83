"""Causal ring rounds without a window from the layouts' chunks: the (P, P) matrix of zigzag, the balancer
and contiguous (``causal_layout_matrix``) and each round's busiest and mean from the chunks' pieces
(``chunk_round_stats``).
"""
from __future__ import annotations

import numpy as np

from ..layout import _zigzag_sizes, balanced_parts, document_runs, spread_sizes
from .layout_ranks import work_before


def _pairs_of_runs(n: np.ndarray, rank: np.ndarray, doc: np.ndarray, ring: int) -> np.ndarray:
    """(P, P) float causal pairs without a window of runs in token order (``n`` tokens each, ``doc`` nondecreasing):
    every pair of runs of one document, B before A, adds n_A n_B at [rank A, rank B], and each run n(n + 1)/2 of
    its own on the diagonal. O(pairs of runs): for documents of few runs."""
    first = np.searchsorted(doc, doc, side="left")
    cnt = np.arange(len(n)) - first
    a = np.repeat(np.arange(len(n)), cnt)
    b = first[a] + np.arange(len(a)) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    out = np.bincount(rank[a] * ring + rank[b], weights=n[a] * n[b], minlength=ring * ring).astype(np.float64)
    out = out.reshape(ring, ring)  # (an empty count comes back as ints)
    out[np.diag_indices(ring)] += np.bincount(rank, weights=n * (n + 1) / 2, minlength=ring)
    return out


#: documents from which ``_cross`` multiplies in float64 through BLAS (its fixed cost beaten), below by einsum's loop
BLAS_ROWS = 16


def _cross(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """A^T B of (documents, P) int64 arrays: [r, j] = sum_d A[d, r] B[d, j]. Many documents: a float64 product, exact
    while each entry (score entries between two ranks of one sequence, at most S^2) stays below 2^53."""
    if len(A) < BLAS_ROWS:
        return np.einsum("dr,dj->rj", A, B)
    return (A.astype(np.float64).T @ B.astype(np.float64)).astype(np.int64)


def _zigzag_pair_matrix(F: np.ndarray, G: np.ndarray) -> np.ndarray:
    """(P, P) float causal pairs without a window of documents laid as zigzag chunks: F[d, r] the tokens of document
    d's chunk on rank r in its first half (ranks ascending), G[d, r] in its second half (ranks descending). Rank r's
    first chunk sees the first chunks of ranks j < r; its second chunk every first chunk and the second chunks of
    ranks j > r; each chunk c(c + 1)/2 of itself: tril(F^T F) + G^T F + triu(G^T G) and the diagonal, three matrix
    products, O(D P^2) multiply-adds."""
    F = F.astype(np.int64)  # integer products: exact, and einsum's own loop (no BLAS threads for small products)
    out = np.tril(_cross(F, F), -1)
    if G is not None:  # None: no second half (contiguous)
        G = G.astype(np.int64)
        out += _cross(G, F) + np.triu(_cross(G, G), 1)
        out[np.diag_indices(len(out))] += (G * (G + 1) // 2).sum(axis=0)
    out[np.diag_indices(len(out))] += (F * (F + 1) // 2).sum(axis=0)
    return out


def _zigzag_halves(sizes: np.ndarray, ring: int) -> tuple[np.ndarray, np.ndarray]:
    """(F, G) of ``_zigzag_pair_matrix`` from (documents, 2P) chunk sizes, chunk k < P on rank k, 2P-1-k on k."""
    return sizes[:, :ring], sizes[:, ring:][:, ::-1]


#: a document with runs on at least this share of the ranks goes through the matrix products
#: (``_zigzag_pair_matrix``, P^2 a document); one with fewer through pairs of runs (runs^2)
DENSE_SHARE = 1 / 6


def _zigzag_causal_matrix(cu: np.ndarray, ring: int) -> np.ndarray:
    """(P, P) float causal pairs without a window of the per-document zigzag (layout._zigzag_sizes)."""
    sizes, chunk_rank = _zigzag_sizes(cu, ring)
    dense = (sizes > 0).sum(axis=1) >= DENSE_SHARE * 2 * ring
    out = _zigzag_pair_matrix(*_zigzag_halves(sizes[dense], ring)).astype(np.float64)
    sparse = sizes[~dense]
    if len(sparse):
        doc, chunk = np.nonzero(sparse)  # row-major: documents in order, each one's chunks in token order
        out += _pairs_of_runs(sparse[doc, chunk].astype(np.float64), chunk_rank[chunk], doc, ring)
    return out


def _balanced_causal_matrix(cu: np.ndarray, ring: int, before) -> np.ndarray:
    """(P, P) float causal pairs without a window of the balancer (layout.balanced_parts): its spread documents
    zigzag chunks rotated by their index d (``_zigzag_pair_matrix`` per rotation, rolled by d mod P), the others
    pairs of runs (one run a whole document, a few a poured one)."""
    spread, (start, stop, rank) = balanced_parts(cu, ring, before)
    order = np.argsort(start, kind="stable")
    start, stop, rank = start[order], stop[order], rank[order]
    out = _pairs_of_runs((stop - start).astype(np.float64), rank, np.searchsorted(cu, start, side="right"), ring)
    sizes, shift = spread_sizes(cu, ring, spread), spread % ring
    for s in np.unique(shift):
        _add_rolled(out, _zigzag_pair_matrix(*_zigzag_halves(sizes[shift == s], ring)), int(s))
    return out


def _run_pair_cells(n: np.ndarray, rank: np.ndarray, doc: np.ndarray) -> tuple[np.ndarray, ...]:
    """``_pairs_of_runs`` as cells: (query rank, key rank, entries) of every pair of runs of one document, B before
    A, then (rank, entries) of each run's own n(n + 1)/2."""
    first = np.searchsorted(doc, doc, side="left")
    cnt = np.arange(len(n)) - first
    a = np.repeat(np.arange(len(n)), cnt)
    b = first[a] + np.arange(len(a)) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    return rank[a], rank[b], n[a] * n[b], rank, n * (n + 1) // 2


def _changes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, position) of each entry of a (D, P) array that differs from the one before it, cyclically."""
    return np.nonzero(x != np.roll(x, 1, axis=1))


def _chunk_round_stats(F: np.ndarray, G: np.ndarray, shift: np.ndarray, ring: int, cells) -> tuple[np.ndarray, ...]:
    """(P,) busiest and summed score entries of each causal ring round of documents laid as zigzag chunks (F, G: the
    first and second half's chunk sizes on each rank, ``_zigzag_pair_matrix``; document d rolled by shift[d]) plus
    ``cells`` (``_run_pair_cells`` of the other runs), without the (P, P) matrix. Document d gives its rank u (rank
    u + shift[d]) in round i >= 1 F[u - i] H[u] where u >= i (its first-half keys of rank u - i precede every query
    of rank u) and G[u] H[u - i + P] below (its second-half queries see every key of the rank after it), H = F + G:
    along a round the entries change only where F, G or H change (shifted by i) or at u = 0 and u = i, so each
    round is a few constant pieces, each read once at its first rank: O(P x pieces x documents)."""
    P = ring
    D = len(F)
    H = F + G
    rows = np.arange(D)
    fixed, moving = [(rows, np.zeros(D, dtype=np.int64))], [(rows, np.zeros(D, dtype=np.int64))]
    fixed += [_changes(H), _changes(G)]
    moving += [_changes(F), _changes(H)]
    at = lambda parts: np.concatenate([(shift[d] + u) % P for d, u in parts])  # noqa: E731 - ranks
    base, step = np.append(at(fixed), 0), at(moving)  # rank 0: a piece even without documents
    i = np.arange(1, P)[:, None]
    starts = np.sort(np.concatenate([np.broadcast_to(base, (P - 1, len(base))), (step[None, :] + i) % P], axis=1),
                     axis=1)  # (rounds, pieces): each piece's first rank
    length = np.diff(starts, axis=1, append=starts[:, :1] + P)
    value = np.zeros(starts.shape, dtype=np.int64)
    for d in range(D):
        u = (starts - shift[d]) % P
        hi = u >= i
        value += np.where(hi, F[d][(u - i) % P] * H[d][u], G[d][u] * H[d][(u - i) % P])
    busiest = np.concatenate([[0], value.max(axis=1)])
    total = np.concatenate([[0], (value * length).sum(axis=1)])
    diag = np.zeros(P, dtype=np.int64)
    for d in range(D):
        np.add.at(diag, (np.arange(P) + shift[d]) % P, F[d] * (F[d] + 1) // 2 + G[d] * (G[d] + 1) // 2 + G[d] * F[d])
    qr, kr, w, own_rank, own = cells
    rnd = (qr - kr) % P
    np.add.at(diag, own_rank, own)
    np.add.at(diag, qr[rnd == 0], w[rnd == 0])  # earlier runs of a document on the same rank
    busiest[0], total[0] = diag.max(), diag.sum()
    qr, rnd, w = qr[rnd > 0], rnd[rnd > 0], w[rnd > 0]
    if len(w):
        key, where = np.unique(rnd * P + qr, return_inverse=True)
        extra = np.bincount(where, weights=w).astype(np.int64)  # exact: integer entries below 2^53
        ci, cr = key // P, key % P
        dense = np.zeros(len(key), dtype=np.int64)
        for d in range(D):
            u = (cr - shift[d]) % P
            dense += np.where(u >= ci, F[d][(u - ci) % P] * H[d][u], G[d][u] * H[d][(u - ci) % P])
        np.maximum.at(busiest, ci, dense + extra)
        total += np.bincount(ci, weights=extra, minlength=P).astype(np.int64)
    return busiest, total


def _zigzag_chunk_parts(cu: np.ndarray, ring: int) -> tuple:
    """(F, G, shift, cells) of ``_chunk_round_stats`` for the per-document zigzag: its dense documents' halves
    (``_zigzag_causal_matrix``' split), the other chunks as runs."""
    sizes, chunk_rank = _zigzag_sizes(cu, ring)
    dense = (sizes > 0).sum(axis=1) >= DENSE_SHARE * 2 * ring
    F, G = _zigzag_halves(sizes[dense].astype(np.int64), ring)
    sparse = sizes[~dense]
    doc, chunk = np.nonzero(sparse)  # row-major: documents in order, each one's chunks in token order
    cells = _run_pair_cells(sparse[doc, chunk].astype(np.int64), chunk_rank[chunk], doc)
    return F, G, np.zeros(len(F), dtype=np.int64), cells


def _balanced_chunk_parts(cu: np.ndarray, ring: int, before, parts=None) -> tuple:
    """(F, G, shift, cells) of ``_chunk_round_stats`` for the balancer (``_balanced_causal_matrix``' split): its
    spread documents' halves rolled by their index, the whole and poured runs as cells; ``parts``: ``balanced_parts``' causal ones, where built."""
    spread, (start, stop, rank) = balanced_parts(cu, ring, before) if parts is None else parts
    order = np.argsort(start, kind="stable")
    start, stop, rank = start[order], stop[order], rank[order]
    cells = _run_pair_cells(stop - start, rank, np.searchsorted(cu, start, side="right"))
    F, G = _zigzag_halves(spread_sizes(cu, ring, spread).astype(np.int64), ring)
    return F, G, spread % ring, cells


#: a round's pieces in ``_chunk_round_stats``, over the ring degree, up to which they are counted rather than the
#: (P, P) matrix
PIECES_SHARE = 1 / 4


def chunk_round_stats(token_layout: str, ring: int, cu_seqlens, parts=None) -> tuple[np.ndarray, np.ndarray]:
    """(P,) busiest and mean score entries of each causal ring round (no window) of zigzag or the balancer from
    their chunks' pieces (``_chunk_round_stats``), the max and mean of the counted rounds; or, where the documents
    cut each round into so many pieces that the matrix costs less, from the same chunks (``_chunk_matrix``)."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    parts = (_zigzag_chunk_parts(cu, ring) if token_layout == "zigzag"
             else _balanced_chunk_parts(cu, ring, work_before(cu, True, None), parts))
    F, G = parts[0], parts[1]
    pieces = 2 * len(F) + sum(len(_changes(x)[0]) for x in (F, G, F + G))
    if pieces > PIECES_SHARE * ring or len(parts[3][0]) > ring * ring // 8:
        by_rank = _diagonals(_chunk_matrix(*parts[:3], ring, parts[3]))
        return by_rank.max(axis=0)[::-1], by_rank.mean(axis=0)[::-1]  # exact integer sums: any order
    busiest, total = _chunk_round_stats(*parts[:3], ring, parts[3])
    return busiest, total / ring  # as the mean of the exact integers: their float64 sum over P


def _chunk_matrix(F: np.ndarray, G: np.ndarray, shift: np.ndarray, ring: int, cells) -> np.ndarray:
    """(P, P) int64 pair matrix of ``_chunk_round_stats``' documents and cells (``causal_layout_matrix`` of zigzag or
    the balancer): each shift's documents by ``_zigzag_pair_matrix``, rolled, and the cells counted in."""
    qr, kr, w, own_rank, own = cells
    out = np.bincount(qr * ring + kr, weights=w, minlength=ring * ring).astype(np.int64).reshape(ring, ring)
    out[np.diag_indices(ring)] += np.bincount(own_rank, weights=own, minlength=ring).astype(np.int64)
    for s in np.unique(shift):
        _add_rolled(out, _zigzag_pair_matrix(F[shift == s], G[shift == s]), int(s))
    return out


def _add_rolled(out: np.ndarray, z: np.ndarray, s: int) -> None:
    """out += np.roll(z, (s, s), axis=(0, 1)), in place by its four blocks (no rolled copy of a P x P matrix)."""
    n = len(z) - s
    out[s:, s:] += z[:n, :n]
    if s:
        out[:s, :s] += z[n:, n:]
        out[s:, :s] += z[:n, n:]
        out[:s, s:] += z[n:, :n]


def causal_layout_matrix(token_layout: str, ring: int, cu_seqlens) -> np.ndarray:
    """(P, P) int64 ``pair_matrix`` of a causal mask without a window under contiguous, zigzag or balanced, from the
    layout's structure: contiguous by pairs of runs (a document's runs are on consecutive ranks), zigzag and the
    balancer's spread documents by matrix products of their chunk sizes (``_zigzag_pair_matrix``)."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    if token_layout == "zigzag":
        m = _zigzag_causal_matrix(cu, ring)
    elif token_layout == "balanced":
        m = _balanced_causal_matrix(cu, ring, work_before(cu, True, None))
    else:
        m = _contiguous_causal_matrix(cu, ring)
    return np.rint(m).astype(np.int64)


def _contiguous_causal_matrix(cu: np.ndarray, ring: int) -> np.ndarray:
    """(P, P) float causal pairs without a window of the contiguous layout: a document's runs lie on consecutive
    ranks in rank order, so the documents spanning many ranks are ``_zigzag_pair_matrix`` with no second half (their
    rank counts F), the others pairs of runs."""
    start, stop, rank = document_runs("contiguous", ring, cu)
    doc = np.searchsorted(cu, start, side="right") - 1
    n = (stop - start).astype(np.float64)
    dense = (np.bincount(doc, minlength=len(cu) - 1) >= DENSE_SHARE * ring)[doc]
    out = _pairs_of_runs(n[~dense], rank[~dense], doc[~dense], ring)
    if dense.any():
        rows = np.unique(doc[dense], return_inverse=True)[1]
        F = np.zeros((rows.max() + 1, ring), dtype=np.int64)
        F[rows, rank[dense]] = n[dense]
        out += _zigzag_pair_matrix(F, None)
    return out


def _diagonals(m: np.ndarray) -> np.ndarray:
    """(P ranks, P rounds) read-only view of a (P, P) pair matrix's rounds, reversed: [r, P - 1 - i] = m[r, (r - i)
    mod P], from m laid twice side by side (entry [r, r - i + P], at r (2P + 1) + 1 + P - 1 - i of it) without index
    arrays; each rank's row contiguous, so reductions over the ranks run row by row."""
    P = len(m)
    flat = np.concatenate([m, m], axis=1).ravel()
    s = flat.strides[0]
    return np.lib.stride_tricks.as_strided(flat[1:], shape=(P, P), strides=((2 * P + 1) * s, s), writeable=False)
