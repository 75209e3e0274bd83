"""Where `sp-plan export` writes: a file with -o, else standard output; `-o -` is standard output too."""
from __future__ import annotations

from pathlib import Path

from sp_plan.cli.app import run_line

FIXTURE = Path(__file__).parent / "fixtures" / "plans" / "usp-16-with-groups.yaml"


def test_export_to_a_dash_prints_the_export(tmp_path, monkeypatch, capsys):
    """No file named '-' is left behind, and the export is what stdout gets."""
    monkeypatch.chdir(tmp_path)
    assert run_line(["export", str(FIXTURE), "--to", "yunchang", "-o", "-"]) == 0
    assert "LongContextAttention" in capsys.readouterr().out and not (tmp_path / "-").exists()
