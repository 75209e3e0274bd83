"""The benchmark pages whose figures are deterministic (model only, no timing) print what the code prints now.

A change that moves a stated figure reruns the command and updates its page (and the README's headline), so these
tests fail until it does: fidelity against the papers, Llama 3 405B's layout, and tune's rescored truths.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = ROOT / "docs" / "benchmarks"


def shown(page: str, script: str) -> list[tuple[str, list[str]]]:
    """(arguments, printed lines) of every ``$ python benchmarks/SCRIPT ...`` in a page's text blocks."""
    text = (PAGES / page).read_text(encoding="utf-8")
    found = re.findall(rf"^\$ python benchmarks/{script}([^\n]*)\n(.*?)(?=^\$ |^```)", text, re.M | re.S)
    return [(args.split("#")[0].strip(), [x.rstrip() for x in out.splitlines() if x.strip()]) for args, out in found]


def printed(script: str, args: str) -> list[str]:
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args.split()], capture_output=True,
                       text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return [x.rstrip() for x in r.stdout.splitlines() if x.strip()]


FIDELITY = shown("fidelity.md", "bench_fidelity.py")
TUNE = shown("tune.md", "bench_tune.py")


def test_the_pages_show_their_commands():
    assert {a for a, _ in FIDELITY} >= {"", "--ablate", "--masks"} and len(TUNE) >= 5


@pytest.mark.parametrize("args,lines", FIDELITY, ids=[a or "default" for a, _ in FIDELITY])
def test_fidelity_page_prints_as_the_code(args, lines):
    assert printed("bench_fidelity.py", args) == lines


@pytest.mark.parametrize("args,lines", [t for t in TUNE if "--rescore" in t[0]],
                         ids=[a.split("truths/")[1].split()[0] for a, _ in TUNE if "--rescore" in a])
def test_tune_page_rescores_as_the_code(args, lines):
    """Each row a page shows (world, workload: Spearman, step and memory errors, regrets) is the rescore's."""
    rows = [x for x in lines if re.match(r"^(local\d|netns2x2) +[AB] ", x)]
    assert rows and set(rows) <= set(printed("bench_tune.py", args))


def test_llama3_page_prints_as_the_code():
    text = (PAGES / "llama3.md").read_text(encoding="utf-8")
    block = re.search(r"^```text\n(published.*?)^```", text, re.M | re.S).group(1)
    timed = re.compile(r"\(grid search [\d.]+ s\)")  # the search's time, the one figure that varies
    lines = [timed.sub("", x).rstrip() for x in block.splitlines() if x.strip()]
    out = [timed.sub("", x).rstrip() for x in printed("bench_llama3.py", "")]
    assert out[out.index(lines[0]):] == lines
