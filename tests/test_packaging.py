"""The wheel carries every subpackage: pyproject lists packages by hand, so a new folder must be listed too."""
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE_WHEEL = {"tests", "benchmarks", "docs", "site", "examples", ".git", ".ci", "build"}


def _source_packages() -> set[str]:
    """Every folder under the repository root with an __init__.py, named as installed (sp_plan.<path>)."""
    names = set()
    for init in ROOT.rglob("__init__.py"):
        rel = init.parent.relative_to(ROOT)
        if rel.parts and (rel.parts[0] in OUTSIDE_WHEEL or rel.parts[0].startswith(".")):
            continue
        if any(part.endswith(".egg-info") or part == "__pycache__" for part in rel.parts):
            continue
        names.add(".".join(("sp_plan",) + rel.parts))
    return names


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_listed_for_the_wheel():
    listed = set(_setuptools()["packages"])
    missing = _source_packages() - listed
    assert not missing, f"add {sorted(missing)} to [tool.setuptools] packages and package-dir in pyproject.toml"


def test_every_listed_package_maps_to_a_folder_with_an_init():
    """A code package has an __init__.py; a data folder (presets, alembic's scripts, which alembic reads by path) has
    none, and is listed so that setuptools ships it: it, or the folder it is in, names its package data."""
    conf = _setuptools()
    data = conf["package-data"]
    for name in conf["packages"]:
        folder = conf["package-dir"].get(name, "/".join(name.split(".")[1:]) or ".")
        if not (ROOT / folder / "__init__.py").is_file():
            assert name in data or name.rsplit(".", 1)[0] in data, f"{name} maps to {folder}, which has no __init__.py"


def test_package_data_globs_match_files():
    conf = _setuptools()
    for name, globs in conf["package-data"].items():
        folder = ROOT / conf["package-dir"][name]
        for pattern in globs:
            assert list(folder.glob(pattern)), f"{name}: package-data {pattern!r} matches no file under {folder}"
