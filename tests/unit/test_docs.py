"""The manual (docs/, an MkDocs site) stays true to the code and to itself.

- docs/cli.md and docs/schemas/*.md are generated (scripts/gen_docs.py): the committed files must be
  what the parsers and the committed report schemas generate today.
- Messages, docstrings and comments cite docs pages (`docs/gate.md#anchor`), not README headings
  (the README is a short front page now): every citation names a page and a heading that exist.
- Every relative link in README.md and docs/ points at a file that exists, and at a heading of it.

`make docs` (CI) also runs `mkdocs build --strict`, which checks links inside docs/ too; these tests
need no MkDocs and also cover README.md and the code's citations, which MkDocs never sees.
Anchors are computed as MkDocs' toc extension does (markdown.extensions.toc.slugify).
"""
from __future__ import annotations

import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# Where messages and docstrings cite the manual. tests/ is left out: test docstrings also name
# README.md as a file (the pre-commit hook's and the webhook's inputs).
CITING = [*sorted((ROOT / "workflows").rglob("*.py")), *sorted((ROOT / "validation").rglob("*.py")),
          *sorted((ROOT / "scripts").glob("*")), ROOT / ".pre-commit-hooks.yaml", ROOT / "Makefile",
          ROOT / ".ci" / "run", ROOT / "Dockerfile", ROOT / "pyproject.toml"]
PAGES = sorted(DOCS.rglob("*.md"))
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def slugify(text: str) -> str:
    """MkDocs' heading id (Python-Markdown toc.slugify, separator '-') of a heading's rendered text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text).replace("`", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    body = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slugify(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", body, re.M)}


def test_slugify_matches_mkdocs() -> None:
    # Ids MkDocs 1.6 / Python-Markdown wrote for these headings of this manual (build/site/*.html).
    assert slugify("Phase balance") == "phase-balance"
    assert slugify("`pdops release` of `overlays/local`") == "pdops-release-of-overlayslocal"
    assert slugify("Faults: the last good release keeps serving") == "faults-the-last-good-release-keeps-serving"
    assert slugify("Clean-clone `.ci/run`") == "clean-clone-cirun"


def test_generated_pages_are_current() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs.py"), "--check"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, f"stale generated docs (run scripts/gen_docs.py):\n{proc.stderr}{proc.stdout}"


def test_gen_docs_check_fails_on_a_stale_page(tmp_path: Path) -> None:
    """The check can fail: a copy of the repository's docs with cli.md edited is reported stale."""
    import shutil

    for name in ("docs", "scripts", "workflows", "validation"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    cli = tmp_path / "docs" / "cli.md"
    cli.write_text(cli.read_text(encoding="utf-8").replace("pdops render", "pdops rendr", 1), encoding="utf-8")
    (tmp_path / "docs" / "schemas" / "gone.md").write_text("# a schema that no longer exists\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, str(tmp_path / "scripts" / "gen_docs.py"), "--check"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 1
    assert "docs/cli.md: stale" in proc.stderr and "docs/schemas/gone.md: no longer generated" in proc.stderr


def test_readme_is_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 300, f"README.md has {lines} lines: put the manual in docs/ (issue 23: at most 300)"


@pytest.mark.parametrize("path", CITING, ids=lambda p: str(p.relative_to(ROOT)))
def test_code_cites_docs_pages_not_readme_headings(path: Path) -> None:
    if not path.is_file():
        pytest.skip(f"{path.relative_to(ROOT)} does not exist")
    text = path.read_text(encoding="utf-8", errors="replace")
    problems = []
    for m in re.finditer(r"\bREADME\b(?!\.md)", text):
        line = text.count("\n", 0, m.start()) + 1
        problems.append(f"line {line}: cites the README ({text.splitlines()[line - 1].strip()[:100]!r}): "
                        "cite the docs page instead, e.g. docs/gate.md#a-gate-that-knows-how-sure-it-is")
    # docs/PAGE.md or docs/schemas/PAGE.md: this manual is flat. Upstream projects' docs cited in
    # comments (Prometheus' docs/querying/api.md, Dynamo's docs/architecture/...) have other folders.
    for m in re.finditer(r"(?<![\w/.-])docs/((?:schemas/)?[\w-]+\.md)(?:#([\w-]+))?", text):
        page = DOCS / m.group(1)
        if not page.is_file():
            problems.append(f"cites {m.group(0)}: no such page")
        elif m.group(2) and m.group(2) not in anchors(page):
            problems.append(f"cites {m.group(0)}: no heading with that anchor in {m.group(1)}")
    assert not problems, f"{path.relative_to(ROOT)}:\n" + "\n".join(problems)


def _links(page: Path) -> list[str]:
    body = FENCE.sub("", page.read_text(encoding="utf-8"))
    body = re.sub(r"`[^`\n]*`", "", body)  # inline code is not a link
    return re.findall(r"\]\(([^)\s]+)\)", body)


@pytest.mark.parametrize("page", [ROOT / "README.md", *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    problems = []
    for link in _links(page):
        if re.match(r"[a-z][a-z+.-]*:", link):  # http:, https:, mailto:
            continue
        target, _, anchor = link.partition("#")
        dest = (page.parent / target).resolve() if target else page
        if not dest.exists():
            problems.append(f"{link}: {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest} does not exist")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{link}: no heading with the anchor #{anchor} in {dest.relative_to(ROOT)}")
    assert not problems, f"{page.relative_to(ROOT)}:\n" + "\n".join(problems)


@pytest.mark.parametrize("page", [ROOT / "README.md", *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_repository_paths_named_in_the_manual_exist(page: Path) -> None:
    """`workflows/pipeline/steps.py`, `tests/unit/test_gate.py`, ...: a module that moved leaves the page naming
    it wrong. Placeholders (`overlays/<env>/`, `overlays/ENV/`, globs) are not paths."""
    text = page.read_text(encoding="utf-8")
    named = re.findall(r"`((?:workflows|validation|tests|scripts|kustomize|overlays|docs)/[\w./-]+)`", text)
    gone = sorted({p for p in named if not re.search(r"[<*]|\bENV\b|\bNAME\b", p)
                   and not (ROOT / p.rstrip("/.")).exists()
                   and not p.startswith("docs/architecture/")})  # NVIDIA Dynamo's docs, cited upstream
    assert not gone, f"{page.relative_to(ROOT)} names files that do not exist (moved? update the page): {gone}"


def test_every_page_is_linked_from_somewhere() -> None:
    """A page nobody links to is a page nobody finds (mkdocs.yml's nav is checked by mkdocs --strict)."""
    linked = {(page.parent / link.partition("#")[0]).resolve()
              for page in [ROOT / "README.md", *PAGES] for link in _links(page) if not link.startswith(("http", "#"))}
    orphans = [str(p.relative_to(ROOT)) for p in PAGES if p.resolve() not in linked and p != DOCS / "index.md"]
    assert not orphans, f"pages no page links to: {orphans}"
