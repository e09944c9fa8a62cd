"""The repository documents itself: citations of the method doc point inside the repo, and resolve.

Docstrings and recipe comments cite ``docs/method.md section N``. This checks that every
``.py`` / ``.md`` / ``.toml`` file cites the doc by its in-repo path (the bare file name names a
file a reader cannot find), that nothing points at design notes outside the repository, and that
every cited section number exists as a ``## N.`` heading of ``docs/method.md``. This file builds
the patterns it rejects from pieces, so it passes its own scan.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = {".py", ".md", ".toml"}
SKIP_DIRS = {".venv", ".git", "runs", "__pycache__", "shared"}  # shared/: machinery, not the project

NAME = "method" + ".md"  # never written whole here, so this file passes its own scan
METHOD_DOC = ROOT / "docs" / NAME
DOC_NAME = re.escape(NAME)
# the bare name, not preceded by "docs/"; inside docs/ a Markdown link target "](<name>" is relative
BARE_CITATION = re.compile(r"(?<!docs/)(?<![\w.-])" + DOC_NAME)
RELATIVE_LINK = re.compile(r"\]\((?:\./)?" + DOC_NAME)
OUTSIDE = ("../" + "shared", "shared" + "/design")
CITATION = re.compile(
    r"docs/" + DOC_NAME + r"\s+sections?\s+(\d+)(?:\s*(-|–|to|and|,)\s*(\d+))?", re.IGNORECASE
)
HEADING = re.compile(r"^## (\d+)\. ", re.MULTILINE)


def _files() -> list[Path]:
    out = []
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        out.extend(Path(folder) / n for n in names if Path(n).suffix in SUFFIXES)
    return sorted(out)


FILES = _files()


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _bare_citations(path: Path, text: str) -> list[str]:
    in_docs = _rel(path).startswith("docs/") and path.suffix == ".md"
    hits = []
    for n, line in enumerate(text.splitlines(), 1):
        if in_docs:
            line = RELATIVE_LINK.sub("](", line)
        if BARE_CITATION.search(line):
            hits.append(f"{_rel(path)}:{n}: {line.strip()}")
    return hits


def test_scan_sees_the_files_that_cite_the_doc():
    names = {_rel(p) for p in FILES}
    assert {"docs/method.md", "vgrpo_platform/algo/grpo.py", "recipes/sd35_pickscore.toml"} <= names


def test_method_doc_is_cited_by_its_in_repo_path():
    hits = [h for p in FILES for h in _bare_citations(p, p.read_text(errors="replace"))]
    assert not hits, "cite the method doc as docs/method.md:\n" + "\n".join(hits)


def test_nothing_points_outside_the_repository():
    hits = []
    for path in FILES:
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if any(marker in line for marker in OUTSIDE):
                hits.append(f"{_rel(path)}:{n}: {line.strip()}")
    assert not hits, "references to files outside the repository:\n" + "\n".join(hits)


def _cited_sections() -> dict[int, list[str]]:
    cited: dict[int, list[str]] = {}
    for path in FILES:
        for match in CITATION.finditer(path.read_text(errors="replace")):
            first, joiner, second = match.group(1, 2, 3)
            if second is None:
                sections = [int(first)]
            elif joiner in ("and", ","):
                sections = [int(first), int(second)]
            else:  # a range "N-M"
                sections = list(range(int(first), max(int(first), int(second)) + 1))
            for section in sections:
                cited.setdefault(section, []).append(_rel(path))
    return cited


def test_cited_sections_exist():
    headings = {int(n) for n in HEADING.findall(METHOD_DOC.read_text())}
    cited = _cited_sections()
    assert cited, "no file cites docs/method.md section N: the scan is broken"
    missing = {n: sorted(set(files)) for n, files in cited.items() if n not in headings}
    assert not missing, f"cited sections with no '## N.' heading in docs/method.md: {missing}"


def test_method_doc_sections_are_numbered_in_order():
    numbers = [int(n) for n in HEADING.findall(METHOD_DOC.read_text())]
    assert numbers == list(range(1, len(numbers) + 1)), numbers


@pytest.mark.parametrize(
    ("line", "bad"),
    [
        (f"see {NAME} section 4", True),
        (f"see docs/{NAME} section 4", False),
        (f"({NAME} sections 2-4)", True),
        (f"a [link]({NAME})", True),
        (f"design/{NAME} section 2", True),
    ],
)
def test_bare_citation_pattern(line, bad):
    path = ROOT / "vgrpo_platform" / "x.py"  # a file outside docs/: relative links do not count
    assert bool(_bare_citations(path, line)) is bad


def test_relative_link_allowed_inside_docs():
    path = ROOT / "docs" / "concepts.md"
    assert not _bare_citations(path, f"[docs/{NAME}]({NAME}) and [x](./{NAME})")
    assert _bare_citations(path, f"see {NAME} section 2")


def test_citation_pattern_reads_lists_and_ranges():
    found = [
        m.group(1, 2, 3) for m in CITATION.finditer(f"docs/{NAME} sections 2 and 4; docs/{NAME} section 6")
    ]
    assert found == [("2", "and", "4"), ("6", None, None)]
