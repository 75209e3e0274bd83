"""`sp-plan --help` and every command's help read as a reference: each option's meaning and default, examples."""
from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import pytest
import typer

from sp_plan.cli.app import app
from sp_plan.cli.examples import EXAMPLES

SP = [sys.executable, "-c", "from sp_plan.cli.app import main; main()"]


def commands(group, path: tuple[str, ...] = ()):
    """(command path, click command) for every command of the app, groups' commands included."""
    for name, cmd in sorted(group.commands.items()):
        if hasattr(cmd, "commands"):
            yield from commands(cmd, path + (name,))
        else:
            yield " ".join(path + (name,)), cmd


COMMANDS = list(commands(typer.main.get_command(app)))


def test_version_prints_the_installed_version():
    """Bug reports and benchmark pages name the version they ran."""
    r = subprocess.run(SP + ["--version"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == f"sp-plan {version('sp-plan')}"


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=[p for p, _ in COMMANDS])
def test_every_option_has_a_meaning_and_a_default(path, cmd):
    """Each option and argument says in one line what it is; an optional one that takes a value shows its default
    (a value typer prints, or a phrase where the default is worked out, e.g. "the plan's")."""
    assert cmd.help and cmd.help.strip(), path
    for p in cmd.params:
        if p.name == "help":
            continue
        assert p.help and p.help.strip() and "\n" not in p.help.strip(), (path, p.name)
        takes_value = not getattr(p, "is_flag", False) and not getattr(p, "count", False)
        if p.param_type_name == "option" and takes_value and not p.required:
            assert p.show_default and (p.default is not None or isinstance(p.show_default, str)), (path, p.name)


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=[p for p, _ in COMMANDS])
def test_every_command_has_examples_in_its_epilog(path, cmd):
    """The examples close each command's help; each is a full command line."""
    assert path in EXAMPLES and cmd.epilog and cmd.epilog.startswith("Examples:"), path
    for line, what in EXAMPLES[path]:
        assert ("sp-plan" in line or "-m sp_plan.cli.app" in line) and what, (path, line)  # torchrun runs the module
        assert f"  {line}" in cmd.epilog


def test_help_shows_defaults_and_examples():
    """What a user sees: a default worked out at run time is named, and the examples follow the options."""
    r = subprocess.run(SP + ["estimate", "--help"], capture_output=True, text=True, timeout=120,
                       env={"COLUMNS": "200", "PATH": ""})
    assert r.returncode == 0, r.stderr
    assert "[default: (the plan's)]" in r.stdout and "Examples:" in r.stdout
    assert "sp-plan estimate plan.yaml --cluster dgx-h100 --nodes 2" in r.stdout
    top = subprocess.run(SP + ["--help"], capture_output=True, text=True, timeout=120, env={"COLUMNS": "200", "PATH": ""})
    assert "--version" in top.stdout and all(f" {c} " in top.stdout for c in ("plan", "tune", "serve", "profile"))
