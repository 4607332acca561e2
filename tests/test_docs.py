"""The documents point only at what a clone of the repository has.

Two checks over the tracked files: nothing cites the design notes the project was built
from (they live outside the repository, so a reader of a clone cannot follow such a
citation), and every relative link of the Markdown documents reaches an existing file
and, for a link into a Markdown file, an existing heading. Headings become anchors as
GitHub renders them.
"""

from __future__ import annotations

import itertools
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().relative_to(ROOT).as_posix()

#: Citations of documents a clone does not have. Case-sensitive: ``SPEC`` and ``API.md``
#: are those notes' names (``docs/api.md`` is the project's own), ``../shared`` their place.
OUTSIDE_CITATIONS = re.compile(r"\bSPEC\b|\bSPEC\.md\b|\bAPI\.md\b|\.\./shared\b")

DOCUMENTS = ("README.md", "BENCHMARKS.md", "docs/*.md", "examples/*.md", "examples/*/*.md")


def tracked_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    return [name for name in listed.stdout.decode().split("\0") if name]


def citations_outside(path: str) -> Iterator[str]:
    file = ROOT / path
    if not file.is_file():  # deleted in the work tree but still tracked
        return
    text = file.read_bytes().decode("utf-8", errors="replace")
    for number, line in enumerate(text.splitlines(), 1):
        if OUTSIDE_CITATIONS.search(line):
            yield f"{path}:{number}: {line.strip()[:160]}"


def test_no_tracked_file_cites_documents_outside_the_repository() -> None:
    # This file names the patterns it looks for, so it is the one file left out.
    files = [f for f in tracked_files() if f != HERE]
    assert len(files) > 100, "git ls-files found too few files to be this repository"
    found = [hit for f in files for hit in citations_outside(f)]
    assert not found, "cite docs/method.md, docs/parameters.md or docs/api.md instead:\n" + "\n".join(found)


def test_the_citation_check_finds_each_kind_of_citation() -> None:
    """The pattern above is what the first test relies on: it must catch every form."""
    for cited in ("SPEC section 4", "(SPEC sections 3-5)", "see SPEC.md", "API.md's document", "../shared/SPEC"):
        assert OUTSIDE_CITATIONS.search(cited), cited
    for fine in ("docs/api.md", "SPECIAL = [", "pod_spec(workload)", 'workload["spec"]', "docs/method.md#input"):
        assert not OUTSIDE_CITATIONS.search(fine), fine


# ----------------------------------------------------------------------------- links


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, each space a
    hyphen (``"Visit credit: new"`` -> ``visit-credit-new``)."""
    kept = re.sub(r"[^\w\- ]", "", heading.lower())
    return kept.replace(" ", "-")


def heading_text(inline: Token) -> str:
    """The heading as rendered: its text and inline code, without markup or link targets."""
    return "".join(child.content for child in inline.children or () if child.type in ("text", "code_inline"))


def parse(path: Path) -> list[Token]:
    return MarkdownIt("commonmark").enable("table").parse(path.read_text())


def anchors(path: Path) -> set[str]:
    """Every anchor of a Markdown file; a repeated heading gets ``-1``, ``-2``, ..."""
    found: set[str] = set()
    repeats: dict[str, int] = {}
    tokens = parse(path)
    for opening, inline in itertools.pairwise(tokens):
        if opening.type == "heading_open":
            base = slug(heading_text(inline))
            n = repeats.get(base, 0)
            repeats[base] = n + 1
            found.add(f"{base}-{n}" if n else base)
    return found


def links(path: Path) -> Iterator[str]:
    for token in parse(path):
        for child in token.children or ():
            if child.type == "link_open":
                yield str(child.attrs["href"])
            elif child.type == "image":
                yield str(child.attrs["src"])


def documents() -> list[Path]:
    return sorted({p for pattern in DOCUMENTS for p in ROOT.glob(pattern)})


def broken_link(document: Path, href: str, root: Path = ROOT) -> str | None:
    """Why a relative link does not resolve, or None (links with a scheme are not checked)."""
    parts = urlsplit(href)
    if parts.scheme or parts.netloc:
        return None
    target = (document.parent / unquote(parts.path)).resolve() if parts.path else document
    if not target.is_relative_to(root):
        return f"{href}: points outside the repository"
    if not target.exists():
        return f"{href}: no such file {target.relative_to(root)}"
    if parts.fragment and target.suffix == ".md" and parts.fragment not in anchors(target):
        return f"{href}: no heading #{parts.fragment} in {target.relative_to(root)}"
    return None


@pytest.mark.parametrize("document", documents(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_and_anchor_resolves(document: Path) -> None:
    problems = [p for href in links(document) if (p := broken_link(document, href))]
    assert not problems, "\n".join(problems)


def test_the_link_check_sees_links_and_anchors_as_github_does(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Visit credit: new support, judged\n\n## `POST /v1/groups` → `202`\n\n## Notes\n\n## Notes\n\n"
        "[a](#visit-credit-new-support-judged) [b](#post-v1groups--202) [c](#notes-1) "
        "[d](other.md) [e](#nowhere) [f](https://example.org/x#y) [g](../up.md)\n\n"
        "    [not a link](in-code.md)\n"
    )
    assert anchors(page) == {"visit-credit-new-support-judged", "post-v1groups--202", "notes", "notes-1"}
    found = list(links(page))
    assert found == [
        "#visit-credit-new-support-judged",
        "#post-v1groups--202",
        "#notes-1",
        "other.md",
        "#nowhere",
        "https://example.org/x#y",
        "../up.md",
    ]
    problems = [broken_link(page, href, root=tmp_path) for href in found]
    assert problems[:3] == [None, None, None] and problems[5] is None
    assert problems[3] is not None and "no such file other.md" in problems[3]
    assert problems[4] is not None and "no heading #nowhere in page.md" in problems[4]
    assert problems[6] is not None and "outside the repository" in problems[6]
