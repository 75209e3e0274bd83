"""An output path that is not a plain file keeps what it is: a symlink stays a link (its target is written), a
device or FIFO is written in place, never replaced by a regular file."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sp_plan.planner import yamlio
from sp_plan.planner.errors import PlanError
from sp_plan.planner.plan import Plan

TEXT = "algorithm: ring\n"


def _link(tmp_path: Path) -> tuple[Path, Path]:
    """(a symlink in tmp_path/links, the file it names in tmp_path/real), the file holding 'old'."""
    (tmp_path / "real").mkdir()
    (tmp_path / "links").mkdir()
    target = tmp_path / "real" / "plan.yaml"
    target.write_text("old\n")
    link = tmp_path / "links" / "plan.yaml"
    link.symlink_to(os.path.relpath(target, link.parent))
    return link, target


def test_a_symlink_is_followed_and_stays_a_link(tmp_path):
    link, target = _link(tmp_path)
    yamlio.check_writable(link)
    yamlio.atomic_write(link, TEXT)
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert target.read_text() == TEXT
    assert os.listdir(tmp_path / "links") == ["plan.yaml"]  # no temporary file left beside the link
    assert os.listdir(tmp_path / "real") == ["plan.yaml"]


def test_a_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "plan.yaml"
    link.symlink_to(tmp_path / "made" / "plan.yaml")
    yamlio.check_writable(link)
    yamlio.atomic_write(link, TEXT)
    assert link.is_symlink() and (tmp_path / "made" / "plan.yaml").read_text() == TEXT


def test_a_symlink_loop_is_one_planerror(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.symlink_to(b)
    b.symlink_to(a)
    for call in (lambda: yamlio.check_writable(a), lambda: yamlio.atomic_write(a, TEXT)):
        with pytest.raises(PlanError) as e:
            call()
        assert e.value.field == "--output" and "a.yaml" in e.value.problem
    assert a.is_symlink() and b.is_symlink()


def test_dev_null_stays_a_character_device():
    yamlio.check_writable("/dev/null")
    yamlio.atomic_write("/dev/null", TEXT)
    Plan(algorithm="ring", degrees={"ring": 2}).save("/dev/null")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def _reader(fifo: Path, got: list) -> threading.Thread:
    """A thread that reads the FIFO to its end into ``got``."""
    def read():
        with open(fifo) as f:
            got.append(f.read())

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t


def test_a_fifo_receives_the_text_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "plan.yaml"
    os.mkfifo(fifo)
    yamlio.check_writable(fifo)  # returns at once: no reader is needed to check a FIFO
    got: list = []
    t = _reader(fifo, got)
    yamlio.atomic_write(fifo, TEXT)  # opening blocks until the reader opens its end
    t.join(timeout=30)
    assert not t.is_alive(), "the reader never saw the end of the text"
    assert got == [TEXT]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert os.listdir(tmp_path) == ["plan.yaml"]


@pytest.mark.skipif(not (os.path.exists("/dev/full") and stat.S_ISCHR(os.stat("/dev/full").st_mode)),
                    reason="this system has no /dev/full device")
def test_a_full_device_is_one_planerror_and_stays_a_device():
    with pytest.raises(PlanError) as e:
        yamlio.atomic_write("/dev/full", TEXT, "--report")
    assert e.value.field == "--report" and "/dev/full" in e.value.problem
    assert "No space left on device" in e.value.problem
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_a_regular_file_is_still_replaced(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text("old\n")
    inode = os.stat(path).st_ino
    yamlio.atomic_write(path, TEXT)
    assert path.read_text() == TEXT and not path.is_symlink()
    assert os.stat(path).st_ino != inode  # a new file renamed over the old one, not the old one rewritten


@pytest.mark.parametrize("name", ["plan.JSON", "plan.Json", "plan.json"])
def test_a_json_suffix_in_any_case_writes_and_reads_json(tmp_path, name):
    path = tmp_path / name
    Plan(algorithm="ring", degrees={"ring": 2}, cluster="c").save(path)
    assert json.loads(path.read_text())["cluster"] == "c"
    assert Plan.load(path).cluster == "c"


@pytest.mark.multiprocess
def test_the_cli_writes_a_plan_through_a_symlink(tmp_path):
    link, target = _link(tmp_path)
    r = subprocess.run([sys.executable, "-m", "sp_plan.cli.app", "plan", "--cluster", "cpu-local", "--model",
                        "tiny-gpt", "--seq-len", "4k", "--no-profile", "-o", str(link)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert link.is_symlink()
    assert Plan.load(target).algorithm
