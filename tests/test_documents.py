"""Packed documents: the workload's documents, window and seed, the cited distributions, and packs drawn from them."""
import hashlib
import math

import numpy as np
import pytest

from sp_plan.planner import PlanError
from sp_plan.planner.documents import (batch_cu_seqlens, check_cu_seqlens, draw_packs, histogram_of, mean_length,
                                       pack, sample_lengths, workload_packs)
from sp_plan.planner.model import DocumentLengths, Histogram, Window, Workload
from sp_plan.planner.yamlio import yaml_dump, yaml_load
from sp_plan.profiles.documents import (document_presets, documents_from_file, load_documents, read_lengths,
                                        resolve_documents)


# ---------------------------------------------------------------- the workload's fields

def test_a_workload_without_documents_loads_and_dumps_as_before():
    old = {"seq_len": 131072, "batch": 4, "causal": True, "training": True}
    w = Workload.model_validate(old)
    assert w.documents is None and w.window is None and w.seed is None
    assert w.model_dump(mode="json", exclude_none=True) == old


def test_documents_window_and_seed_round_trip_through_yaml():
    w = Workload(seq_len="32k", documents=load_documents("magi-short"), window={"size": 4096, "pattern": "5:1"},
                 seed=7)
    again = Workload.model_validate(yaml_load(yaml_dump(w.model_dump(mode="json", exclude_none=True))))
    assert again == w and hash(again) == hash(w)
    assert again.documents.name == "magi-short" and again.window.pattern == "5:1" and again.seed == 7


def test_a_list_of_lengths_is_a_sample_and_the_seed_defaults_to_zero_recorded():
    w = Workload(seq_len=1024, documents=[100, 300, 50])
    assert w.documents == DocumentLengths(lengths=(100, 300, 50)) and w.documents.source == "inline"
    assert w.seed == 0 and w.model_dump(exclude_none=True)["seed"] == 0


def test_an_integer_window_applies_to_every_layer():
    w = Workload(seq_len=8192, window=4096)
    assert w.window == Window(size=4096)
    assert w.window.windowed_layers(32) == 32 and w.window.layer_window(5) == 4096


def test_a_5_to_1_pattern_windows_five_layers_then_one_global():
    win = Window(size=1024, pattern="5:1")
    assert [win.layer_window(i) for i in range(12)] == [1024] * 5 + [None] + [1024] * 5 + [None]
    assert win.windowed_layers(62) == 52  # Gemma 3 27B: 62 layers, 10 full repeats + 2 local


def test_a_window_covering_the_sequence_is_full_attention_with_a_note():
    assert Workload(seq_len=4096, window=4096).notes == [
        "window 4096 covers the 4096-token sequence: full attention on its layers"]
    assert Workload(seq_len=4096, window=4095).notes == []


@pytest.mark.parametrize("fields, field", [
    ({"documents": [100, 0]}, "workload.documents[1]"),
    ({"documents": [-5]}, "workload.documents[0]"),
    ({"documents": []}, "workload.documents.lengths"),
    ({"documents": "magi-short"}, "workload.documents"),
    ({"window": 0}, "workload.window"),
    ({"window": -3}, "workload.window"),
    ({"window": {"size": 0}}, "workload.window"),
    ({"window": {"size": 64, "pattern": "5-1"}}, "workload.window.pattern"),
    ({"window": {"size": 64, "pattern": "0:1"}}, "workload.window.pattern"),
    ({"seed": 3}, "workload.seed"),
    ({"documents": {"kind": "lognormal", "mean": 10, "sigma": 1, "min": 50, "max": 20}}, "workload.documents.min"),
    ({"documents": {"kind": "histogram", "edges": [0, 10, 5], "weights": [1, 1]}}, "workload.documents.edges"),
    ({"documents": {"kind": "histogram", "edges": [0, 10], "weights": [1, 1]}}, "workload.documents.weights"),
    ({"documents": {"kind": "histogram", "edges": [0, 10], "weights": [0]}}, "workload.documents.weights"),
    ({"documents": {"kind": "histogram", "edges": [0, 1, 10], "weights": [1, 1]}}, "workload.documents.edges"),
])
def test_bad_documents_or_window_name_the_field_and_the_fix(fields, field):
    with pytest.raises(PlanError) as e:
        Workload(seq_len=1024, **fields)
    assert e.value.field == field and e.value.fix


def test_unknown_fields_are_refused():
    with pytest.raises(Exception, match="extra"):
        Workload(seq_len=1024, window={"size": 8, "layers": 3})


# ---------------------------------------------------------------- the cited distributions

def test_the_named_distributions_are_defined_and_cite_their_source():
    assert {"megatron-dcp", "magi-short", "magi-long"} <= set(document_presets())
    for name in document_presets():
        d = load_documents(name)
        assert d.name == name and len(d.source) > 40
    meg = load_documents("megatron-dcp")
    assert (meg.kind, meg.min, meg.max, meg.mean, meg.sigma) == ("lognormal", 128, 8192, 1024, 1.5)
    assert "Megatron-LM" in meg.source and "MagiAttention" in load_documents("magi-long").source
    assert sum(load_documents("magi-long").weights) == pytest.approx(1.31)
    with pytest.raises(PlanError, match="magi-short"):
        load_documents("magi-shrt")


def _share_at_least(h: Histogram, cut: int) -> tuple[float, float, float]:
    """Exact shares of documents, tokens and L^2 work in documents of at least ``cut`` tokens under ``h``."""
    docs = toks = work = 0.0
    tot = [0.0, 0.0, 0.0]
    for lo, hi, w in zip(h.edges, h.edges[1:], h.weights):
        L = np.arange(max(lo, 1), hi, dtype=float)
        p = w / len(L)
        part = (p * len(L), p * L.sum(), p * (L ** 2).sum())
        tot = [a + b for a, b in zip(tot, part)]
        if lo >= cut:
            docs, toks, work = docs + part[0], toks + part[1], work + part[2]
    return docs / tot[0], toks / tot[1], work / tot[2]


def test_magi_short_puts_most_of_the_work_in_a_few_long_documents():
    """The shares the masks work rests on (derived from MagiAttention's short histogram, uniform within bins)."""
    h = load_documents("magi-short")
    assert _share_at_least(h, 4096) == pytest.approx((0.123, 0.503, 0.900), abs=0.001)
    assert _share_at_least(h, 8192) == pytest.approx((0.037, 0.287, 0.777), abs=0.001)


# ---------------------------------------------------------------- drawing lengths and packs

def test_lognormal_draws_follow_megatron_clipped_and_floored():
    d = load_documents("megatron-dcp")
    x = sample_lengths(d, 200_000, np.random.default_rng(1))
    assert x.dtype == np.int64 and x.min() == 128 and x.max() == 8192
    mu = np.log(1024) - 1.5 ** 2 / 2  # P(raw draw < 128) and P(> 8192) land on the clip values
    assert (x == 128).mean() == pytest.approx(_lognormal_cdf(129, mu, 1.5), abs=0.005)  # floored: [128, 129) -> 128
    assert (x == 8192).mean() == pytest.approx(1 - _lognormal_cdf(8192, mu, 1.5), abs=0.003)
    raw = np.random.default_rng(1).lognormal(mu, 1.5, size=200_000)  # the same draws: floored, not rounded
    assert np.array_equal(x, np.floor(np.clip(raw, 128, 8192)).astype(np.int64))


def _lognormal_cdf(x: float, mu: float, sigma: float) -> float:
    """P(X <= x) for ln X ~ N(mu, sigma^2) (the closed form; scipy.stats takes seconds to import)."""
    return 0.5 * (1 + math.erf((math.log(x) - mu) / (sigma * math.sqrt(2))))


def test_histogram_draws_stay_in_their_bins_with_the_bins_weights():
    h = Histogram(edges=(0, 10, 100), weights=(3.0, 1.0))
    x = sample_lengths(h, 100_000, np.random.default_rng(2))
    assert x.min() == 1 and x.max() == 99
    assert (x < 10).mean() == pytest.approx(0.75, abs=0.01)
    assert mean_length(h) == pytest.approx(0.75 * 5 + 0.25 * 54.5)


def test_a_list_is_drawn_with_replacement():
    x = sample_lengths(DocumentLengths(lengths=(5, 7)), 1000, np.random.default_rng(3))
    assert set(x.tolist()) == {5, 7}


def test_packing_cuts_the_stream_and_long_documents_into_sequence_pieces():
    packs = pack([3, 10, 2, 9], seq_len=8, sequences=3)
    assert [p.tolist() for p in packs] == [[0, 3, 8], [0, 5, 7, 8], [0, 8]]
    assert all(p[-1] == 8 for p in packs)


def test_a_document_longer_than_the_sequence_becomes_sequence_length_pieces():
    packs = pack([20, 5], seq_len=8, sequences=3)
    assert [p.tolist() for p in packs] == [[0, 8], [0, 8], [0, 4, 8]]


def test_too_few_tokens_to_pack_is_an_error():
    with pytest.raises(PlanError, match="covering 16"):
        pack([3, 4], seq_len=8, sequences=2)


def test_the_same_seed_gives_the_same_packs_and_another_seed_others():
    d = load_documents("magi-short")
    a, b = draw_packs(d, 16384, 4, seed=0), draw_packs(d, 16384, 4, seed=0)
    c = draw_packs(d, 16384, 4, seed=1)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(len(x) == len(y) and np.array_equal(x, y) for x, y in zip(a, c))
    for cu in a:
        assert cu[0] == 0 and cu[-1] == 16384 and np.all(np.diff(cu) > 0)
        assert np.diff(cu).max() <= 65535  # magi-short's longest bin stops below 64k


def test_workload_packs_follow_the_workload_and_default_to_one_document():
    assert [p.tolist() for p in workload_packs(Workload(seq_len=64, batch=2), 2)] == [[0, 64], [0, 64]]
    w = Workload(seq_len=4096, documents=load_documents("megatron-dcp"), seed=5)
    assert all(np.array_equal(x, y) for x, y in zip(workload_packs(w, 3), draw_packs(w.documents, 4096, 3, 5)))


def test_batch_cu_seqlens_lays_the_sequences_end_to_end():
    cu = batch_cu_seqlens([np.array([0, 3, 8]), np.array([0, 8]), np.array([0, 2, 8])])
    assert cu.dtype == np.int32 and cu.tolist() == [0, 3, 8, 16, 18, 24]


@pytest.mark.parametrize("cu", [[0], [1, 4], [0, 5, 4], [0, 0], [[0, 8]]])
def test_bad_cu_seqlens_are_named(cu):
    with pytest.raises(PlanError, match="cu_seqlens"):
        check_cu_seqlens(cu)
    with pytest.raises(PlanError, match="ends at 8"):
        check_cu_seqlens([0, 8], seq_len=16)


def test_empty_documents_in_cu_seqlens_are_dropped():
    """flash-attn's varlen kernels take a repeated end (an empty document), as a cu_seqlens padded to a fixed size
    with its last value has: it holds no token, so it is dropped, wherever the boundaries are read."""
    from sp_plan.planner.layout import document_ring_tokens

    assert check_cu_seqlens([0, 3, 3, 8, 8, 8], seq_len=8).tolist() == [0, 3, 8]
    for layout in ("contiguous", "zigzag", "striped", "balanced"):
        padded = document_ring_tokens(layout, 2, [0, 0, 5, 5, 16, 16], weights=np.ones(16))
        exact = document_ring_tokens(layout, 2, [0, 5, 16], weights=np.ones(16))
        assert all(np.array_equal(a, b) for a, b in zip(padded, exact)), layout


# ---------------------------------------------------------------- files of lengths (the application layer)

def test_a_file_of_lengths_becomes_a_histogram_with_its_name_and_sha256(tmp_path):
    f = tmp_path / "lengths.txt"
    lengths = [1, 3, 7, 100, 129, 4000, 4000, 70000]
    f.write_text("\n".join(map(str, lengths)) + "\n")
    h = documents_from_file(f)
    assert h.source == "lengths.txt" and h.sha256 == hashlib.sha256(f.read_bytes()).hexdigest()
    assert sum(h.weights) == len(lengths) and h.edges[-1] == 70001
    assert len(h.edges) < 150  # compact: a plan records bins, never the raw lengths
    x = sample_lengths(h, 20_000, np.random.default_rng(0))
    assert x.min() >= 1 and x.max() <= 70000
    for v in (1, 3, 7):  # short lengths keep bins of one token
        assert (x == v).mean() == pytest.approx(1 / 8, abs=0.01)
    assert resolve_documents(str(f)) == h


def test_csv_and_parquet_files_give_their_length_column(tmp_path):
    import pandas as pd
    pd.DataFrame({"id": [1, 2, 3], "length": [10, 20, 30]}).to_csv(tmp_path / "l.csv", index=False)
    assert read_lengths(tmp_path / "l.csv").tolist() == [10, 20, 30]
    (tmp_path / "l.CSV").write_text((tmp_path / "l.csv").read_text())  # the suffix in any case
    assert read_lengths(tmp_path / "l.CSV").tolist() == [10, 20, 30]
    try:
        pd.DataFrame({"length": [5, 6]}).to_parquet(tmp_path / "l.parquet")
    except ImportError:
        pytest.skip("no parquet engine")
    assert read_lengths(tmp_path / "l.parquet").tolist() == [5, 6]


@pytest.mark.parametrize("name, text, problem", [
    ("missing.txt", None, "cannot read"),
    ("empty.txt", "", "holds no lengths"),
    ("neg.txt", "5\n-1\n", "line 2: length -1"),
    ("zero.txt", "0\n", "line 1: length 0"),
    ("frac.txt", "5\n2.5\n", "line 2"),
    ("word.txt", "5\nten\n", "line 2"),
    ("nocol.csv", "len\n5\n", "no column 'length'"),
    ("pairs.txt", "100\n100,200\n300,400\n", "line 2: '100,200' is not a whole number"),
    ("oneline.txt", "1,2,3", "line 1: '1,2,3' is not a whole number"),
    ("huge.txt", "5\n99999999999999999999\n", "line 2: length 99999999999999999999 is more than any sequence"),
    ("u64.txt", "18446744073709551615\n", "line 1: length 18446744073709551615 is more than any sequence"),
    ("inf.txt", "inf\n", "line 1: length inf is more than any sequence"),
    ("e300.csv", "length\n5\n1e300\n", "row 2: length 1e\\+?300 is more than any sequence"),
])
def test_bad_files_of_lengths_are_one_line_errors(tmp_path, name, text, problem):
    if text is not None:
        (tmp_path / name).write_text(text)
    with pytest.raises(PlanError, match=problem) as e:
        read_lengths(tmp_path / name)
    assert e.value.field == "documents" and "\n" not in str(e.value)


@pytest.mark.parametrize("lengths,own_bin", [([1, 2, 3, 8, 8, 8, 16], True), ([5, 40, 64], True), ([3, 700], False)])
def test_histogram_of_keeps_each_length_in_a_bin_that_holds_it_and_the_longest_alone_on_an_edge(lengths, own_bin):
    """Every length falls in a bin holding it; where the longest is a bin edge (16 and 64: octaves of the 8 bins
    per doubling; 700 is none) it keeps its own one-token bin, so it is drawn as itself and nothing past it."""
    h = histogram_of(lengths, "x.txt")
    edges = np.asarray(h.edges)
    top = max(lengths)
    assert edges[-1] == top + 1 and sum(h.weights) == len(lengths)
    for x in lengths:
        b = np.searchsorted(edges, x, side="right") - 1
        assert edges[b] <= x < edges[b + 1] and h.weights[b] > 0
    assert (edges[-2] == top) == own_bin


def test_histogram_of_refuses_an_empty_sample():
    with pytest.raises(PlanError, match="no lengths"):
        histogram_of([], "x.txt")


def test_a_plan_records_the_documents_compactly_and_reads_them_back(tmp_path):
    from sp_plan.planner.plan import Plan
    w = Workload(seq_len="64k", documents=load_documents("magi-short"), window={"size": 4096, "pattern": "5:1"},
                 seed=11)
    Plan(algorithm="ring", degrees={"ring": 2}, workload=w).save(tmp_path / "plan.yaml")
    text = (tmp_path / "plan.yaml").read_text()
    assert "magi-short" in text and "MagiAttention" in text and len(text) < 4000
    assert Plan.load(tmp_path / "plan.yaml").workload == w


def test_a_window_size_alone_keeps_the_layer_pattern_and_a_pattern_alone_the_size():
    """Overriding one half of a plan's windowed layers keeps the other half (``with_masks``, as `estimate` and
    `report` read their --window and --window-pattern)."""
    from sp_plan.pipeline import with_masks

    base = Workload(seq_len=4096, window=Window(size=512, pattern="5:1"))
    assert with_masks(base, window=1024).window == Window(size=1024, pattern="5:1")
    assert with_masks(base, window_pattern="1:1").window == Window(size=512, pattern="1:1")
    assert with_masks(base, window=256, window_pattern="3:1").window == Window(size=256, pattern="3:1")
    with pytest.raises(PlanError, match="needs a window size"):
        with_masks(Workload(seq_len=4096), window_pattern="5:1")


@pytest.mark.parametrize("documents, longest", [
    (None, 4096),
    ([100, 3000, 20], 3000),
    ([100, 9000], 4096),  # a document beyond the sequence is cut to it
    ({"kind": "lognormal", "mean": 500, "sigma": 1.5, "min": 128, "max": 2048}, 2048),
    ({"kind": "histogram", "edges": [1, 1024, 2048, 3000], "weights": [1, 2, 0]}, 2047),  # the last bin is empty
])
def test_a_window_covering_the_longest_document_masks_nothing(documents, longest):
    """mask_window is the window where it masks a pair, None from the longest document a pack can draw up: then
    every query sees its whole document, and the note says so."""
    work = Workload(seq_len=4096, documents=documents, window=longest - 1)
    assert work.longest_document == longest and work.mask_window == Window(size=longest - 1) and work.notes == []
    covered = Workload(seq_len=4096, documents=documents, window=longest)
    assert covered.mask_window is None and covered.window == Window(size=longest)
    assert covered.notes and "full attention" in covered.notes[0]


def test_the_note_names_documents_where_the_window_is_shorter_than_the_sequence():
    assert Workload(seq_len=8192, documents=[100, 2000], window=2000).notes == [
        "window 2000 covers every document (at most 2000 tokens): full attention on its layers"]
