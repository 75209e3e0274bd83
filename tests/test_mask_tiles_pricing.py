"""Masked blocks priced as their tiles (planner/masks/ ``pack_tiles``, planner/schedules.py ``tiled``): the
planner counts the kernel calls the runtime makes, prices a block at its document pieces' length, never below the
block's own price, and leaves one document per sequence as it was."""
import numpy as np
import pytest

from sp_plan.planner import Estimator, Workload
from sp_plan.planner.documents import draw_packs
from sp_plan.planner.layout import BALANCE_POLICIES
from sp_plan.planner.masks import layout_tokens, mask_tiles, pack_tiles, pair_matrix
from sp_plan.planner.model import ModelSpec
from sp_plan.planner.params import Curve, Params
from sp_plan.planner.schedules import ALGORITHMS, Compute, Shape, attention_steps
from sp_plan.profiles import load_cluster
from sp_plan.profiles.documents import load_documents

MASKS = [(True, None), (False, None), (True, 300), (False, 300), (True, 1)]


def runtime_tiles(token_layout, ring, cu, causal, window):
    """The kernel calls the runtime's ring and all-gather make: every member's queries against every member's keys
    (``ring.member_block``), summed over the pairs of members."""
    from sp_plan.runtime.variants.ring import member_block

    cu_t = tuple(int(x) for x in cu)
    return sum(len(member_block(token_layout, ring, cu_t[-1], causal, cu_t, window, r, j) or ())
               for r in range(ring) for j in range(ring))


def packs(name="magi-short", tokens=8192, n=2):
    return draw_packs(load_documents(name), tokens, n, 0)


@pytest.mark.parametrize("token_layout", BALANCE_POLICIES)
@pytest.mark.parametrize("causal, window", MASKS)
def test_the_planner_counts_the_tiles_the_runtime_runs(token_layout, causal, window):
    for cu in packs() + packs("megatron-dcp", 4096, 1):
        for ring in (2, 5, 8):
            assert pack_tiles(token_layout, ring, cu, causal, window)[0] == runtime_tiles(token_layout, ring, cu,
                                                                                            causal, window)


@pytest.mark.parametrize("causal, window", MASKS)
def test_ulysses_alone_counts_its_spans_tiles(causal, window):
    """Ulysses attends each document in tiles of at most S/U tokens (runtime ulysses.span_masks)."""
    from sp_plan.runtime.variants.ulysses import span_masks

    for cu in packs():
        cu_t = tuple(int(x) for x in cu)
        for u in (1, 4, 8):
            want = sum(len(m) for m in span_masks(cu_t[-1], u, causal, cu_t, window))
            assert pack_tiles("contiguous", 1, cu, causal, window, -(-cu_t[-1] // u))[0] == want


@pytest.mark.parametrize("token_layout", BALANCE_POLICIES)
def test_bidirectional_entries_over_length_are_each_document_pieces_pairs_over_their_length(token_layout):
    """Without causality or a window each pair of a document's rank pieces (n_r, n_j tokens) is a tile of n_r n_j
    entries and length sqrt(n_r n_j): the closed form is their sum, token by token."""
    for cu in packs():
        for ring in (3, 8):
            tokens = layout_tokens(token_layout, ring, cu, False, None)
            want = 0.0
            for d in range(len(cu) - 1):
                one = [t[(t >= cu[d]) & (t < cu[d + 1])] for t in tokens]
                n = np.array([len(t) for t in one], dtype=float)
                m = pair_matrix([t - cu[d] for t in one], [0, cu[d + 1] - cu[d]], False, None)
                live = np.outer(n, n) > 0
                want += (m[live] / np.sqrt(np.outer(n, n)[live])).sum()
            assert pack_tiles(token_layout, ring, cu, False, None)[2] == pytest.approx(want, rel=1e-12)


def test_zigzag_cuts_short_documents_into_more_and_shorter_tiles_than_contiguous():
    """Megatron's lognormal at 16k on 8 ranks: zigzag's 2P pieces of every document make tens of times the calls of
    contiguous, each a few dozen tokens; Ulysses' tiles are whole documents."""
    work = Workload(seq_len=16384, documents=load_documents("megatron-dcp"))
    z, c, u = (mask_tiles(work, lay, ring, 1, uly) for lay, ring, uly in
               (("zigzag", 8, 1), ("contiguous", 8, 1), ("contiguous", 1, 8)))
    assert z.tiles > 20 * c.tiles and z.length < c.length / 3
    assert u.length > c.length and u.pairs == pytest.approx(c.pairs)


def model(layers=2):
    return ModelSpec(layers=layers, hidden=4096, heads=32, kv_heads=8, vocab=0)


PROFILE = Params(attention_fwd=Curve(points=((64, 0.1), (256, 0.27), (1024, 0.31))),
                 attention_fwd_masked=Curve(points=((64, 0.06), (256, 0.12), (1024, 0.2))),
                 attention_bwd=Curve(points=((64, 0.12), (256, 0.28), (1024, 0.3))),
                 attention_bwd_masked=Curve(points=((64, 0.05), (256, 0.14), (1024, 0.2))),
                 round_overhead_s=0.003, solo_speedup=4.0)


@pytest.mark.parametrize("params", [Params(), PROFILE], ids=["preset", "curves"])
@pytest.mark.parametrize("extra", [{"documents": "megatron-dcp"}, {"documents": "magi-short", "window": 512},
                                   {"window": 1024}])
def test_tiles_never_price_a_block_below_its_own_price(params, extra):
    """Every attention phase of every masked algorithm and policy costs at least what the block cost: a lower
    bound on the block (the search's pruning) stays one on its tiles."""
    extra = {**extra, "documents": load_documents(extra["documents"])} if "documents" in extra else extra
    work = Workload(seq_len=16384, **extra)
    est = Estimator(load_cluster("cpu-local", 1), model(), work, params=params)
    raised = 0
    for algorithm, uly, ring in (("ring", 1, 8), ("allgather", 1, 8), ("ulysses", 8, 1), ("usp", 2, 4)):
        for layout in BALANCE_POLICIES if ring > 1 else ("contiguous",):
            c = Shape(model(), work, dp=1, ulysses=uly, ring=ring, token_layout=layout, algorithm=algorithm)
            for backward in (False, True):
                blocks = ALGORITHMS[algorithm].steps(c, backward)
                tiles = attention_steps(c, backward)
                for a, b in zip(blocks, tiles):
                    for p, q in zip(a.phases, b.phases):
                        if type(p) is Compute and p.kind == "attention":
                            assert q.flops == p.flops and q.calls >= p.calls
                            assert est.compute_time(q) >= est.compute_time(p) * (1 - 1e-12)
                            raised += est.compute_time(q) > est.compute_time(p) * (1 + 1e-6)
    assert raised


@pytest.mark.parametrize("token_layout", BALANCE_POLICIES)
def test_one_document_per_sequence_keeps_the_rings_blocks(token_layout):
    """A pack of one document: a ring's pieces are its blocks and its tiles those its unmasked blocks stand for, so
    every phase is as it was; all-gather runs it against each member's chunk, S/P long, and Ulysses in spans of
    S/U, where their schedules price one call of S."""
    S = 32768
    work = Workload(seq_len=S, documents=[S])
    for algorithm, uly, ring, block in (("ring", 1, 8, S / 8), ("usp", 2, 4, S / 4), ("allgather", 1, 8, S / 8),
                                        ("ulysses", 8, 1, S / 8)):
        if ring == 1 and token_layout != "contiguous":
            continue
        c = Shape(model(), work, dp=1, ulysses=uly, ring=ring, token_layout=token_layout, algorithm=algorithm)
        for backward in (False, True):
            for a, b in zip(ALGORITHMS[algorithm].steps(c, backward), attention_steps(c, backward)):
                for p, q in zip(a.phases, b.phases):
                    if type(p) is not Compute or p.kind != "attention":
                        assert q == p
                    elif algorithm in ("ring", "usp"):
                        assert q == p
                    else:
                        assert q.block == pytest.approx(block) and q.flops == p.flops


def test_the_calibrated_curves_rank_contiguous_ahead_of_zigzag_on_short_documents():
    """Short documents on shared cores: with a per-call cost and curves that fall at small blocks, zigzag's many
    small tiles cost more than the contiguous ring's imbalance (what the masks benchmark measures)."""
    work = Workload(seq_len=16384, documents=load_documents("megatron-dcp"))
    est = Estimator(load_cluster("cpu-local", 1), model(1), work, params=PROFILE)
    from sp_plan.planner.candidate import Candidate

    t = {lay: est.evaluate(Candidate("ring", ring=8, order=("ring",), token_layout=lay)).step_time_s
         for lay in ("contiguous", "zigzag")}
    assert t["contiguous"] < t["zigzag"]


@pytest.mark.multiprocess
def test_the_masks_benchmark_finds_the_planners_tiles_are_the_counted_ones(capsys):
    """bench_masks counts the kernel calls on zero kernels in a gloo world; the planner's count is the same for every
    candidate (ring, all-gather, Ulysses and USP, every policy)."""
    import importlib.util
    import sys
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("bench_masks", Path(__file__).parents[1] / "benchmarks" /
                                                  "bench_masks.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses resolve their annotations there, its worlds pickle by it
    spec.loader.exec_module(bench)
    rows = bench.main(["--quick", "--world", "4", "--candidates", "none"])
    packed = [r for r in rows if not r["batch"].startswith("single")]
    assert len(packed) == len(bench.candidates(4))
    assert all(r["planned_tiles"] == r["tiles"] > 0 for r in rows if r["masked"])  # a single document's too
    assert f"planner's tiles: the counted ones for all {len(packed)}" in capsys.readouterr().out


def test_a_layer_pattern_prices_the_layer_weighted_mean_of_its_windowed_and_global_tiles():
    """Gemma 3's 5:1 over 62 layers: 52 windowed layers (ten full periods and two more) and 10 global; each price is
    their layer-weighted mean, not the global layers' alone."""
    from sp_plan.planner.masks import layout_tiles

    w = Workload(seq_len=8192, documents=load_documents("magi-short"), window={"size": 1024, "pattern": "5:1"})
    local, full = layout_tiles(w, "zigzag", 4, 1024, None), layout_tiles(w, "zigzag", 4, None, None)
    got = mask_tiles(w, "zigzag", 4, 62)
    for i in range(3):
        assert got[i] == pytest.approx((52 * local[i] + 10 * full[i]) / 62, rel=1e-12)
    assert got.tiles < full.tiles and got.pairs < full.pairs / 2  # the windowed layers weigh in


def test_ulysses_tiles_of_a_sequence_its_degree_does_not_divide_are_the_runtimes_spans():
    """S/U rounded up, as the runtime cuts its spans: 8,192 tokens over 3 ranks are 3 spans of 2,731, not 4 of 2,730."""
    from sp_plan.runtime.variants.ulysses import span_masks

    w = Workload(seq_len=8192, window=4000)
    want = sum(len(m) for m in span_masks(8192, 3, True, None, 4000))
    assert mask_tiles(w, "contiguous", 1, 1, 3).tiles == want


@pytest.mark.parametrize("causal", [True, False])
def test_striped_windows_general_path_counts_the_runtimes_tiles(monkeypatch, causal):
    """Striped under a window is priced in closed forms where they apply; the general path (where they decline:
    thousands of documents shorter than the ring) cuts a run into tiles of ceil(W/P) tokens as the runtime does, for
    a window P does not divide (300 over 8 ranks: 38, not 37)."""
    from sp_plan.planner.masks import tiles

    monkeypatch.setattr(tiles, "_striped_window_tiles", lambda *a: None)
    monkeypatch.setattr(tiles, "_striped_cut_pack", lambda *a: None)
    for cu in packs() + packs("megatron-dcp", 4096, 1):
        assert pack_tiles("striped", 8, cu, causal, 300)[0] == runtime_tiles("striped", 8, cu, causal, 300)


def test_packs_cut_from_one_long_document_price_as_that_one_pack():
    """A document longer than the sequence is cut into sequence-long pieces: every pack drawn is the same single
    document, and the mean over the samples is that pack's tiles (Ulysses alone and a ring alike)."""
    w = Workload(seq_len=8192, documents={"kind": "lengths", "lengths": [100000]})
    got = mask_tiles(w, "contiguous", 1, 32, 4)
    assert tuple(got)[:3] == pytest.approx(pack_tiles("contiguous", 1, [0, 8192], True, None, 2048)[:3], rel=1e-12)
    ring = mask_tiles(w, "zigzag", 4, 32)
    assert tuple(ring)[:3] == pytest.approx(pack_tiles("zigzag", 4, [0, 8192], True, None)[:3], rel=1e-12)
