"""Generated PII texts (made with Faker, no real people): where are names, e-mails, phones and addresses (span).

**Generated data, not real data.** The shipped sample ``samples/pii_spans.jsonl`` holds 800 short texts
written from templates by ``samples/make_pii_sample.py`` (seed 13, Faker 40.63.0): support tickets, e-mails,
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
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from data_sources._files import SAMPLES, capped, error_row, existing, iter_jsonl
from data_sources._spans import keep_labels, span_record
from data_sources.span_jsonl import SpanError, read_spans

TASK = "pii_spans"
INSTRUCTIONS = "Which pieces of this text are personal data?"
CRITERIA = {
    "PERSON": "a person's name (first name, last name or both)",
    "EMAIL": "an e-mail address",
    "PHONE": "a telephone number",
    "ADDRESS": "a postal address (street and number, with postcode and town when given)",
}
SAMPLE = SAMPLES / "pii_spans.jsonl"


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


def convert(
    path: str | None = None, *, limit: int | None = None, seed: int = 13, labels: list[str] | None = None
) -> Iterator[dict[str, Any]]:
    """Yield one span record per text (no randomness; ``path`` None reads the shipped sample)."""
    if labels is None:
        criteria = dict(CRITERIA)
    else:
        if not isinstance(labels, list) or not labels or not set(labels) <= set(CRITERIA):
            raise ValueError(
                f"pii source: option 'labels' must be a non-empty list of {list(CRITERIA)}, got {labels!r}"
            )
        criteria = {label: CRITERIA[label] for label in CRITERIA if label in labels}
    return capped(_records(existing(SAMPLE if path is None else path), criteria), limit)
