"""Shared code of the span converters (not a source): the question, gold-span checks and the span record.

A span record (docs/records.md, docs/span-data.md) asks where in its text each label occurs; its answer is a list
of gold spans ``{"label", "start", "end", "text"}`` with character offsets (Python string indices, i.e. Unicode
code points), start inclusive, end exclusive. The checks here are the ones a converter can make on its own input
(offsets inside the text, no overlapping spans of one label, labels known to the question), so a bad source row
becomes an error row naming its line and the rule, not a record the validator rejects later.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping
from typing import Any

DEFAULT_INSTRUCTIONS = "Which pieces of this text are one of the labels?"
MAX_LABELS = 32
OTHER_LABELS = ("error", "drop")

Span = tuple[int, int, str]  # (start, end, label): character offsets, end exclusive
WORD = re.compile(r"\S+")


def criteria_option(criteria: Any, source: str) -> dict[str, str] | list[str] | None:
    """The ``criteria`` option checked: None, a map label → description, or a list of labels (1 to 32)."""
    if criteria is None:
        return None
    if isinstance(criteria, Mapping):
        labels = list(criteria)
        if not all(isinstance(v, str) and v.strip() for v in criteria.values()):
            raise ValueError(f"{source} source: option 'criteria' descriptions must be non-empty strings")
    elif isinstance(criteria, (list, tuple)):
        labels = list(criteria)
    else:
        raise ValueError(f"{source} source: option 'criteria' must be a map label → description or a list of labels")
    if not all(isinstance(label, str) and label.strip() and label == label.strip() for label in labels):
        raise ValueError(f"{source} source: option 'criteria' labels must be non-empty strings without outer spaces")
    if len(set(labels)) != len(labels):
        raise ValueError(f"{source} source: option 'criteria' repeats a label")
    if not 1 <= len(labels) <= MAX_LABELS:
        raise ValueError(f"{source} source: option 'criteria' must name 1 to {MAX_LABELS} labels, got {len(labels)}")
    return dict(criteria) if isinstance(criteria, Mapping) else labels


def found_criteria(labels: Iterable[str], source: str, path: str) -> list[str]:
    """The criteria when the recipe gives none: every label the file uses, sorted (1 to 32 of them)."""
    names = sorted(set(labels))
    if not names:
        raise ValueError(f"{path}: no span labels in the file; give the {source} source option 'criteria'")
    if len(names) > MAX_LABELS:
        raise ValueError(
            f"{path}: {len(names)} span labels in the file, a span question takes at most {MAX_LABELS}; "
            f"give option 'criteria' with the labels to keep and other_labels: drop"
        )
    return names


def text_option(value: Any, name: str, source: str) -> str:
    """A non-empty string option (``instructions``, ``task``, ``lang``)."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{source} source: option '{name}' must be a non-empty string, got {value!r}")
    return value


def other_labels_option(value: Any, source: str) -> str:
    if value not in OTHER_LABELS:
        raise ValueError(f"{source} source: option 'other_labels' must be 'error' or 'drop', got {value!r}")
    return str(value)


def span_problem(spans: Iterable[Span], text: str) -> str | None:
    """Why these gold spans cannot be the answer for ``text`` (offsets outside it, empty or reversed spans,
    overlapping spans of one label), or None."""
    by_label: dict[str, list[tuple[int, int]]] = {}
    for start, end, label in spans:
        if not 0 <= start < end <= len(text):
            return f"span [{start}, {end}) {label}: offsets must satisfy 0 <= start < end <= {len(text)} (text length)"
        by_label.setdefault(label, []).append((start, end))
    for label, ranges in by_label.items():
        ranges.sort()
        for (s1, e1), (s2, e2) in itertools.pairwise(ranges):
            if s2 < e1:
                return f"spans [{s1}, {e1}) and [{s2}, {e2}) of label {label} overlap (one label's spans may not)"
    return None


def keep_labels(spans: list[Span], labels: Iterable[str], other: str) -> tuple[list[Span], str | None]:
    """The spans whose labels the question knows; with ``other == "error"`` a span of any other label is the
    reason for an error row instead."""
    known = set(labels)
    unknown = sorted({label for _, _, label in spans if label not in known})
    if unknown and other == "error":
        return spans, f"label {unknown[0]!r} is not in criteria {sorted(known)} (option other_labels: drop skips it)"
    return [s for s in spans if s[2] in known], None


def word_aligned(text: str, start: int, end: int) -> bool:
    """Whether a span starts where a word (a run of non-whitespace) starts and ends where one ends."""
    return (
        (start == 0 or text[start - 1].isspace())
        and (end == len(text) or text[end].isspace())
        and (not text[start].isspace() and not text[end - 1].isspace())
    )


def span_record(
    *,
    id: str,
    task: str,
    lang: str,
    state: str,
    instructions: str,
    criteria: dict[str, str] | list[str],
    spans: Iterable[Span],
    where: str,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A span record; its answer is sorted by (start, label) and each gold span carries its text."""
    answer = [
        {"label": label, "start": start, "end": end, "text": state[start:end]}
        for start, end, label in sorted(spans, key=lambda s: (s[0], s[2], s[1]))
    ]
    record: dict[str, Any] = {
        "id": id,
        "task": task,
        "lang": lang,
        "state": state,
        "question": {
            "type": "span",
            "instructions": instructions,
            "criteria": dict(criteria) if isinstance(criteria, dict) else list(criteria),
        },
        "answer": answer,
    }
    if meta:
        record["meta"] = meta
    record["_where"] = where
    return record
