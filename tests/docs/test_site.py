"""The documentation site: the README's promises, the nav's pages, the API reference's
coverage of every public name, and research pages whose figures come from bench files."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.docs.markdown_blocks import blocks

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
API_PACKAGES = ("models", "policies", "sim", "torch", "adaptdl")
MEASURED = re.compile(r"(?<![\w.])[+-]?\d[\d,]*\.\d+\s?(?:s|h|ms|%|x|CPU-s)(?![\w])"
                      r"|(?<![\w.])[+-]\d+(?:\.\d+)?%")
"""A measured figure: a decimal with a unit (2,269.9 s, 0.63 h, 1.4x) or a signed
percentage (+5%); settings (60 s rounds, 16 x 4 GPUs, within 2%) do not match."""


def nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return []


def mkdocs_config() -> dict:
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def test_readme_is_short_and_starts_with_the_setup_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 160
    assert lines[2:6] == ["```bash",
                          "pip install torch==2.13.0 && pip install -e '.[all]' && pollux demo",
                          "python -m pytest -q", "```"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "\npython -m pytest -q\n" in ci  # the README's test command is CI's
    assert "mkdocs build --strict" in ci


def test_changelog_says_when_each_deprecated_name_goes():
    from pollux.policies.registry import DEPRECATED_NAMES

    text = (ROOT / "CHANGELOG.md").read_text()
    deprecated = text.split("### Deprecated", 1)[1].split("\n## ", 1)[0]
    for old, new in DEPRECATED_NAMES.items():
        entry = next((line for line in deprecated.split("\n- ") if f"`{old}`" in line), None)
        assert entry is not None, f"CHANGELOG.md: no Deprecated entry for {old!r}"
        assert f"`{new}`" in entry and re.search(r"Removed in \d+\.\d+\.\d+", entry), entry


def test_readme_links_lead_to_files():
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert links
    for link in links:
        if "://" not in link:
            assert (ROOT / link).exists(), link


def test_docs_do_not_point_outside_the_repository():
    for path in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        text = path.read_text()
        assert "../shared" not in text and "shared/pollux-artifact" not in text, path


def test_every_part_of_the_site_is_in_the_nav():
    pages = nav_pages(mkdocs_config()["nav"])
    for page in pages:
        assert (DOCS / page).is_file(), page
    for part in ("train", "operate", "research", "reference"):
        assert f"{part}/index.md" in pages
    for page in ("train/tutorial.md", "research/custom-policy.md", "reference/cli.md",
                 "reference/rest.md", "reference/job-spec.md", "reference/environment.md",
                 "reference/exit-codes.md", *(f"reference/python/{p}.md" for p in API_PACKAGES)):
        assert page in pages, page


def test_research_figures_come_from_bench_files():
    for path in (DOCS / "research").rglob("*.md"):
        if path.parent.name == "results":
            continue
        prose = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        found = MEASURED.findall(prose)
        assert not found, f"{path.relative_to(ROOT)}: figures {found}; write them from a bench script"
    for match in re.finditer(r'--8<-- "([^"]+)"', "".join(
            p.read_text() for p in (DOCS / "research").rglob("*.md"))):
        included = ROOT / match.group(1)
        assert included.is_file(), match.group(1)
        assert included.parent == DOCS / "research" / "results", match.group(1)


EXAMPLE_PAGES = ("research/goodput.md",)
"""Pages whose untitled ``python`` blocks are complete examples (other pages show
fragments; titled blocks are files, run by the tutorial's and the policy page's tests)."""


def test_python_examples_on_the_pages_run(tmp_path: Path):
    """Every runnable untitled ``python`` block of the example pages, run in order, one
    process a page."""
    for page in (DOCS / name for name in EXAMPLE_PAGES):
        assert any(b.language == "python" and b.title is None and b.run for b in blocks(page))
        code = "\n".join(b.text for b in blocks(page)
                         if b.language == "python" and b.title is None and b.run)
        run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 0, f"{page.relative_to(ROOT)}: {run.stderr[-2000:]}"


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def test_api_reference_renders_every_public_name(tmp_path: Path):
    """Builds the Python API pages alone (mkdocstrings, as the site does, --strict: a
    docstring that breaks the site fails here) and finds a
    rendered entry for every name in each package's ``__all__``."""
    pytest.importorskip("mkdocstrings")
    pytest.importorskip("torch")
    config = mkdocs_config()
    docs = tmp_path / "docs"
    (docs / "python").mkdir(parents=True)
    for package in API_PACKAGES:
        page = (DOCS / "reference" / "python" / f"{package}.md").read_text()
        (docs / "python" / f"{package}.md").write_text(re.sub(r"\]\([^)]*\.md[^)]*\)", "]()",
                                                              page))
    (docs / "index.md").write_text("# API\n")
    plugin = next(p for p in config["plugins"] if isinstance(p, dict) and "mkdocstrings" in p)
    python = plugin["mkdocstrings"]["handlers"]["python"]
    python["paths"] = [str(ROOT / "src")]
    python["options"]["extensions"] = [str(ROOT / e) for e in python["options"]["extensions"]]
    small = {"site_name": "api", "docs_dir": str(docs), "site_dir": str(tmp_path / "site"),
             "theme": config["theme"], "plugins": [plugin],
             "markdown_extensions": config["markdown_extensions"]}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(small))
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "-q", "--strict", "-f",
                            str(tmp_path / "mkdocs.yml")], capture_output=True, text=True,
                           timeout=300, cwd=ROOT, env={"NO_MKDOCS_2_WARNING": "1",
                                             "PATH": "/usr/bin:/bin"})
    assert build.returncode == 0, build.stdout + build.stderr
    for package in API_PACKAGES:
        html = (tmp_path / "site" / "python" / package / "index.html").read_text()
        ids = set(re.findall(r'id="(pollux\.[A-Za-z0-9_.]+)"', html))
        module = importlib.import_module(f"pollux.{package}")
        for name in module.__all__:
            target = getattr(module, name)
            assert f"pollux.{package}.{name}" in ids or any(
                i.endswith(f".{name}") and _resolve(i) is target for i in ids), \
                f"pollux.{package}.{name} is not in docs/reference/python/{package}.md"
