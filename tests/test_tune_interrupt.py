"""Ctrl-C in `sp-plan tune`: one line saying that what was measured is kept and that the same command resumes, and
the interrupted process's exit status (130), not a silent exit."""
from __future__ import annotations

from typer.testing import CliRunner

from sp_plan.cli.app import app
from sp_plan.profiles.tune import run as tune_run


def test_an_interrupted_tune_says_the_same_command_resumes(tmp_path, monkeypatch):
    def interrupted(cluster, model, work, store=None, opts=None, progress=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(tune_run, "tune", interrupted)
    monkeypatch.setattr(tune_run, "check_world", lambda cluster, world: None)
    r = CliRunner().invoke(app, ["tune", "--cluster", "dgx-h100", "--model", "llama3-8b", "--seq-len", "32k",
                                 "--store", f"sqlite:///{tmp_path}/tune.db"])
    assert r.exit_code == 130, r.stdout + r.stderr
    assert r.stderr.splitlines() == ["error: tune: interrupted; everything measured so far is stored: run the same "
                                     "command again to resume"]
