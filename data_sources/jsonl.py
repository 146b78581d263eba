"""Decision records from a JSON Lines file in the docs/records.md form (also multi-question wire-format records).

Each line's object is passed through as it is, with ``_where`` added; validating it (and exploding a
wire-format record with ``questions`` / ``expected`` into one record per question) is the validator's job, so
that every rule is checked in one place. A line that is not valid JSON, or not a JSON object, becomes an error
row. Compressed files (``.jsonl.gz``, ``.jsonl.bz2``) are read too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from data_sources._files import capped, error_row, existing, iter_jsonl


def convert(path: str | None = None, *, limit: int | None = None, seed: int = 13) -> Iterator[dict[str, Any]]:
    """Yield each object of the JSONL file at ``path`` with ``_where`` = ``file:line`` (no randomness)."""
    if path is None:
        raise ValueError("the jsonl source needs a path to a .jsonl file")
    existing(path)
    return capped(_rows(path), limit)


def _rows(path: str) -> Iterator[dict[str, Any]]:
    for where, obj, error in iter_jsonl(path):
        if error is not None:
            yield error_row(where, error, obj)
        else:
            yield {**obj, "_where": where}
