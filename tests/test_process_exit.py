"""A command's process ends without the interpreter's teardown (``service.collector.exit_without_teardown``): its exit
handlers still run and its output is all there."""
from __future__ import annotations

import subprocess
import sys

EXIT = """import atexit, sys, threading, time
from sp_plan.service.collector import exit_without_teardown
atexit.register(lambda: print("handler ran", file=sys.stderr))
sys.stdout.write("x" * 200_000)  # more than a pipe's buffer: still in the stream's buffer when the process ends
if sys.argv[1] == "thread":
    threading.Thread(target=time.sleep, args=(2.0,)).start()
exit_without_teardown(3)
print("returned", file=sys.stderr)
"""


def ended(case: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", EXIT, case], capture_output=True, text=True, timeout=60)


def test_the_handlers_run_the_output_is_flushed_and_the_code_is_the_commands():
    r = ended("plain")
    assert r.returncode == 3
    assert r.stdout == "x" * 200_000
    assert r.stderr == "handler ran\n"  # and nothing after: the process ended in the call


def test_a_running_thread_leaves_the_exit_to_the_interpreter():
    """A non-daemon thread would be killed mid-work: the call returns, and the interpreter waits for it."""
    r = ended("thread")
    assert r.returncode == 0
    assert r.stderr == "returned\nhandler ran\n"


def test_the_console_entry_point_ends_a_command_with_its_output_complete(tmp_path):
    """`sp-plan plan -o` through the entry point: the tables and the plan file are whole, and the code is 0."""
    out = tmp_path / "plan.yaml"
    r = subprocess.run([sys.executable, "-c", "from sp_plan.cli.app import main; main()", "plan", "--cluster",
                        "dgx-h100", "--nodes", "1", "--model", "llama3-8b", "--seq-len", "32k", "--no-profile", "-o",
                        str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip().endswith(f"wrote {out}")
    assert "algorithm:" in out.read_text()
