"""Generated PII texts (made with Faker, no real people): where are names, e-mails, phones and addresses (span).

**Generated data, not real data.** The shipped sample ``samples/pii_spans.jsonl`` holds 800 short texts
written from templates by ``scripts/make_pii_sample.py`` (seed 13, Faker 40.63.0): support tickets, e-mails,
chat logs, CV headers, shipping notes and texts with no personal data, with names, e-mail addresses, phone
numbers and postal addresses from Faker's en_US, en_GB, de_DE, fr_FR, sv_SE, es_ES and pl_PL locales (names
with non-ASCII letters, lower-cased names in chats, e-mails in angle brackets, phone numbers written with and
without spaces). See samples/ATTRIBUTION.md.

Each line ``{"id", "kind", "locale", "text", "spans": [{"start", "end", "label", "text"}]}`` becomes one span
record: task ``pii_spans``, question "Which pieces of this text are personal data?" with the labels PERSON,
EMAIL, PHONE, ADDRESS (option ``labels`` keeps a subset; spans of the other labels are dropped), answer = the
gold spans (character offsets, end exclusive). A span covers the personal data only: a neighbouring comma,
colon or bracket stays outside, so 1280 of the 2514 spans are not word-aligned (``Anna,`` ``<bo@ek.se>``); a
word that overlaps a span counts as that label's word (docs/span-data.md). Records: id as in the file, lang
``en`` (some texts carry one sentence in the locale's language), meta ``{"kind", "locale"}``, ``_where`` =
file:line. A line that breaks a rule of the span_jsonl source (offsets outside the text, overlapping spans of one
label, a span text that differs from the text) is an error row naming its line.

Long documents: option ``join: k`` makes one record of every k consecutive texts, joined by a blank line, with
the spans shifted to match (task ``pii_spans_long``, id ``<first id>+<k - 1>``, meta ``{"kind": "document",
"texts", "locales"}``). With ``join: 40`` the 800 texts become 20 documents of 7,000 to 8,800 characters
(thousands of tokens, several of the span scorer's windows), for measuring long-document span F1.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from data_sources._files import SAMPLES, capped, error_row, existing, iter_jsonl
from data_sources._spans import keep_labels, span_record
from data_sources.span_jsonl import SpanError, read_spans

TASK, LONG_TASK = "pii_spans", "pii_spans_long"
INSTRUCTIONS = "Which pieces of this text are personal data?"
CRITERIA = {
    "PERSON": "a person's name (first name, last name or both)",
    "EMAIL": "an e-mail address",
    "PHONE": "a telephone number",
    "ADDRESS": "a postal address (street and number, with postcode and town when given)",
}
SAMPLE = SAMPLES / "pii_spans.jsonl"
DOCUMENT_SEPARATOR = "\n\n"


def _records(path: Path, criteria: dict[str, str]) -> Iterator[dict[str, Any]]:
    for where, line, error in iter_jsonl(path):
        if error is not None:
            yield error_row(where, error, line)
            continue
        text, rid = line.get("text"), line.get("id")
        if not isinstance(text, str) or not text.strip() or not isinstance(rid, str) or not rid:
            yield error_row(where, "keys 'text' and 'id' must be non-empty strings", line)
            continue
        try:
            spans = read_spans(line, text, "spans", "chars")
        except SpanError as err:
            yield error_row(where, str(err), line)
            continue
        unknown = sorted({label for _, _, label in spans} - set(CRITERIA))
        if unknown:
            yield error_row(where, f"label {unknown[0]!r} is not one of {list(CRITERIA)}", line)
            continue
        kept, _ = keep_labels(spans, criteria, "drop")
        yield span_record(
            id=rid,
            task=TASK,
            lang="en",
            state=text,
            instructions=INSTRUCTIONS,
            criteria=criteria,
            spans=kept,
            where=where,
            meta={"kind": line.get("kind", ""), "locale": line.get("locale", "")},
        )


def _documents(rows: Iterator[dict[str, Any]], join: int) -> Iterator[dict[str, Any]]:
    """Records of ``join`` consecutive texts each, joined by a blank line, their spans shifted (error rows pass)."""
    group: list[dict[str, Any]] = []
    for row in rows:
        if "_error" in row:
            yield row
            continue
        group.append(row)
        if len(group) == join:
            yield _document(group)
            group = []
    if group:
        yield _document(group)


def _document(group: list[dict[str, Any]]) -> dict[str, Any]:
    spans, offset = [], 0
    for record in group:
        spans.extend((s["start"] + offset, s["end"] + offset, s["label"]) for s in record["answer"])
        offset += len(record["state"]) + len(DOCUMENT_SEPARATOR)
    first = group[0]
    return span_record(
        id=f"{first['id']}+{len(group) - 1}",
        task=LONG_TASK,
        lang="en",
        state=DOCUMENT_SEPARATOR.join(r["state"] for r in group),
        instructions=INSTRUCTIONS,
        criteria=first["question"]["criteria"],
        spans=spans,
        where=first["_where"],
        meta={"kind": "document", "texts": len(group), "locales": sorted({r["meta"]["locale"] for r in group})},
    )


def convert(
    path: str | None = None,
    *,
    limit: int | None = None,
    seed: int = 13,
    labels: list[str] | None = None,
    join: int = 1,
) -> Iterator[dict[str, Any]]:
    """Yield one span record per text, or per ``join`` texts (no randomness; ``path`` None reads the sample)."""
    if isinstance(join, bool) or not isinstance(join, int) or join < 1:
        raise ValueError(f"pii source: option 'join' must be a positive integer, got {join!r}")
    if labels is None:
        criteria = dict(CRITERIA)
    else:
        if not isinstance(labels, list) or not labels or not set(labels) <= set(CRITERIA):
            raise ValueError(
                f"pii source: option 'labels' must be a non-empty list of {list(CRITERIA)}, got {labels!r}"
            )
        criteria = {label: CRITERIA[label] for label in CRITERIA if label in labels}
    rows = _records(existing(SAMPLE if path is None else path), criteria)
    return capped(rows if join == 1 else _documents(rows, join), limit)
