"""The README stays a short front door, the docs speak of the product (no session numbers or history), every page
is reachable, every benchmark has a page that says how its figures were made, and the generated reference pages
cover every field and endpoint."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
#: the acceptance check's pattern: session numbers and session-suffixed names say nothing to a user
HISTORY = re.compile(r"session [0-9]|[(]session|session-[0-9]|-s1[0-9]", re.I)
#: the benchmarks whose page the GPU run owns
GPU_SCRIPTS = {"bench_gpu.py", "bench_overlap.py"}


def text_files() -> list[Path]:
    """The README, the changelog, the site's configuration and every page and hook of the site."""
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "mkdocs.yml",
            *sorted(p for p in DOCS.rglob("*") if p.suffix in (".md", ".py", ".yml"))]


def nav_pages(nav) -> list[str]:
    """The page paths an mkdocs nav lists, depth first."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [p for v in nav.values() for p in nav_pages(v)]
    return [p for item in nav for p in nav_pages(item)]


def hook_module():
    """docs/hooks/sp_plan_docs.py, the module mkdocs runs to generate the reference pages."""
    spec = importlib.util.spec_from_file_location("sp_plan_docs", DOCS / "hooks" / "sp_plan_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_is_at_most_250_lines():
    """The README is the front door; the rest belongs on the site."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 250, f"README.md has {lines} lines"


def test_no_session_numbers_or_history_in_the_readme_and_docs():
    """Session numbers and session-suffixed names say nothing to a user and go stale; git log holds history."""
    hits = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in text_files()
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if HISTORY.search(line)]
    assert not hits, "\n".join(hits)


def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    """A page outside the nav cannot be found, and a nav entry without a page is a broken link."""
    nav = set(nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]))
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert pages - nav == set(), "pages not in the nav"
    assert nav - pages == set(), "nav entries without a page"


def test_the_readme_links_resolve():
    """Every relative link of the README (read on GitHub and PyPI, outside the site) names a file that exists."""
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text(encoding="utf-8"))
    local = [link for link in links if "://" not in link]
    assert local, "the README links into the docs"
    assert [link for link in local if not (ROOT / link).exists()] == []


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "benchmarks").glob("bench_*.py")))
def test_every_benchmark_has_a_page_with_its_command_machine_and_commit(script):
    """A figure is only as good as its provenance: the page of each benchmark names how, where and at what it ran."""
    pages = [p for p in (DOCS / "benchmarks").glob("*.md") if f"benchmarks/{script}" in p.read_text(encoding="utf-8")]
    assert pages, f"no page in docs/benchmarks names benchmarks/{script}"
    if script in GPU_SCRIPTS:
        assert (DOCS / "benchmarks" / "gpu.md") in pages
        return
    text = "\n".join(p.read_text(encoding="utf-8") for p in pages)
    for field in ("**Command", "**Machine", "**Commit"):
        assert field in text, f"the page of {script} does not state its {field.strip('*').lower()}"


@pytest.mark.parametrize("name", sorted(hook_module().SCHEMAS))
def test_the_file_format_reference_covers_every_field(name):
    """Each file format's generated tables name every field of its pydantic model, nested models included."""
    hook = hook_module()
    model = hook.load(hook.SCHEMAS[name])
    text = hook.model_markdown(hook.SCHEMAS[name])
    missing = [f for f in model.model_fields if f"`{f}`" not in text]
    assert not missing, f"{model.__name__}: {missing}"
    for sub in model.model_json_schema().get("$defs", {}):
        assert f"{{ #{hook.anchor(model.__name__, sub)} }}" in text, f"{model.__name__}: no section for {sub}"


def test_the_http_reference_covers_every_endpoint():
    """The HTTP page has a section for each route the service's OpenAPI document holds."""
    hook = hook_module()
    text = hook.openapi_markdown()
    routes = [(m.upper(), p) for p, ops in hook.openapi_document()["paths"].items() for m in ops]
    assert len(routes) >= 10
    assert [r for r in routes if f"### `{r[0]} {r[1]}`" not in text] == []
