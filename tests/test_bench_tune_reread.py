"""bench_tune --reread: the readings of a second measurement join a kept truth's, and the estimators read them."""
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def bt(script):
    return script("benchmarks/bench_tune.py")


def test_readings_join_the_kept_ones_and_decide_the_truth(bt):
    truth = [{"summary": "a", "status": "ok", "measured_s": 1.0, "detail": {"readings_s": [1.0], "iters": 3}},
             {"summary": "b", "status": "ok", "measured_s": 1.1},  # an older row: no readings kept
             {"summary": "c", "status": "ok", "measured_s": 0.9, "detail": {"readings_s": [0.9, 0.95]}}]
    more = {"a": [0.8, 1.2], "b": [1.3], "zzz": [0.1]}
    out = bt.add_readings(truth, more)
    assert [t["detail"]["readings_s"] for t in out[:2]] == [[1.0, 0.8, 1.2], [1.1, 1.3]]
    assert out[0]["detail"]["iters"] == 3 and out[2] == truth[2]
    assert truth[0]["detail"]["readings_s"] == [1.0]  # the kept truth is not changed in place
    assert [t["measured_s"] for t in bt.truth_by(out, "fastest")] == [0.8, 1.1, 0.9]
    assert [t["measured_s"] for t in bt.truth_by(out, "median")] == pytest.approx([1.0, 1.2, 0.925])


def test_blocked_truth_takes_the_passes_as_blocks(bt):
    # a first pass read a, b and c at the host's speed 1.0; a reread of b and c ran at 0.85, then at 1.2
    speed, true = [1.0, 0.85, 1.2], {"a": 1.0, "b": 1.04, "c": 1.1}
    truth = [{"summary": k, "status": "ok", "measured_s": 0.0,
              "detail": {"readings_s": [true[k] * v for v in (speed[:1] if k == "a" else speed)]}} for k in "abc"]
    fastest = {t["summary"]: t["measured_s"] for t in bt.truth_by(truth, "fastest")}
    assert min(fastest, key=fastest.get) == "b"  # b's fastest reading is from a fast pass a was not read in
    got = {t["summary"]: t["measured_s"] for t in bt.truth_by(truth, "blocked")}
    assert got == pytest.approx(true)  # each layout at the median pass's speed (1.0): the passes' speeds taken out
    # a first pass of many layouts (at 0.9) sets the level, not two reread passes of two layouts (at 1.3) beside it
    first = {**true, **{f"x{i}": 2.0 + i / 10 for i in range(6)}}
    reads = {k: [v * 0.9] + ([v * 1.3] * 2 if k in "bc" else []) for k, v in first.items()}
    rows = [{"summary": k, "status": "ok", "measured_s": 0.0, "detail": {"readings_s": r}} for k, r in reads.items()]
    got = {t["summary"]: t["measured_s"] for t in bt.truth_by(rows, "blocked")}
    assert got == pytest.approx({k: v * 0.9 for k, v in first.items()})


def test_additive_fit_recovers_an_additive_table_with_gaps(bt):
    row, col = [0.0, 0.3, -0.2, 0.5], [0.0, -0.4, 0.1, 0.25, 0.7]
    table = [[2.0 + r + c for c in col] for r in row]
    table[0][1] = table[2][4] = table[3][0] = None
    table[1] = table[1][:2]  # a row read in the first two passes only
    rows, cols = bt.additive_fit(table)
    assert [r - rows[0] for r in rows] == pytest.approx([0.0, 0.3, -0.2, 0.5]) and cols == pytest.approx(col)
    assert rows[0] == pytest.approx(2.0)


def test_reread_refuses_a_folder_without_a_kept_tune_and_an_existing_keep(tmp_path):
    import subprocess
    import sys

    bench = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_tune.py"
    run = lambda *a: subprocess.run([sys.executable, str(bench), "--worlds", "local4", "--reread", "2", *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=60)
    r = run("--truth", str(tmp_path), "--keep", str(tmp_path / "new"))
    assert r.returncode == 2 and "--truth:" in r.stderr and "holds no kept truth" in r.stderr
    kept = tmp_path / "local4"
    kept.mkdir()
    for f in ("cluster.yaml", "truth-A.json", "store.db"):
        (kept / f).write_text("")
    r = run("--truth", str(tmp_path), "--keep", str(tmp_path))
    assert r.returncode == 2 and "--keep:" in r.stderr and "exists" in r.stderr
    assert "Traceback" not in r.stderr


KEPT = Path(__file__).resolve().parent.parent / "benchmarks" / "truths" / "local4"


def test_pack_keeps_what_rescore_reads(bt, tmp_path):
    """A --keep folder (plain JSON, a SQLite store) packed for benchmarks/truths judges the same: the repository keeps
    compressed text, not a database, and must not change a figure by it."""
    import gzip
    import json

    from sp_plan.profiles.store import Store

    keep = tmp_path / "keep"
    bt.copy_kept(KEPT / "local4", keep / "local4")
    world = keep / "local4"
    profile = bt.kept_profile(world)
    (world / bt.PROFILE).unlink()
    Store(f"sqlite:///{world / 'store.db'}").save_profile(profile)
    assert json.loads((world / "truth-A.json").read_text()) == bt.read_json(KEPT / "local4", "truth-A.json")
    before = json.dumps(bt.rescore(keep, "blocked"))  # as text: the times not run are NaN

    written = bt.pack(keep)
    assert sorted(f.name for f in written) == sorted(["head-to-head-A.json.gz", "truth-A.json.gz", "truth-B.json.gz",
                                                      bt.PROFILE])
    assert sorted(f.name for f in world.iterdir()) == sorted([f.name for f in written] + ["cluster.yaml"])
    assert bt.kept_profile(world) == profile
    assert gzip.decompress((world / bt.PROFILE).read_bytes()).decode().startswith("schema_version: 1\n")  # YAML text
    assert json.dumps(bt.rescore(keep, "blocked")) == before
    assert (world / "truth-A.json.gz").read_bytes() == (KEPT / "local4" / "truth-A.json.gz").read_bytes()  # no mtime


def test_pack_refuses_a_folder_without_a_world(tmp_path):
    import subprocess
    import sys

    bench = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_tune.py"
    r = subprocess.run([sys.executable, str(bench), "--pack", str(tmp_path)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "--pack:" in r.stderr and "holds no world's folder" in r.stderr
    assert "Traceback" not in r.stderr
