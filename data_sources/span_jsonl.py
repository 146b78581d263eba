"""Span records from JSON Lines with character offsets: ``{"text": ..., "spans": [{"start", "end", "label"}]}``.

Each line is one text and its gold spans. The spans are read from the first of the keys ``spans``, ``entities``
or ``label`` (doccano's export) that the line has (option ``spans_key`` names another); each span is an object
``{"start", "end", "label"}`` (also ``start_offset`` / ``end_offset``, and an optional ``text`` that must equal
the text at those offsets) or a triple ``[start, end, label]``. A line with none of the keys, or an empty list,
has nothing to find (answer ``[]``). Offsets are character offsets (Python string indices, Unicode code points),
end exclusive; ``offsets: utf8`` reads UTF-8 byte offsets instead and converts them (an offset inside a
character is an error).

A line becomes an error row naming its line and the rule when: it is not a JSON object, its text is missing or
empty, a span is malformed, a span lies outside the text (``0 <= start < end <= len(text)``), two spans of one
label overlap, a span's ``text`` differs from the text at its offsets, or a label is not in ``criteria`` (with
``other_labels: drop`` such spans are skipped instead).

Options: ``instructions``, ``criteria`` (default: every label the file uses, sorted), ``other_labels``,
``text_key`` (default ``text``), ``spans_key``, ``offsets`` (``chars`` | ``utf8``), ``task`` (default: the line's
``task``, else the file's stem), ``lang`` (default ``en``). Records: id = the line's ``id`` if it has one, else
``<file stem>-<line>``; meta ``{"source_id"}`` when the line had an id; ``_where`` = file:line.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from data_sources._files import capped, error_row, existing, file_stem, iter_jsonl, row_key
from data_sources._spans import (
    DEFAULT_INSTRUCTIONS,
    Span,
    criteria_option,
    found_criteria,
    keep_labels,
    other_labels_option,
    span_problem,
    span_record,
    text_option,
)

SPANS_KEYS = ("spans", "entities", "label")
OFFSETS = ("chars", "utf8")


class SpanError(ValueError):
    """A line whose spans cannot be read; the message names the rule."""


def _offset(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpanError(f"{what} must be an integer, got {value!r}")
    return value


def _char_offset(text: str, encoded: bytes, offset: int, what: str) -> int:
    """A UTF-8 byte offset as a character offset (SpanError when it falls inside a character)."""
    if not 0 <= offset <= len(encoded):
        raise SpanError(f"{what} {offset} is outside the text's {len(encoded)} UTF-8 bytes")
    try:
        return len(encoded[:offset].decode("utf-8"))
    except UnicodeDecodeError:
        raise SpanError(f"{what} {offset} falls inside a multi-byte character (offsets: utf8)") from None


def read_spans(line: dict[str, Any], text: str, spans_key: str | None, offsets: str) -> list[Span]:
    """The line's gold spans in characters; SpanError names the first malformed one."""
    key = spans_key if spans_key is not None else next((k for k in SPANS_KEYS if k in line), None)
    items = line.get(key, []) if key is not None else []
    if key == "label" and spans_key is None and not isinstance(items, list):
        items = []  # a plain text label is not a span list
    if not isinstance(items, list):
        kind = "null" if items is None else f"a JSON {type(items).__name__}"
        raise SpanError(f"key {key!r} must be a list of spans, got {kind}")
    encoded = text.encode("utf-8") if offsets == "utf8" else b""
    spans: list[Span] = []
    for n, item in enumerate(items):
        what = f"{key}[{n}]"
        if isinstance(item, dict):
            start = item.get("start", item.get("start_offset"))
            end = item.get("end", item.get("end_offset"))
            label, quoted = item.get("label"), item.get("text")
        elif isinstance(item, list) and len(item) == 3:
            (start, end, label), quoted = item, None
        else:
            raise SpanError(f"{what} must be an object {{start, end, label}} or a triple [start, end, label]")
        start, end = _offset(start, f"{what}.start"), _offset(end, f"{what}.end")
        if not isinstance(label, str) or not label.strip():
            raise SpanError(f"{what}.label must be a non-empty string, got {label!r}")
        if offsets == "utf8":
            start = _char_offset(text, encoded, start, f"{what}.start")
            end = _char_offset(text, encoded, end, f"{what}.end")
        if quoted is not None and 0 <= start < end <= len(text) and quoted != text[start:end]:
            raise SpanError(f"{what}.text {quoted!r} differs from the text at [{start}, {end}): {text[start:end]!r}")
        spans.append((start, end, label))
    problem = span_problem(spans, text)
    if problem is not None:
        raise SpanError(problem)
    return spans


def _readable(path: Path, text_key: str, spans_key: str | None, offsets: str) -> Iterator[tuple[str, Any, Any]]:
    """``(where, line, result)``: result is ``(text, spans)`` or the reason the line is an error row."""
    for where, line, error in iter_jsonl(path):
        if error is not None:
            yield where, line, error
            continue
        text = line.get(text_key)
        if not isinstance(text, str) or not text.strip():
            yield where, line, f"key {text_key!r} is missing or not a non-empty string"
            continue
        try:
            yield where, line, (text, read_spans(line, text, spans_key, offsets))
        except SpanError as err:
            yield where, line, str(err)


def _records(
    path: Path, *, instructions: str, criteria: Any, other: str, text_key: str, spans_key: str | None,
    offsets: str, task: str | None, lang: str,
) -> Iterator[dict[str, Any]]:  # fmt: skip
    stem, labels = file_stem(path), list(criteria)
    for where, line, result in _readable(path, text_key, spans_key, offsets):
        if isinstance(result, str):
            yield error_row(where, result, line)
            continue
        text, spans = result
        spans, problem = keep_labels(spans, labels, other)
        if problem is not None:
            yield error_row(where, problem, line)
            continue
        line_task = line.get("task")
        source_id = line.get("id")
        yield span_record(
            id=str(source_id) if source_id not in (None, "") else row_key(where, stem),
            task=task or (line_task if isinstance(line_task, str) and line_task.strip() else stem),
            lang=lang,
            state=text,
            instructions=instructions,
            criteria=criteria,
            spans=spans,
            where=where,
            meta={"source_id": source_id} if source_id not in (None, "") else None,
        )


def convert(
    path: str | None = None,
    *,
    limit: int | None = None,
    seed: int = 13,
    instructions: str = DEFAULT_INSTRUCTIONS,
    criteria: dict[str, str] | list[str] | None = None,
    other_labels: str = "error",
    text_key: str = "text",
    spans_key: str | None = None,
    offsets: str = "chars",
    task: str | None = None,
    lang: str = "en",
) -> Iterator[dict[str, Any]]:
    """Yield one span record per line of the JSONL file (``seed`` is unused: no randomness)."""
    if path is None:
        raise ValueError("the span_jsonl source needs a path to a .jsonl file")
    source = existing(path)
    if offsets not in OFFSETS:
        raise ValueError(f"span_jsonl source: option 'offsets' must be one of {list(OFFSETS)}, got {offsets!r}")
    text_key = text_option(text_key, "text_key", "span_jsonl")
    spans_key = None if spans_key is None else text_option(spans_key, "spans_key", "span_jsonl")
    chosen = criteria_option(criteria, "span_jsonl")
    if chosen is None:
        readable = _readable(source, text_key, spans_key, offsets)
        chosen = found_criteria(
            (label for _, _, r in readable if not isinstance(r, str) for _, _, label in r[1]), "span_jsonl", str(source)
        )
    rows = _records(
        source,
        instructions=text_option(instructions, "instructions", "span_jsonl"),
        criteria=chosen,
        other=other_labels_option(other_labels, "span_jsonl"),
        text_key=text_key,
        spans_key=spans_key,
        offsets=offsets,
        task=None if task is None else text_option(task, "task", "span_jsonl"),
        lang=text_option(lang, "lang", "span_jsonl"),
    )
    return capped(rows, limit)
