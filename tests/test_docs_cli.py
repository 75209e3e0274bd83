"""The site's CLI reference lists every command, argument and option that `sp-plan --help` and each subcommand's
help show, so the reference page cannot fall behind the CLI.

The reference is rendered the way the site build renders it (the mkdocs hook in docs/hooks), and compared with the
help screens as a user sees them (rich's boxes, read back from the text).
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from sp_plan.cli.app import app

ROOT = Path(__file__).resolve().parent.parent
HEADING = re.compile(r"^#+ `(sp-plan(?: [\w-]+)*)`$", re.M)
PANEL = re.compile(r"^╭─ (\w+) ─")


def hook_module():
    """docs/hooks/sp_plan_docs.py, the module mkdocs runs to generate the reference pages."""
    spec = importlib.util.spec_from_file_location("sp_plan_docs", ROOT / "docs" / "hooks" / "sp_plan_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference() -> dict[str, str]:
    """The generated CLI reference, split into one Markdown section per command path."""
    text = hook_module().cli_markdown()
    heads = list(HEADING.finditer(text))
    return {m.group(1): text[m.end():heads[i + 1].start() if i + 1 < len(heads) else len(text)]
            for i, m in enumerate(heads)}


def command_paths(command, path=("sp-plan",)) -> list[tuple[str, ...]]:
    """Every command path of the click tree the Typer app builds, the app itself first."""
    paths = [path]
    for name, sub in getattr(command, "commands", {}).items():
        if not sub.hidden:
            paths += command_paths(sub, path + (name,))
    return paths


def help_screen(path: tuple[str, ...]) -> str:
    """What `sp-plan ... --help` prints, wide enough that no option name is wrapped."""
    res = CliRunner().invoke(app, [*path[1:], "--help"], env={"COLUMNS": "250", "TERMINAL_WIDTH": "250"},
                             terminal_width=250)
    assert res.exit_code == 0, res.output
    return res.output


def panels(screen: str) -> dict[str, list[str]]:
    """The names in the first column of each box of a help screen: options, arguments, commands."""
    found: dict[str, list[str]] = {}
    current = None
    for line in screen.splitlines():
        start = PANEL.match(line)
        if start:
            current = found.setdefault(start.group(1), [])
        elif line.startswith("╰"):
            current = None
        elif current is not None and line.startswith("│"):
            words = line.strip("│ ").lstrip("* ").split()
            names = [w for w in words[:3] if w.startswith("-")] if words and words[0].startswith("-") else words[:1]
            current.extend(names)
    return found


def mentions(section: str, name: str) -> bool:
    """Whether a reference section names an option or argument as a whole word (``-o`` is not part of ``--output``)."""
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", section) is not None


def test_the_reference_page_is_generated_from_the_app():
    """The CLI page holds the generator's marker, not a copy of the help that would go stale."""
    page = (ROOT / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    assert "<!-- sp-plan:cli -->" in page
    assert "--seq-len" not in page.split("<!-- sp-plan:cli -->")[1]


def test_the_help_reader_finds_options_commands_and_arguments():
    """The help screens are read back correctly: a known option, command and argument of each kind is found."""
    top = panels(help_screen(("sp-plan",)))
    assert {"plan", "tune", "serve", "profile"} <= set(top["Commands"])
    plan = panels(help_screen(("sp-plan", "plan")))["Options"]
    assert {"--cluster", "--seq-len", "-o", "--output", "--no-causal", "--help"} <= set(plan)
    assert "path" in panels(help_screen(("sp-plan", "show")))["Arguments"]


@pytest.mark.parametrize("path", command_paths(typer.main.get_command(app)), ids=" ".join)
def test_the_reference_lists_what_the_help_shows(path, reference):
    """Each command has a section, and it names every option, argument and subcommand its --help shows."""
    name = " ".join(path)
    assert name in reference, f"no section for `{name}` in the CLI reference"
    shown = panels(help_screen(path))
    assert shown, f"`{name} --help` showed no options"
    missing = [f"{kind}: {n}" for kind, names in shown.items() for n in names if not mentions(reference[name], n)]
    assert not missing, f"the reference's `{name}` section lacks {missing}"
