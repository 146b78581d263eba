"""Decision records from a CSV / TSV file: one row per record, columns mapped by the recipe's options.

Options: ``type`` (choice | noul | score | set) and ``instructions`` are required; ``state_column`` (default
``text``; a list of columns makes the state a JSON object ``{column: value}``), ``answer_column`` (default
``label``), ``criteria`` (choice: a map option id → description or a list of option ids; score: the level
texts, lowest first; set: a map label → description; noul: none or ``{"true": ..., "false": ...}``), ``task``
(default: the file's stem), ``id_column`` (default: ids are ``<task>-<file stem>-<line>``; for a part file of a
directory or pattern ``<task>-<stem>-<part's stem>-<row>``) and ``lang`` (default ``en``).

Answers are read per type: choice → an option id; noul → true/false, yes/no or 1/0; score → a level index or
the level's text; set → a JSON list or ``;``-separated labels. A column missing from the header is a recipe
error (ValueError naming the file and the column); a row with an empty or unknown value becomes an error row
naming the column. ``.tsv`` files are tab-separated; ``.gz`` / ``.bz2`` compressed files are read too.

Several label columns of one row: ``questions``, a list of ``{task, type, column, instructions, options / levels}``
(``options``: a choice's or set's ids, as ``criteria``; ``levels``: a score's texts; ``instructions`` defaults to the
source's), in place of ``type``, ``criteria``, ``answer_column`` and ``task``. Each row gives one record per
question, sharing the state; ids are ``<row id>:<task>`` (the row id: ``id_column``'s value, else
``<file stem>-<line>``), and a bad value rejects that question of the row only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from data_sources._columns import check_columns, layout_records, table_layouts
from data_sources._files import capped, csv_columns, existing, file_stem, iter_csv


def convert(
    path: str | None = None,
    *,
    limit: int | None = None,
    seed: int = 13,
    type: str | None = None,
    instructions: str | None = None,
    criteria: dict[str, str] | list[str] | None = None,
    state_column: str | list[str] = "text",
    answer_column: str | None = None,
    task: str | None = None,
    id_column: str | None = None,
    lang: str = "en",
    questions: list[dict[str, Any]] | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield one record per row of the CSV / TSV file at ``path`` (``seed`` is unused: no randomness)."""
    if path is None:
        raise ValueError("the csv source needs a path to a .csv or .tsv file")
    existing(path)
    layouts = table_layouts(
        source="csv",
        path=path,
        type=type,
        instructions=instructions,
        criteria=criteria,
        state_column=state_column,
        answer_column=answer_column,
        task=task,
        id_column=id_column,
        lang=lang,
        questions=questions,
    )
    check_columns(path, csv_columns(path), layouts)
    return capped(layout_records(iter_csv(path), layouts, file_stem(path)), limit)
