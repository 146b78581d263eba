"""Span records from a CoNLL-style BIO file: a token and its tag per line, a blank line between sentences.

Each sentence (``unit: sentence``, default) or each document (``unit: document``: the sentences between two
``-DOCSTART-`` lines, joined by a newline; a file without them is one document) becomes one span record. Its
state is the tokens joined by single spaces, so every token is one word (a run of non-whitespace) and the gold
spans' character offsets are exact and word-aligned. ``-DOCSTART-`` lines are skipped; columns are split on
whitespace (the token in the first column, the tag in the last); ``.gz`` / ``.bz2`` files are read too.

Tags (option ``scheme``): ``bio`` (default; IOB2: ``B-X`` starts a span, ``I-X`` continues one, an ``I-X`` with no
``B-X`` / ``I-X`` before it is an error), ``iob1`` (``I-X`` starts a span unless one of label X is open; ``B-X``
separates two adjacent spans of one label) or ``bioes`` (also ``E-X`` / ``L-X`` ends a span, ``S-X`` / ``U-X`` is
a one-token span). ``O`` is outside; a tag with no prefix (``PER``) is an IO tag: it continues an open span of its
label or starts one. A bad tag (``B-`` with no label, an unknown prefix, an ``I-X`` with no ``B-X`` before it)
makes its sentence or document an error row whose ``_where`` names the tag's line.

Options: ``instructions`` (the question; default a generic one), ``criteria`` (a map label → description or a
list of labels; default: every label the file uses, sorted), ``other_labels`` (``error``, default: a span whose
label is not in ``criteria`` makes an error row; ``drop``: its tags count as ``O``), ``task`` (default: the
file's stem), ``lang`` (default ``en``). Records: id ``<file stem>-<line of the unit's first token>``, meta
``{"tokens": n}``, ``_where`` = file:line of that first token.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_sources._files import capped, error_row, existing, file_stem
from data_sources._spans import (
    DEFAULT_INSTRUCTIONS,
    Span,
    criteria_option,
    found_criteria,
    keep_labels,
    other_labels_option,
    span_record,
    text_option,
)
from mydecide.jsonl import open_text, printable, text_problem

SCHEMES = ("bio", "iob1", "bioes")
UNITS = ("sentence", "document")
DOCSTART = "-DOCSTART-"


class TagError(ValueError):
    """A tag that the scheme cannot read; ``index`` is the token's position in its sentence."""

    def __init__(self, index: int, reason: str):
        super().__init__(reason)
        self.index = index


def split_tag(tag: str) -> tuple[str, str]:
    """``B-PER`` → ``("B", "PER")``; ``O`` → ``("O", "")``; a tag without a prefix (``PER``) → ``("", "PER")``."""
    if tag == "O":
        return "O", ""
    head, sep, label = tag.partition("-")
    if sep and len(head) == 1 and head.isalpha():
        return head.upper(), label
    return "", tag


def decode_tags(tags: list[str], scheme: str = "bio") -> list[tuple[int, int, str]]:
    """The spans a sentence's tags mark, as ``(first token, last token + 1, label)``; TagError on a bad tag."""
    prefixes = {"bio": "BI", "iob1": "BI", "bioes": "BIESLU"}[scheme]
    spans: list[tuple[int, int, str]] = []
    open_start, open_label = -1, ""

    def close(end: int) -> None:
        nonlocal open_start, open_label
        if open_label:
            spans.append((open_start, end, open_label))
        open_start, open_label = -1, ""

    for i, tag in enumerate(tags):
        prefix, label = split_tag(tag)
        if prefix == "O":
            close(i)
            continue
        if not label:
            raise TagError(i, f"tag {tag!r} has no label after its prefix")
        if prefix and prefix not in prefixes:
            raise TagError(i, f"tag {tag!r}: prefix {prefix}- is not one of scheme {scheme}'s ({', '.join(prefixes)})")
        continues = open_label == label
        if prefix in ("B", "S", "U") or (prefix in ("", "I", "E", "L") and not continues):
            if prefix in ("I", "E", "L") and scheme != "iob1":
                before = f"after {tags[i - 1]!r}" if i else "at the start of the sentence"
                raise TagError(i, f"tag {tag!r} {before}: an {prefix}-{label} must follow B-{label} or I-{label}")
            close(i)
            open_start, open_label = i, label
        if prefix in ("S", "U", "E", "L"):
            close(i + 1)
    close(len(tags))
    return spans


@dataclass
class Unit:
    """A sentence or a document: its tokens and tags with their file lines."""

    lines: list[int] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    sentence_starts: list[int] = field(default_factory=list)  # token index where each sentence starts
    error: tuple[int, str] | None = None  # (line, reason) of the first unreadable line


def _units(path: Path, unit: str) -> Iterator[Unit]:
    current, sentence_open = Unit(), False
    with open_text(path) as handle:
        for number, raw in enumerate(handle, start=1):
            line = raw.rstrip("\r\n").lstrip("\ufeff")
            columns = line.split()
            if not columns or columns[0] == DOCSTART:
                sentence_open = False
                if (current.tokens or current.error) and (unit == "sentence" or columns):
                    yield current
                    current = Unit()
                continue
            if not sentence_open:
                current.sentence_starts.append(len(current.tokens))
                sentence_open = True
            problem = text_problem(line)
            if problem is None and len(columns) < 2:
                problem = "line has one column; expected a token and a tag (the tag in the last column)"
            if problem is not None:
                current.error = current.error or (number, problem)
                columns = [printable(columns[0]), "O"]
            current.lines.append(number)
            current.tokens.append(columns[0])
            current.tags.append(columns[-1])
    if current.tokens or current.error:
        yield current


def _labels(path: Path, scheme: str) -> set[str]:
    """Every label the file's readable sentences use (the default criteria)."""
    labels: set[str] = set()
    for sentence in _units(path, "sentence"):
        try:
            labels.update(label for _, _, label in decode_tags(sentence.tags, scheme))
        except TagError:
            continue
    return labels


def _spans(unit: Unit, scheme: str) -> tuple[str, list[Span]]:
    """The unit's text and its gold spans in characters; TagError carries the token index (in the unit)."""
    starts: list[int] = []
    pieces: list[str] = []
    position = 0
    bounds = [*unit.sentence_starts[1:], len(unit.tokens)]
    spans: list[Span] = []
    first = 0
    for end in bounds:
        for i in range(first, end):
            if i > first:
                pieces.append(" ")
                position += 1
            elif i:
                pieces.append("\n")
                position += 1
            starts.append(position)
            pieces.append(unit.tokens[i])
            position += len(unit.tokens[i])
        try:
            tokens_spans = decode_tags(unit.tags[first:end], scheme)
        except TagError as err:
            raise TagError(first + err.index, str(err)) from None
        for a, b, label in tokens_spans:
            spans.append((starts[first + a], starts[first + b - 1] + len(unit.tokens[first + b - 1]), label))
        first = end
    return "".join(pieces), spans


def _records(
    path: Path, *, scheme: str, unit: str, instructions: str, criteria: Any, other: str, task: str, lang: str
) -> Iterator[dict[str, Any]]:
    name, stem = path.name, file_stem(path)
    labels = list(criteria)
    for part in _units(path, unit):
        raw = "\n".join(f"{token} {tag}" for token, tag in zip(part.tokens, part.tags, strict=True))
        if part.error is not None:
            yield error_row(f"{name}:{part.error[0]}", part.error[1], raw)
            continue
        try:
            text, spans = _spans(part, scheme)
        except TagError as err:
            yield error_row(f"{name}:{part.lines[err.index]}", str(err), raw)
            continue
        spans, problem = keep_labels(spans, labels, other)
        if problem is not None:
            yield error_row(f"{name}:{part.lines[0]}", problem, raw)
            continue
        yield span_record(
            id=f"{stem}-{part.lines[0]}",
            task=task,
            lang=lang,
            state=text,
            instructions=instructions,
            criteria=criteria,
            spans=spans,
            where=f"{name}:{part.lines[0]}",
            meta={"tokens": len(part.tokens)},
        )


def convert(
    path: str | None = None,
    *,
    limit: int | None = None,
    seed: int = 13,
    scheme: str = "bio",
    unit: str = "sentence",
    instructions: str = DEFAULT_INSTRUCTIONS,
    criteria: dict[str, str] | list[str] | None = None,
    other_labels: str = "error",
    task: str | None = None,
    lang: str = "en",
) -> Iterator[dict[str, Any]]:
    """Yield one span record per sentence or document of the file (``seed`` is unused: no randomness)."""
    if path is None:
        raise ValueError("the conll source needs a path to a CoNLL-style BIO file")
    source = existing(path)
    if scheme not in SCHEMES:
        raise ValueError(f"conll source: option 'scheme' must be one of {list(SCHEMES)}, got {scheme!r}")
    if unit not in UNITS:
        raise ValueError(f"conll source: option 'unit' must be one of {list(UNITS)}, got {unit!r}")
    chosen = criteria_option(criteria, "conll")
    if chosen is None:
        chosen = found_criteria(_labels(source, scheme), "conll", str(source))
    rows = _records(
        source,
        scheme=scheme,
        unit=unit,
        instructions=text_option(instructions, "instructions", "conll"),
        criteria=chosen,
        other=other_labels_option(other_labels, "conll"),
        task=text_option(task if task is not None else file_stem(source), "task", "conll"),
        lang=text_option(lang, "lang", "conll"),
    )
    return capped(rows, limit)
