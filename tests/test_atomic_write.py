"""Every file sp-plan writes goes through planner/yamlio.atomic_write: a writer killed mid-way (SIGKILL)
leaves the old file or the new one, never a torn one; a write that fails is a clear error."""
from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sp_plan.cli.app import app
from sp_plan.planner import yamlio
from sp_plan.planner.errors import PlanError
from sp_plan.planner.plan import Plan

ROOT = Path(__file__).resolve().parents[1]
#: a writer that saves a large plan again and again, alternating two contents, and says when it started
WRITER = """
import sys
from sp_plan.planner.plan import Plan
path = sys.argv[1]
plans = [Plan(algorithm="ring", degrees={"ring": 4}, cluster=c * 200_000) for c in ("a", "b")]
print("ready", flush=True)
i = 0
while True:
    plans[i % 2].save(path)
    i += 1
    print("saved", flush=True)
"""


def test_a_killed_writer_leaves_the_old_file_or_the_new_one(tmp_path):
    path = tmp_path / "plan.yaml"
    Plan(algorithm="ring", degrees={"ring": 4}, cluster="old").save(path)
    valid = {"old", "a" * 200_000, "b" * 200_000}
    seen = set()
    for k in range(6):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, cwd=tmp_path)
        assert proc.stdout.readline().strip() == b"ready"
        for _ in range(k):  # let it replace the file k times, then kill it at a different point of a write
            assert proc.stdout.readline().strip() == b"saved"
        time.sleep(0.003 * k)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        got = Plan.load(path).cluster  # a torn file would not parse, or hold a cut string
        assert got in valid
        seen.add(got)
    assert len(seen) >= 2, "the writer never replaced the file: the test killed it too early to mean anything"
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "plan.yaml"]
    assert all(n.startswith(".plan.yaml.") for n in leftovers), leftovers  # only its own temporary files


@pytest.mark.parametrize("fail_at", ["write", "fsync", "replace"])
def test_a_failed_write_keeps_the_old_file_and_says_why(tmp_path, monkeypatch, fail_at):
    path = tmp_path / "plan.yaml"
    Plan(algorithm="ring", degrees={"ring": 2}, cluster="old").save(path)

    def full(*a, **kw):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    if fail_at == "write":
        real = os.fdopen
        monkeypatch.setattr(os, "fdopen", lambda fd, mode: _Full(real(fd, mode)))
    else:
        monkeypatch.setattr(os, fail_at, full)
    with pytest.raises(PlanError) as e:
        Plan(algorithm="ring", degrees={"ring": 2}, cluster="new").save(path)
    monkeypatch.undo()
    assert e.value.field == "--output" and "No space left on device" in e.value.problem
    assert Plan.load(path).cluster == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.yaml"]  # the temporary file is gone


class _Full:
    """A file whose writes fail as on a full disk."""

    def __init__(self, f):
        self.f = f

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def write(self, _):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("where", ["/proc/version", "/proc/sp-plan/plan.yaml", "{tmp}/a-file/plan.yaml", "{tmp}"])
def test_unwritable_outputs_are_one_line_exit_2(tmp_path, where):
    (tmp_path / "a-file").write_text("not a directory\n")
    r = CliRunner().invoke(app, ["plan", "--cluster", "cpu-local", "--model", "tiny-gpt", "--seq-len", "4k",
                                 "-o", where.format(tmp=tmp_path)])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --output:"), r.output


def test_no_module_writes_files_around_atomic_write():
    """A static guard: outside yamlio, sp-plan's code opens no file for writing and calls no write_text."""
    pattern = re.compile(r"\.write_text\(|\.write_bytes\(|open\([^)]*['\"][wax]b?\+?['\"]|\.to_csv\([^)]|\.to_json\([^)]")
    found = []
    for pkg in ("planner", "runtime", "profiles", "cli", "service", "integrations"):
        for f in (ROOT / pkg).rglob("*.py"):
            if f.name == "yamlio.py":
                continue
            for i, line in enumerate(f.read_text().splitlines(), 1):
                if pattern.search(line):
                    found.append(f"{f.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not found, "write through sp_plan.planner.yamlio.atomic_write instead:\n" + "\n".join(found)


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_plans_clusters_and_profiles_save_through_atomic_write(tmp_path, monkeypatch, suffix):
    from sp_plan.planner.profile import Profile
    from sp_plan.profiles import preset_cluster

    calls, real = [], yamlio.atomic_write
    monkeypatch.setattr(yamlio, "atomic_write", lambda path, text, field="--output": calls.append(path) or real(path, text, field))
    docs = [Plan(algorithm="ring", degrees={"ring": 2}), preset_cluster("cpu-local"), Profile(cluster_fingerprint="x")]
    for i, doc in enumerate(docs):
        doc.save(tmp_path / f"{i}{suffix}")
    assert [Path(p).name for p in calls] == [f"{i}{suffix}" for i in range(len(docs))]


@pytest.mark.parametrize("pid", ["123e4567", "4e81", "0123", "1_000", ".5", "3e1bc8b43e38"])
def test_a_written_string_reads_back_as_the_string_it_was(tmp_path, pid):
    """sp-plan reads 1e9 as a float (plain YAML 1.1 does not): a string that looks like one, e.g. a profile id
    of digits and one e such as 123e4567, must be written quoted, or a tune's plan file fails to load
    ("plan.measured.profile: Input should be a valid string")."""
    from sp_plan.planner.plan import Measured

    plan = Plan(algorithm="ring", degrees={"ring": 8}, order=["ring"],
                measured=Measured(step_time_s=1.0, peak_memory_bytes=1.0, profile=pid))
    plan.save(tmp_path / "plan.yaml")
    assert Plan.load(tmp_path / "plan.yaml").measured.profile == pid
    assert yamlio.yaml_load(yamlio.yaml_dump({"id": pid, "x": 1e9})) == {"id": pid, "x": 1e9}
