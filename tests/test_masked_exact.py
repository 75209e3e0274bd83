"""Every algorithm that honours masks against single-device masked attention: output and every gradient.

The matrix: ring (contiguous, zigzag, striped, balanced), Ulysses, USP, all-gather and its hybrid with Ulysses x
{causal, full, window, document, document + window, a single document, bidirectional document + window} x {MHA,
GQA} on worlds of 1, 2, 4 and 8 gloo ranks, in float64 (and a float32 slice). The packed documents are 3, 37, 1, 17
and 19 tokens (77 in all, odd, no padding to a multiple of anything): shorter than one rank's chunk, spanning many
ranks, a single token. Each rank takes its tokens of the global sequence (``ring.member_pieces``: with documents
laid out per document, so ranks may hold different numbers of tokens), runs forward and backward through the
runtime's entry point (``attention.attention``, as ``ctx.attention`` calls it), and returns output, gradients and
how many blocks its kernels ran (``ring.BLOCKS``); the parent puts the shards back and compares with
F.scaled_dot_product_attention in float64 under the same boolean mask, and counts the blocks the mask leaves
non-empty. One world per size; the cases loop inside it.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from exact import DTYPES, assemble, attention_terms, mismatches, once
from sp_plan.planner.errors import PlanError
from sp_plan.planner.layout import TOKEN_LAYOUTS, Layout
from sp_plan.runtime.variants.allgather import allgather_attention
from sp_plan.runtime.attention import MASKED, attention
from sp_plan.runtime.kernels import attended, document_ids
from sp_plan.runtime.variants.ring import BLOCKS, SENT, member_pieces, member_tokens, needed_rounds, sees
from harness.worlds import run_world
from markers import shared_world
from sp_plan.runtime.variants.ulysses import span_masks, span_tiles

BATCH, HEADS, HEAD_DIM = 2, 8, 4
DOCS = (0, 3, 40, 41, 58, 77)
#: name -> (sequence length, causal, cu_seqlens, window)
MASKS = {"causal": (64, True, None, None), "full": (64, False, None, None), "window": (64, True, None, 9),
         "document": (77, True, DOCS, None), "document+window": (77, True, DOCS, 9),
         "single document": (77, True, (0, 77), None), "document+window bidirectional": (77, False, DOCS, 6),
         "fewer tokens than ranks": (5, True, (0, 2, 5), None)}
#: the masks of every world's matrix; "fewer tokens than ranks" runs at world 8 only (some ranks hold nothing)
MATRIX_MASKS = tuple(m for m in MASKS if m != "fewer tokens than ranks")
DOCUMENT_MASKS = tuple(m for m in MATRIX_MASKS if MASKS[m][2] is not None)
KV_HEADS = {"MHA": 8, "GQA": 2}
WORLDS = (1, 2, 4, 8)


@dataclass(frozen=True)
class Case:
    algorithm: str
    ulysses: int
    ring: int
    token_layout: str
    mask: str
    heads: str
    dtype: str = "float64"
    order: tuple[str, ...] = ("ulysses", "ring")  # mesh order, innermost first


    @property
    def spec(self):
        return MASKS[self.mask]

    @property
    def layout(self) -> Layout:
        return Layout({"ulysses": self.ulysses, "ring": self.ring}, self.order, self.token_layout)

    def pieces(self):
        """[ring member][ulysses member] tokens, as the runtime lays them out."""
        seq, causal, cu, window = self.spec
        return member_pieces(self.token_layout, self.ulysses, self.ring, seq, causal, cu, window)


def variants(world: int) -> list[tuple[str, int, int, tuple[str, ...]]]:
    """(algorithm, ulysses, ring, token layouts) on ``world`` ranks; ``balanced`` runs where documents are given."""
    out = [("ring", 1, world, TOKEN_LAYOUTS + ("balanced",)), ("ulysses", world, 1, ("contiguous",)),
           ("allgather", 1, world, ("contiguous", "zigzag", "balanced"))]
    for u in (2, 4):
        if world % u == 0 and world // u > 1:
            out += [(a, u, world // u, ("zigzag", "balanced")) for a in ("usp", "allgather")]
    if world == 2:  # the degree-1 sides of USP and of the hybrid
        out += [("usp", 1, 2, ("zigzag",)), ("usp", 2, 1, ("contiguous",)), ("allgather", 2, 1, ("contiguous",))]
    return out


def cases(world: int) -> list[Case]:
    """The float64 matrix of ``world``; at world 2 a float32 slice (document + window, GQA); at world 8 USP and the
    hybrid with the ring innermost in the mesh, and every algorithm on fewer tokens than ranks."""
    out = [Case(a, u, r, t, m, h) for a, u, r, layouts in variants(world) for t in layouts for m in MATRIX_MASKS
           for h in KV_HEADS if t != "balanced" or MASKS[m][2] is not None]
    if world == 2:
        out += [Case(a, u, r, layouts[0], "document+window", "GQA", "float32") for a, u, r, layouts in variants(2)]
    if world == 8:
        out += [Case(a, 2, 4, "zigzag", m, "GQA", order=("ring", "ulysses")) for a in ("usp", "allgather")
                for m in ("causal", "document+window")]
        out += [Case(a, u, r, t, "fewer tokens than ranks", "GQA") for a, u, r, layouts in variants(8) for t in layouts]
    return out


def inputs(case: Case, salt: int):
    """Global q, k, v and upstream gradient of ``case`` drawn with seed ``salt``, the same in parent and children."""
    g = torch.Generator().manual_seed(salt)
    seq, kv = case.spec[0], KV_HEADS[case.heads]
    return [torch.randn(BATCH, seq, h, HEAD_DIM, generator=g, dtype=torch.float64).to(DTYPES[case.dtype])
            for h in (HEADS, kv, kv, HEADS)]


def seed(case: Case) -> int:
    """Inputs depend on the mask, the heads and the dtype only, so every algorithm meets the same reference."""
    return 100 * list(MASKS).index(case.mask) + 10 * list(KV_HEADS).index(case.heads) + list(DTYPES).index(case.dtype)


@lru_cache(maxsize=None)
def expected(mask: str, heads: str, dtype: str) -> list[torch.Tensor]:
    """The float64 single-device reference of a (mask, heads, dtype): out, dq, dk, dv."""
    case = Case("ring", 1, 1, "contiguous", mask, heads, dtype)
    return reference(*inputs(case, seed(case)), *case.spec)


def _groups(world: int, rank: int, todo: list[Case]) -> dict:
    """Every ulysses and ring group the cases need (all ranks make all of them, in the same order)."""
    made = {tuple(range(world)): dist.group.WORLD}
    for case in todo:
        for dim in ("ulysses", "ring"):
            for g in case.layout.groups(dim):
                if len(g) > 1 and tuple(g) not in made:
                    made[tuple(g)] = dist.new_group(g)
    return made


def _run(rank: int, world: int, todo: list[Case]):
    made = _groups(world, rank, todo)
    results = []
    for case in todo:
        lay, c = case.layout, case.layout.coords(rank)
        tok = case.pieces()[c.get("ring", 0)][c.get("ulysses", 0)]
        q, k, v, do = (x[:, torch.as_tensor(tok)].clone() for x in inputs(case, seed(case)))
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        groups = {d: made.get(tuple(lay.group_of(d, rank))) for d in ("ulysses", "ring")}
        ranks = {d: lay.group_of(d, rank) for d in ("ulysses", "ring")}
        _, causal, cu, window = case.spec
        before, sent = dict(BLOCKS), dict(SENT)
        o = attention(q, k, v, algorithm=case.algorithm, groups=groups, ranks=ranks, causal=causal,
                      token_layout=case.token_layout, cu_seqlens=cu, window=window)
        o.backward(do)
        blocks = tuple(BLOCKS[p] - before.get(p, 0) for p in ("forward", "backward"))
        hops = tuple(SENT[p] - sent.get(p, 0) for p in ("forward", "backward"))
        results.append((tok, [t.detach() for t in (o, q.grad, k.grad, v.grad)], blocks, hops))
    return results


def reference(q, k, v, do, seq: int, causal: bool, cu, window):
    """float64 single-device attention under the boolean mask of (causal, documents, window)."""
    docs = None if cu is None else document_ids(cu, seq)
    allowed = torch.from_numpy(attended(np.arange(seq), np.arange(seq), causal=causal, documents=docs, window=window))
    qt, kt, vt = (x.to(torch.float64).transpose(1, 2).clone().requires_grad_() for x in (q, k, v))
    o = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=allowed, enable_gqa=True)
    o.backward(do.to(torch.float64).transpose(1, 2))
    return [x.transpose(1, 2) for x in (o.detach(), qt.grad, kt.grad, vt.grad)]


def _nonempty(q_tokens, key_lists, case: Case) -> int:
    """How many key blocks a query block sees anything of under the case's mask."""
    seq, causal, cu, window = case.spec
    docs = None if cu is None else document_ids(cu, seq)
    return sum(bool(attended(q_tokens, t, causal=causal, documents=docs, window=window).any()) for t in key_lists)


def expected_blocks(case: Case, rank: int) -> int | None:
    """Blocks the rank's kernels must run in each pass: one per non-empty (query block, key block) pair. The
    blocks are the ring members' token lists (ring, all-gather, USP and the hybrid after the all-to-all), or where
    Ulysses runs with one ring member the tiles of the whole sequence (``ulysses.span_tiles``). Unmasked attention
    with one ring member is one local kernel (None), but all-gather on its own attends its one chunk as it does."""
    seq, causal, cu, window = case.spec
    c = case.layout.coords(rank)
    if case.ring == 1 and cu is None and window is None and (case.algorithm, case.ulysses) != ("allgather", 1):
        return None
    if _tiled(case):
        tiles = [np.arange(a, b) for a, b in span_tiles(seq, case.ulysses, cu, window)]
        return sum(_nonempty(t, tiles, case) for t in tiles)
    members = member_tokens(case.token_layout, case.ring, seq, causal, cu, window)
    return _nonempty(members[c.get("ring", 0)], members, case)


def _tiled(case: Case) -> bool:
    """Whether the whole sequence is attended in tiles (one ring member: Ulysses, or any algorithm on one rank under a
    mask), rather than by a ring or all-gather."""
    masked = case.spec[2:] != (None, None)
    return case.ring == 1 and (case.algorithm in ("ulysses", "usp") or case.ulysses > 1 or masked)


def _all_blocks(case: Case) -> int:
    """Blocks a rank would run if it skipped none."""
    seq, _, cu, window = case.spec
    return len(span_tiles(seq, case.ulysses, cu, window)) ** 2 if _tiled(case) else case.ring


@once
def world_results(world: int):
    return run_world(_run, world, cases(world), timeout=300)


@shared_world("masked_exact")
@pytest.mark.parametrize("world", WORLDS)
def test_every_masked_algorithm_matches_single_device_attention(world):
    results, wrong = world_results(world), []
    for i, case in enumerate(cases(world)):
        want = expected(case.mask, case.heads, case.dtype)
        got = assemble(want, [(r[i][0], r[i][1]) for r in results], case.spec[0], str(case))
        terms = attention_terms(case.spec[0], HEAD_DIM, HEADS // KV_HEADS[case.heads])
        wrong += mismatches(got, want, ("out", "dq", "dk", "dv"), case.dtype, terms, str(case))
    assert not wrong, "\n".join(wrong)


@shared_world("masked_exact")
@pytest.mark.parametrize("world", WORLDS)
def test_blocks_the_mask_empties_are_not_computed(world):
    """Each rank runs exactly one kernel per non-empty block in forward and in backward, so a mask that empties
    blocks saves their compute; documents and windows do empty some at every world over 1."""
    results, wrong, skipped = world_results(world), [], 0
    for i, case in enumerate(cases(world)):
        for rank, r in enumerate(results):
            want = expected_blocks(case, rank)
            if want is not None and r[i][2] != (want, want):
                wrong.append(f"{case} rank {rank}: ran {r[i][2]}, non-empty {want}")
            if want is not None and case.spec[2] is not None:
                skipped += _all_blocks(case) - want
    assert not wrong, "\n".join(wrong)
    assert skipped > 0 or world == 1


def expected_hops(case: Case) -> int:
    """K, V blocks a ring member sends on per pass: one per round up to the last round any member's mask needs
    (member p seeing member p - i's keys), minus the last, which receives nothing; 0 where no ring runs."""
    if case.algorithm not in ("ring", "usp") or case.ring == 1:
        return 0
    seq, causal, cu, window = case.spec
    members = member_tokens(case.token_layout, case.ring, seq, causal, cu, window)
    docs = None if cu is None else document_ids(cu, seq)
    need = [i for i in range(case.ring) for p in range(case.ring) if attended(
        members[p], members[(p - i) % case.ring], causal=causal, documents=docs, window=window).any()]
    return max(need)


@shared_world("masked_exact")
@pytest.mark.parametrize("world", WORLDS[1:])
def test_a_ring_sends_keys_only_as_far_as_the_mask_needs(world):
    """A ring's K, V stop at the last round any member's mask needs (a window talks to near neighbours only, short
    documents to the ranks holding them); without a mask they go all the way round."""
    results, wrong, saved = world_results(world), [], 0
    for i, case in enumerate(cases(world)):
        want = expected_hops(case)
        for rank, r in enumerate(results):
            if r[i][3] != (want, want):
                wrong.append(f"{case} rank {rank}: sent {r[i][3]}, needed {want}")
        if case.algorithm in ("ring", "usp") and case.ring > 1:
            saved += case.ring - 1 - want
            assert case.spec[2:] != (None, None) or want == case.ring - 1, case
    assert not wrong, "\n".join(wrong)
    assert saved > 0 or world == 2  # a ring of 2 needs both rounds under every mask here


def test_sees_agrees_with_the_pair_mask():
    """``ring.sees`` decides a pair of token lists without the pair matrix; it agrees with ``kernels.attended``."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        seq = int(rng.integers(2, 40))
        cu = tuple(sorted({0, seq, *rng.integers(1, seq, int(rng.integers(0, 4))).tolist()}))
        cu = cu if rng.random() < 0.7 else None
        window = int(rng.integers(1, 12)) if rng.random() < 0.6 else None
        causal = bool(rng.random() < 0.5)
        a, b = (np.flatnonzero(rng.random(seq) < 0.2) for _ in range(2))
        docs = None if cu is None else document_ids(cu, seq)
        want = bool(attended(a, b, causal=causal, documents=docs, window=window).any())
        assert sees(a, b, causal, cu, window, seq) == want, (a, b, causal, cu, window)
    assert needed_rounds("contiguous", 8, 64, True, None, 9) == 2


def _dense(tiles, masks, seq: int) -> np.ndarray:
    """The (query, key) mask that ``span_masks`` describes, tile pair by tile pair; each pair non-empty, none twice."""
    out = np.zeros((seq, seq), dtype=bool)
    for (a, b), pairs in zip(tiles, masks):
        for j, bm in pairs:
            c0, c1 = tiles[j]
            n_r, n_c = bm.row_stop - bm.row_start, bm.col_stop - bm.col_start
            sub = np.ones((n_r, n_c), dtype=bool) if bm.mask is None else bm.mask.numpy()
            if bm.causal_offset is not None:
                sub = np.arange(n_c)[None, :] <= np.arange(n_r)[:, None] + bm.causal_offset
            assert sub.any() and not out[a:b, c0:c1].any()
            out[a + bm.row_start:a + bm.row_stop, c0 + bm.col_start:c0 + bm.col_stop] = sub
    return out


def test_ulysses_tiles_cover_the_mask_exactly():
    """Ulysses' tiles of the whole sequence visit only pairs inside one document and the window's reach, and their
    masks put together are the sequence's mask (random documents, windows, causality, degrees)."""
    rng = np.random.default_rng(1)
    for _ in range(200):
        seq, u = int(rng.integers(1, 60)), int(rng.integers(1, 5))
        cu = tuple(sorted({0, seq, *rng.integers(1, seq, int(rng.integers(0, 4))).tolist()})) if seq > 1 else None
        window = int(rng.integers(1, 20)) if rng.random() < 0.6 else None
        causal = bool(rng.random() < 0.5)
        tiles = span_tiles(seq, u, cu, window)
        docs = None if cu is None else document_ids(cu, seq)
        want = attended(np.arange(seq), np.arange(seq), causal=causal, documents=docs, window=window)
        assert np.array_equal(_dense(tiles, span_masks(seq, u, causal, cu, window), seq), want)


def test_the_matrix_covers_every_masked_algorithm():
    """Every algorithm that honours masks (and its hybrid), every policy of ring, every mask and both head shapes
    at every world size over 1."""
    for world in WORLDS[1:]:
        have = {(c.algorithm, c.ulysses > 1 and c.ring > 1, c.token_layout, c.mask, c.heads) for c in cases(world)}
        assert {a for a, *_ in have} == set(MASKED)
        for t in TOKEN_LAYOUTS + ("balanced",):
            assert all(("ring", False, t, m, h) in have for m in DOCUMENT_MASKS for h in KV_HEADS)
        for m in MATRIX_MASKS:
            assert all(any(x[0] == a and x[3] == m and x[4] == h for x in have) for a in MASKED for h in KV_HEADS)
        if world > 2:
            assert any(a == "allgather" and hybrid for a, hybrid, *_ in have)


def test_unequal_shards_are_exercised():
    """The documents leave ranks with different numbers of tokens in every layout, and Ulysses pieces too."""
    for world in WORLDS[1:]:
        for case in cases(world):
            if case.spec[2] is DOCS and case.token_layout == "contiguous" and world == 8:
                lengths = {len(p) for ring in case.pieces() for p in ring}
                assert len(lengths) > 1, case


def test_the_runtime_places_tokens_as_the_layout_module_does():
    """``member_pieces`` (what shard, the all-to-all and the masks use) is the shared layout module's placement,
    ``Layout.document_tokens`` weighted by ``masks.row_pairs`` with documents and ``Layout.tokens`` without."""
    from sp_plan.planner.masks import row_pairs

    for world in WORLDS[1:]:
        for case in cases(world):
            seq, causal, cu, window = case.spec
            lay, pieces = case.layout, case.pieces()
            weights = row_pairs(cu, causal, window) if case.token_layout == "balanced" else None
            for rank in range(world):
                c = lay.coords(rank)
                want = lay.tokens(rank, seq) if cu is None else lay.document_tokens(rank, cu, weights)
                assert np.array_equal(pieces[c.get("ring", 0)][c.get("ulysses", 0)], want), (case, rank)


def test_a_window_leaves_a_ring_only_its_neighbours():
    """A sliding window shorter than a rank's block: each rank's queries need only its own and its predecessor's
    keys, so the ring's other rounds are skipped (``round_masks`` None)."""
    from sp_plan.runtime.variants.ring import round_masks

    masks = round_masks("contiguous", 4, 64, 2, True, None, 9)
    assert [m is not None for m in masks] == [True, True, False, False]


def test_a_mask_that_empties_a_chunk_skips_it():
    """Packed documents that stay inside one rank's tokens leave the other chunks fully masked: no kernel runs on
    them (``chunk_masks`` gives None), which is what makes all-gather cheap on short documents."""
    from sp_plan.runtime.variants.allgather import chunk_masks

    masks = chunk_masks("contiguous", 4, 64, 1, True, (0, 16, 32, 48, 64), None)
    assert [m is not None for m in masks] == [False, True, False, False]


def test_bad_masks_name_their_field():
    q = torch.randn(1, 8, 2, 4)
    with pytest.raises(PlanError, match="window"):
        allgather_attention(q, q, q, window=0)
    with pytest.raises(PlanError, match="cu_seqlens"):
        allgather_attention(q, q, q, cu_seqlens=[0, 5, 4, 8])
    with pytest.raises(PlanError, match="holds 8 tokens"):
        allgather_attention(q, q, q, cu_seqlens=[0, 5, 7])
    with pytest.raises(PlanError, match="holds 8 tokens"):
        attention(q, q, q, algorithm="ulysses", groups={}, cu_seqlens=[0, 5, 7])
    # what an int cast or NumPy would take silently: a fractional window or boundary, a string, a NaN or zero scale,
    # k and v of other tokens than q (cross-attention, which no variant computes)
    for field, kw in [("window", dict(window=1.5)), ("cu_seqlens", dict(cu_seqlens=[0, 5.7, 8])),
                      ("cu_seqlens", dict(cu_seqlens="0,5,8")), ("scale", dict(scale=float("nan"))),
                      ("scale", dict(scale=0.0))]:
        with pytest.raises(PlanError) as e:
            attention(q, q, q, algorithm="ring", groups={}, **kw)
        assert e.value.field == field, kw
    with pytest.raises(PlanError) as e:
        attention(q, q[:, :4], q[:, :4], algorithm="ring", groups={})
    assert e.value.field == "k"
    # flash-attn's convention, an int32 tensor, is read as the same boundaries as a list; an empty document (a
    # repeated end) holds no token
    for algorithm in ("ring", "ulysses", "allgather"):
        padded = attention(q, q, q, algorithm=algorithm, groups={}, cu_seqlens=[0, 5, 5, 8, 8], window=3)
        assert torch.equal(padded, attention(q, q, q, algorithm=algorithm, groups={}, cu_seqlens=[0, 5, 8], window=3))
    as_tensor = attention(q, q, q, algorithm="ring", groups={}, cu_seqlens=torch.tensor([0, 5, 8], dtype=torch.int32))
    assert torch.equal(as_tensor, attention(q, q, q, algorithm="ring", groups={}, cu_seqlens=[0, 5, 8]))


@pytest.mark.parametrize("algorithm", ["wallfacer", "tokenring", "tokenring_ring", "metp"])
@pytest.mark.parametrize("mask", [{"cu_seqlens": (0, 3, 8)}, {"window": 4}])
def test_algorithms_that_cannot_honour_masks_refuse_them_naming_those_that_can(algorithm, mask):
    q = torch.randn(1, 8, 2, 4)
    with pytest.raises(PlanError) as e:
        attention(q, q, q, algorithm=algorithm, groups={}, **mask)
    assert e.value.field == next(iter(mask))
    assert all(a in str(e.value) for a in ("ring", "ulysses", "usp", "allgather"))
    assert algorithm not in MASKED


def _ctx_worker(rank: int, world: int, algorithm: str, degrees: dict, token_layout: str, planned: bool):
    from sp_plan.planner import Plan
    from sp_plan.planner.model import Workload
    from sp_plan.runtime import init

    order = [d for d in ("ulysses", "ring") if d in degrees]
    workload = Workload(seq_len=DOCS[-1], documents=list(np.diff(DOCS)), window=9 if planned else None)
    ctx = init(Plan(algorithm=algorithm, degrees=degrees, order=order, token_layout=token_layout, workload=workload))
    window = None if planned else 9  # None: the plan's window
    case = Case("ring", 1, 1, token_layout, "document+window", "GQA")
    q, k, v, do = (ctx.shard(x, cu_seqlens=DOCS, window=window) for x in inputs(case, 7))
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    out = ctx.attention(q, k, v, causal=True, cu_seqlens=DOCS, window=window)
    out.backward(do)
    return [ctx.gather(t.detach(), cu_seqlens=DOCS, window=window) for t in (out, q.grad, k.grad, v.grad)]


@pytest.mark.parametrize("algorithm, degrees, token_layout, planned", [
    ("allgather", {"ring": 4}, "zigzag", False), ("ulysses", {"ulysses": 4}, "contiguous", False),
    ("usp", {"ulysses": 2, "ring": 2}, "balanced", False), ("ring", {"ring": 4}, "balanced", True),
    ("allgather", {"ulysses": 2, "ring": 2}, "zigzag", True)])
def test_a_plan_runs_through_ctx_with_its_masks(algorithm, degrees, token_layout, planned):
    """init(plan) + ctx.shard / ctx.attention(..., cu_seqlens, window) / ctx.gather of a masked plan is exact, and
    every rank gathers the whole sequence back; a window the plan's workload gives applies where none is passed."""
    results = run_world(_ctx_worker, 4, algorithm, degrees, token_layout, planned, timeout=120)
    case = Case("ring", 1, 1, token_layout, "document+window", "GQA")
    want = reference(*inputs(case, 7), *case.spec)
    for got in results:
        for g, w in zip(got, want):
            assert float((g - w).abs().max()) <= 1e-10


def test_a_balanced_plan_needs_documents():
    """``balanced`` assigns packed documents by their work: a plan without documents cannot use it, and says so."""
    from sp_plan.planner import Plan
    from sp_plan.planner.model import Workload

    with pytest.raises(PlanError, match="token_layout"):
        Plan(algorithm="allgather", degrees={"ring": 4}, order=["ring"], token_layout="balanced")
    plan = Plan(algorithm="allgather", degrees={"ring": 4}, order=["ring"], token_layout="balanced",
                workload=Workload(seq_len=4096, documents=[100, 900, 3000]))
    assert plan.token_layout == "balanced"
