"""The console blocks the README and the guides mark runnable print what the docs say they print.

A block is runnable when the line before its ```console fence is ``<!-- runnable -->``. Each ``$ `` line is a
shell command (run in a scratch directory with a fresh default store, blocks of one page in order, so a later block
may read a file an earlier one wrote); the lines after it, up to the next ``$ ``, are its expected output (stdout
and stderr together). A line ``...`` stands for any number of lines, and ``...`` inside a line (with the spaces around it) for any
text (timings, fingerprints, paths); every other character must match (blank lines before the output and spaces at
line ends aside). An expected ``error:`` line means exit status
2, otherwise 0.

The README's commands run in a shell, as a reader types them (the real `sp-plan` entry point); the guides' plain
`sp-plan ...` commands (at most a ``> /dev/null``) run in this process through typer's CliRunner, which prints
what the command prints without an interpreter start per command, and every other line runs in the shell.
"""
from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sp_plan.cli.app import app

ROOT = Path(__file__).resolve().parent.parent
#: ``...`` inside a line, with the spaces around it: any text, or none
ELISION = re.compile(r" *\.\.\. *")
FENCE = re.compile(r"^<!-- runnable -->\n```console\n(.*?)^```$", re.M | re.S)
#: the pages whose runnable blocks are checked: the front door and the guides a newcomer follows
PAGES = ["README.md", "docs/getting-started.md", *sorted(p.relative_to(ROOT).as_posix()
                                                        for p in (ROOT / "docs" / "guides").glob("*.md"))]


def blocks(page: str) -> list[str]:
    """The runnable console blocks of a page, in order."""
    return FENCE.findall((ROOT / page).read_text(encoding="utf-8"))


def commands(block: str) -> list[tuple[str, list[str]]]:
    """A console block as (command, expected output lines) pairs."""
    pairs: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            pairs.append((line[2:], []))
        elif pairs:
            pairs[-1][1].append(line)
        else:
            raise ValueError(f"output before the first command: {line!r}")
    return pairs


def pattern(expected: list[str]) -> re.Pattern:
    """A regex of the expected lines: ``...`` alone is any lines, ``...`` within a line any text."""
    parts = []
    for line in expected:
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(".*?".join(re.escape(piece) for piece in ELISION.split(line.rstrip())) + r"[ \t]*\n")
    return re.compile("".join(parts))


def matches(expected: list[str], actual: str) -> bool:
    """Whether the actual output, line ends and leading blank lines trimmed, is what the expected lines describe."""
    text = "".join(line.rstrip() + "\n" for line in actual.splitlines()).lstrip("\n")
    return pattern(expected).fullmatch(text) is not None


def first_difference(expected: list[str], actual: str) -> str:
    """The first expected line the output lacks (for a readable failure)."""
    for n in range(len(expected), 0, -1):
        if expected[n - 1].strip() == "...":
            continue
        if matches(expected[:n] + ["..."], actual):
            return f"lines after {expected[n - 1]!r} do not match"
    return f"first expected line {expected[0]!r} does not match" if expected else "expected no output"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> dict:
    """A scratch directory and an environment with a fresh default store, like a new user's shell."""
    home = tmp_path_factory.mktemp("docs-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SP_PLAN_")}
    env.update(HOME=str(home), XDG_DATA_HOME=str(home / "data"), PYTHONUNBUFFERED="1")
    return {"cwd": home, "env": env}


#: a command that runs in this process: `sp-plan` and its arguments, its output kept or sent to /dev/null
IN_PROCESS = re.compile(r"^sp-plan (?P<args>[^|&;<>`$()\\]*?)(?P<quiet> > /dev/null)?$")


def run(command: str, scratch: dict, shell: bool) -> tuple[int, str]:
    """The exit status and output (stdout and stderr together) of a documented command, in the scratch directory."""
    m = None if shell else IN_PROCESS.match(command)
    if m is None:
        res = subprocess.run(["bash", "-c", command + " 2>&1"], cwd=scratch["cwd"], env=scratch["env"],
                             capture_output=True, text=True, timeout=300)
        return res.returncode, res.stdout
    env = {k: scratch["env"].get(k) for k in {*os.environ, *scratch["env"]}}  # None unsets (SP_PLAN_STORE)
    with contextlib.chdir(scratch["cwd"]):
        res = CliRunner().invoke(app, shlex.split(m["args"]), env=env)
    assert res.exception is None or isinstance(res.exception, SystemExit), (command, res.exception)
    return res.exit_code, res.stderr if m["quiet"] else res.output


def test_the_runner_matches_elisions_and_refuses_differences():
    """The matcher itself: elided lines and text match, a changed figure or a missing line does not."""
    out = "header abc123 done\nrow 1\nrow 2\nwrote plan.yaml\n"
    assert matches(["header ... done", "...", "wrote plan.yaml"], out)
    assert matches(["header abc123 done", "row 1", "row 2", "wrote plan.yaml"], out)
    assert matches(["header abc123 ... done", "row ... 1", "...", "wrote ... plan.yaml"], out)
    assert not matches(["header ... done", "row 2", "wrote plan.yaml"], out)
    assert not matches(["header ... done", "...", "wrote plan.json"], out)
    assert not matches(["header ... done"], out)


def test_the_front_door_and_the_guides_have_runnable_blocks():
    """The README and the getting-started page show commands that this test runs, not prose alone."""
    assert blocks("README.md") and blocks("docs/getting-started.md")


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)])
def test_runnable_blocks_print_what_the_page_says(page, scratch):
    """Every command of the page's runnable blocks prints the documented output, with the documented exit status."""
    for block in blocks(page):
        for command, expected in commands(block):
            code, printed = run(command, scratch, shell=page == "README.md")
            want = 2 if any(line.startswith("error:") for line in expected) else 0
            assert code == want, f"{page}: `{command}` exited {code}:\n{printed}"
            assert matches(expected, printed), (
                f"{page}: `{command}`: {first_difference(expected, printed)}; it printed:\n{printed}")
