"""Every link between the docs lands: each relative markdown link in README.md and docs/*.md names a file (or folder)
that exists, and a link with a #fragment names a heading of that page (GitHub's slug of it). Plain-text pointers of
the form docs/NAME.md#anchor in recipe headers, module docstrings, bench scripts and scripts/ are held to the same
rule, so moving a section (say, into the lab log) cannot leave a pointer behind."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
POINTER_FILES = [
    *sorted((ROOT / "recipes").rglob("*.yaml")),
    *sorted((ROOT / "mydecide").rglob("*.py")),
    *sorted((ROOT / "bench").glob("*.py")),
    *sorted((ROOT / "scripts").glob("*.py")),
]

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)
POINTER = re.compile(r"\bdocs/([\w.-]+\.md)(?:#([\w-]+))?")


def prose_lines(text: str) -> list[str]:
    """The page's lines outside fenced code blocks, with inline code spans blanked out."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(re.sub(r"`[^`]*`", "``", line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower case, without punctuation and symbols, spaces as
    hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays, its target goes
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = page.read_text(encoding="utf-8")
    found: set[str] = set(HTML_ANCHOR.findall(text))
    seen: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        heading = None if fenced else HEADING.match(line)
        if heading:
            base = slug(heading.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken(target: str, source: Path) -> str | None:
    """Why a link from `source` to `target` does not land, or None when it does."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:, ...
        return None
    path, _, fragment = target.partition("#")
    dest = (source.parent / path).resolve() if path else source
    if not dest.exists():
        return f"{path} does not exist"
    if fragment and dest.suffix == ".md" and fragment not in anchors(dest):
        return f"{path or source.name} has no heading #{fragment}"
    return None


def test_the_slug_is_githubs() -> None:
    assert slug("Choice questions with 27–255 options") == "choice-questions-with-27255-options"
    assert slug("`set` questions") == "set-questions"
    assert slug("Spans, round 4: the span head") == "spans-round-4-the-span-head"
    assert slug("Why Ray, and how fast") == "why-ray-and-how-fast"
    assert slug("Near dedup, before (word 5-grams, estimated Jaccard ≥ 0.8)") == (
        "near-dedup-before-word-5-grams-estimated-jaccard--08"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_markdown_link_lands(page: Path) -> None:
    problems = [
        f"{page.relative_to(ROOT)}: ({target}): {why}"
        for line in prose_lines(page.read_text(encoding="utf-8"))
        for target in LINK.findall(line)
        if (why := broken(target, page))
    ]
    assert not problems, "\n".join(problems)


def test_every_docs_pointer_in_recipes_code_and_bench_lands() -> None:
    problems = []
    for source in POINTER_FILES:
        for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
            for name, fragment in POINTER.findall(line):
                target = f"{name}#{fragment}" if fragment else name
                if why := broken(target, ROOT / "docs" / "x.md"):
                    problems.append(f"{source.relative_to(ROOT)}:{number}: docs/{target}: {why}")
    assert not problems, "\n".join(problems)


def test_a_moved_heading_is_caught(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# A\n\n## In the demo\n\n```bash\n# not a heading\n```\n", encoding="utf-8")
    source = tmp_path / "b.md"
    assert broken("a.md#in-the-demo", source) is None
    assert broken("a.md#not-a-heading", source) == "a.md has no heading #not-a-heading"
    assert broken("#in-the-demo", tmp_path / "a.md") is None
    assert broken("missing.md", source) == "missing.md does not exist"
