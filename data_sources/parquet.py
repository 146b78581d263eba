"""Decision records from a Parquet file: one row per record, columns mapped as for the csv source.

Options are those of the csv source (``type``, ``instructions``, ``criteria``, ``state_column``,
``answer_column``, ``task``, ``id_column``, ``lang``; ``questions`` for several label columns of a row).
``_where`` is ``file:row`` with the 0-based row index
(as pandas shows it). Integer labels are read as option ids ``"0"``, ``"1"``, … for choice questions and as
level indices for score questions; list columns are read as set labels.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from data_sources._columns import check_columns, layout_records, table_layouts
from data_sources._files import capped, existing, file_stem, iter_parquet, parquet_columns


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
    """Yield one record per row of the Parquet file at ``path`` (``seed`` is unused: no randomness)."""
    if path is None:
        raise ValueError("the parquet source needs a path to a .parquet file")
    existing(path)
    layouts = table_layouts(
        source="parquet",
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
    check_columns(path, parquet_columns(path), layouts)
    return capped(layout_records(iter_parquet(path), layouts, file_stem(path)), limit)
