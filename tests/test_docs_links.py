"""The README is a map and the docs pages are its territory (issue 44):

- every relative link in README.md and docs/*.md points at a file or folder that exists in the repository;
- the README stays a short map (at most 300 lines) and names no commit hash, which belong with the runs they
  date, in the docs pages;
- every docs page opens with a one-line title and links back to the README.

Links are parsed from the Markdown as written: inline links and images `[text](target)` and reference
definitions `[label]: target`, outside fenced code blocks and inline code spans.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]

MAX_README_LINES = 300

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:.+?)\1")
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
EXTERNAL = re.compile(r"^(https?:|mailto:)", re.IGNORECASE)
# A git hash, abbreviated or whole: 7-40 hex digits as a whole word, with at least one digit and one letter
# (so neither a plain number nor a word such as "accede" counts).
COMMIT_HASH = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, with inline code spans removed."""
    lines, in_fence = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            lines.append((number, CODE_SPAN.sub("", line)))
    return lines


def link_targets(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every inline link, image and reference definition."""
    targets = []
    for number, line in prose_lines(text):
        found = [m.group(1) for m in INLINE_LINK.finditer(line)]
        definition = REFERENCE_DEFINITION.match(line)
        if definition:
            found.append(definition.group(1))
        targets += [(number, target.strip("<>")) for target in found]
    return targets


def local_path(target: str) -> str | None:
    """The path part of a link to a file in the repository, or None for a web address or a pure #anchor."""
    if EXTERNAL.match(target) or target.startswith("#"):
        return None
    return unquote(target.split("#", 1)[0])


def broken_links(page: Path) -> list[str]:
    broken = []
    for number, target in link_targets(page.read_text(encoding="utf-8")):
        path = local_path(target)
        if path is not None and not (page.parent / path).exists():
            broken.append(f"{page.relative_to(ROOT)}:{number}: {target}")
    return broken


def test_the_link_parser_finds_inline_image_and_reference_links_but_not_code() -> None:
    text = "\n".join([
        "See [the docs](docs/a.md#part), ![a figure](<reports/b c.png> \"title\") and [`code`](stages/prune.py).",
        "Skip `[not](a-link.md)` and [web](https://example.org) and [here](#anchor).",
        "[ref]: docs/c.md",
        "```python",
        "gates[3](x)",
        "```",
    ])
    targets = [target for _, target in link_targets(text)]
    assert targets == ["docs/a.md#part", "reports/b c.png", "stages/prune.py", "https://example.org", "#anchor",
                       "docs/c.md"]
    assert [local_path(t) for t in targets] == ["docs/a.md", "reports/b c.png", "stages/prune.py", None, None,
                                                "docs/c.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_in_the_readme_and_docs_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_readme_is_a_map_of_at_most_300_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move detail into docs/"


def test_the_readme_names_no_commit_hash() -> None:
    found = [f"{number}: {match}" for number, line in enumerate(README.read_text(encoding="utf-8").splitlines(), 1)
             for match in COMMIT_HASH.findall(line)]
    assert found == [], "commit hashes belong with their runs in docs/, not in the README"


def test_the_commit_hash_pattern_matches_hashes_and_not_words_or_numbers() -> None:
    assert COMMIT_HASH.findall("run at 1f865cc and d98fb40, 94b7e35") == ["1f865cc", "d98fb40", "94b7e35"]
    assert COMMIT_HASH.findall("accede 1234567 deadbeef bf16 sha256 of 2026-12-04, ab12cd3ef9") == ["ab12cd3ef9"]


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_docs_page_opens_with_a_title_and_links_back_to_the_readme(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    first = text.splitlines()[0]
    assert first.startswith("# ") and len(first) > 2, f"{page.name} should open with a one-line H1 title"
    assert any(local_path(t) == "../README.md" for _, t in link_targets(text)), f"{page.name} should link to the README"
