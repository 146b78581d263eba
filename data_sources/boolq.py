"""BoolQ (Google): does a Wikipedia passage answer a yes/no question with yes (noul).

State = the passage; the question's instructions = the BoolQ question, capitalised and ended with "?" (BoolQ
stores questions lower-case without a question mark); answer = the gold yes/no. A passage's ``title`` (in the
original files) goes to ``meta``.

Local files in the published layouts: the JSON Lines files ``train.jsonl`` / ``dev.jsonl`` (fields
``question``, ``title``, ``answer`` true/false, ``passage``), or exports of the Hugging Face datasets
``google/boolq`` (``question``, ``answer``, ``passage``) and SuperGLUE BoolQ (``label`` 1 = yes, 0 = no); CSV
and Parquet files with these columns too. The split name in ids is the file's stem. With no path the Hugging
Face dataset ``google/boolq`` is loaded (online), ``split`` ``train`` or ``validation``.

Records: task ``boolq``, id ``boolq-<split>-<line or row>``, lang ``en``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from data_sources._files import Row, capped, error_row, existing, file_stem, iter_hub, iter_rows, load_hub

HUB_NAME = "google/boolq"
TASK = "boolq"
YES_WORDS = ("true", "yes", "1")
NO_WORDS = ("false", "no", "0")


def as_question(text: str) -> str:
    """``is the sky blue`` → ``Is the sky blue?``."""
    text = " ".join(text.split())
    text = text[:1].upper() + text[1:]
    return text if text.endswith("?") else text + "?"


def gold_answer(row: dict[str, Any]) -> bool:
    """The yes/no gold of a row (``answer`` true/false or ``label`` 1/0); ValueError naming the column."""
    column = "answer" if "answer" in row else "label"
    value = row.get(column)
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower() if value is not None else ""
    if word in YES_WORDS:
        return True
    if word in NO_WORDS:
        return False
    raise ValueError(f"column {column!r}: {value!r} is not a yes/no answer (true/false or 1/0)")


def _records(rows: Iterable[Row], split: str) -> Iterator[dict[str, Any]]:
    for where, row, error in rows:
        if error is not None:
            yield error_row(where, error, row)
            continue
        passage, question = row.get("passage"), row.get("question")
        if not isinstance(passage, str) or not passage.strip():
            yield error_row(where, "column 'passage' is missing or empty", row)
            continue
        if not isinstance(question, str) or not question.strip():
            yield error_row(where, "column 'question' is missing or empty", row)
            continue
        try:
            answer = gold_answer(row)
        except ValueError as err:
            yield error_row(where, str(err), row)
            continue
        record: dict[str, Any] = {
            "id": f"{TASK}-{split}-{where.rsplit(':', 1)[1]}",
            "task": TASK,
            "lang": "en",
            "state": passage.strip(),
            "question": {"type": "noul", "instructions": as_question(question)},
            "answer": answer,
            "_where": where,
        }
        if row.get("title"):
            record["meta"] = {"title": str(row["title"])}
        yield record


def convert(
    path: str | None = None, *, limit: int | None = None, seed: int = 13, split: str = "train"
) -> Iterator[dict[str, Any]]:
    """Yield one noul record per question of ``path`` (or of the Hugging Face split if ``path`` is None)."""
    if path is None:
        rows = iter_hub(load_hub(HUB_NAME, split), HUB_NAME, split)
        return capped(_records(rows, split), limit)
    existing(path)
    return capped(_records(iter_rows(path), file_stem(path)), limit)
