"""The documentation: the site builds strictly, every link in it and in the README lands, and the code cites the
project's own docs (docs/<page>.md#anchor), never the team's notes outside the repository."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CITED_KINDS = (".py", ".md", ".sh", ".toml", ".yml", ".yaml")

def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of the tree at root into site: strict turns every warning into a failure.
    mkdocs is in the `test` extra: where it is missing this fails (CI must build the site), it does not skip."""
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"),
                           "-d", str(site)], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    done = build(ROOT, site)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    return site


def test_site_builds_strictly_with_every_page_in_the_nav(site):
    pages = {p.stem for p in (ROOT / "docs").glob("*.md")}
    built = {p.parent.name for p in site.glob("*/index.html")} | {"index"}
    assert pages <= built, pages - built


def copy_tree(tmp_path: Path) -> Path:
    """mkdocs.yml and docs/ beside the repository files the docs link to (benchmarks/, deploy/)."""
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", root / "docs")
    shutil.copy(ROOT / "mkdocs.yml", root / "mkdocs.yml")
    for folder in ("benchmarks", "deploy", "samples", "tests"):
        (root / folder).symlink_to(ROOT / folder)
    return root


@pytest.mark.parametrize("link", ["[a page that is not there](no-such-page.md)",
                                  "[an anchor that is not there](cli.md#no-such-heading)",
                                  "[a result that is not there](/benchmarks/results/no-such-result.md)"])
def test_a_broken_link_fails_the_build(tmp_path, link):
    root = copy_tree(tmp_path)
    page = root / "docs" / "serving.md"
    page.write_text(page.read_text() + f"\nSee {link}.\n")
    done = build(root, tmp_path / "site")
    assert done.returncode != 0 and "WARNING" in done.stderr, done.stderr
    assert link.split("(")[1].rstrip(")").split("#")[-1] in done.stderr


def test_a_page_left_out_of_the_nav_fails_the_build(tmp_path):
    root = copy_tree(tmp_path)
    (root / "docs" / "orphan.md").write_text("# Orphan\n")
    done = build(root, tmp_path / "site")
    assert done.returncode != 0 and "orphan.md" in done.stderr, done.stderr


@functools.lru_cache(maxsize=None)
def anchors(site: Path, page: str) -> frozenset[str]:
    html = site / ("index.html" if page == "index" else f"{page}/index.html")
    return frozenset(re.findall(r'\bid="([^"]+)"', html.read_text()))


def tree_files() -> list[Path]:
    """The repository's files of the kinds that cite (tracked, and new ones not ignored), as a clean clone has them."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    return [ROOT / name for name in listed if name.endswith(CITED_KINDS) and (ROOT / name).is_file()]


def test_every_docs_citation_in_the_tree_lands(site):
    """Source, tests, benchmarks and scripts cite docs/<page>.md#anchor: each page and anchor exists in the site."""
    cited = 0
    for path in tree_files():
        for page, anchor in re.findall(r"docs/([a-z0-9-]+)\.md(?:#([a-z0-9-]+))?", path.read_text(errors="replace")):
            where = f"{path.relative_to(ROOT)} cites docs/{page}.md#{anchor}"
            assert (ROOT / "docs" / f"{page}.md").is_file(), where
            assert not anchor or anchor in anchors(site, page), where
            cited += 1
    assert cited >= 20  # the citations this test guards are there to be checked


# The team's notes outside the repository: never cited (a user who clones gptedge does not have them). Data read
# from the shared folder (the training corpus: ../shared/corpus) is not a citation and stays allowed.
FORBIDDEN = re.compile(r"\bDESIGN\b|DESIGN\.md|\.\./shared/(?!corpus\b)")


def test_no_citation_of_the_design_outside_the_repository():
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}"
             for path in tree_files() if path != Path(__file__).resolve()
             for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if FORBIDDEN.search(line)]
    assert not found, "cite docs/design.md#... instead:\n" + "\n".join(found)


README_LINK = re.compile(r"\]\((?!https?:|#|mailto:)([^)#\s]+)(?:#[^)\s]*)?\)")


@pytest.mark.parametrize("readme", ["README.md", "benchmarks/README.md"])
def test_readme_links_name_files_of_the_repository(readme):
    """The READMEs are outside the site: their relative links (docs pages, recorded results) are checked here."""
    path = ROOT / readme
    targets = README_LINK.findall(path.read_text())
    assert any("docs/" in t for t in targets)
    missing = [t for t in targets if not (path.parent / t).exists()]
    assert not missing, missing


def test_every_benchmark_script_is_listed():
    listed = (ROOT / "benchmarks" / "README.md").read_text()
    scripts = [p.name for p in (ROOT / "benchmarks").iterdir() if p.suffix in (".py", ".sh", ".toml")]
    assert scripts and not [s for s in scripts if f"`{s}" not in listed]
