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
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from data_sources._files import Row, capped, csv_columns, error_row, existing, file_stem, iter_csv, row_key

QUESTION_TYPES = ("choice", "noul", "score", "set")
TRUE_WORDS = ("true", "yes", "1")
FALSE_WORDS = ("false", "no", "0")


class RowError(ValueError):
    """A row value that cannot be turned into a record; the message names the column."""


@dataclass(frozen=True)
class ColumnLayout:
    """How the columns of a table map onto a decision record (shared by the csv and parquet sources)."""

    task: str
    type: str
    instructions: str
    criteria: Any
    options: tuple[str, ...]
    state_columns: tuple[str, ...]
    state_is_object: bool
    answer_column: str
    id_column: str | None
    lang: str

    @property
    def columns(self) -> tuple[str, ...]:
        return (*self.state_columns, self.answer_column, *((self.id_column,) if self.id_column else ()))


def make_layout(
    *,
    source: str,
    path: str,
    type: str,
    instructions: str | None,
    criteria: Any,
    state_column: str | list[str],
    answer_column: str,
    task: str | None,
    id_column: str | None,
    lang: str,
) -> ColumnLayout:
    """Check the recipe's column options (ValueError naming the option) and build the layout."""
    if type not in QUESTION_TYPES:
        raise ValueError(f"{source} source: option 'type' must be one of {list(QUESTION_TYPES)}, got {type!r}")
    if not isinstance(instructions, str) or not instructions.strip():
        raise ValueError(f"{source} source: option 'instructions' must be a non-empty string")
    options = _options(source, type, criteria)
    columns = [state_column] if isinstance(state_column, str) else list(state_column)
    if not columns or not all(isinstance(c, str) and c for c in columns):
        raise ValueError(f"{source} source: option 'state_column' must be a column name or a list of them")
    if not isinstance(lang, str) or not lang:
        raise ValueError(f"{source} source: option 'lang' must be a language code such as 'en'")
    return ColumnLayout(
        task=task or file_stem(path),
        type=type,
        instructions=instructions,
        criteria=criteria,
        options=options,
        state_columns=tuple(columns),
        state_is_object=not isinstance(state_column, str),
        answer_column=answer_column,
        id_column=id_column,
        lang=lang,
    )


def check_columns(path: str, header: Iterable[str], layout: ColumnLayout) -> None:
    header = list(header)
    missing = [c for c in layout.columns if c not in header]
    if missing:
        raise ValueError(f"{path}: column(s) {missing} named in the recipe are not in the file; it has {header}")


def _options(source: str, qtype: str, criteria: Any) -> tuple[str, ...]:
    """The option ids answers must come from; ValueError naming 'criteria' when they do not fit the type."""
    if qtype == "noul":
        if criteria is None or (isinstance(criteria, Mapping) and set(criteria) <= {"true", "false"}):
            return ("true", "false")
        raise ValueError(f"{source} source: option 'criteria' of a noul must be absent or {{true: ..., false: ...}}")
    if qtype == "score":
        if isinstance(criteria, list) and len(criteria) >= 2 and all(isinstance(c, str) for c in criteria):
            return tuple(str(i) for i in range(len(criteria)))
        raise ValueError(f"{source} source: option 'criteria' of a score must be a list of level texts, lowest first")
    if isinstance(criteria, Mapping) and len(criteria) >= (2 if qtype == "choice" else 1):
        return tuple(str(k) for k in criteria)
    if isinstance(criteria, list) and len(criteria) >= (2 if qtype == "choice" else 1):
        return tuple(str(k) for k in criteria)
    raise ValueError(f"{source} source: option 'criteria' of a {qtype} must be a map id → description or a list of ids")


def _text(value: Any, column: str) -> str:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise RowError(f"column {column!r} is empty")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip() if not isinstance(value, str) else value


def parse_answer(value: Any, layout: ColumnLayout) -> Any:
    """The record's ``answer`` for one cell of the answer column (RowError naming the column if it is bad)."""
    column = layout.answer_column
    if isinstance(value, str):
        value = value.strip()
    if value is None or value == "" or value == []:
        raise RowError(f"column {column!r} is empty")
    if layout.type == "noul":
        if isinstance(value, bool):
            return value
        word = str(int(value) if isinstance(value, float) and value.is_integer() else value).lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
        raise RowError(f"column {column!r}: {value!r} is not a yes/no value (true/false, yes/no, 1/0)")
    if layout.type == "score":
        levels = layout.criteria
        whole = not isinstance(value, bool) and isinstance(value, (int, float)) and float(value).is_integer()
        if whole or (isinstance(value, str) and value.isdigit()):
            index = int(value)
        else:
            lowered = [level.lower() for level in levels]
            if str(value).lower() not in lowered:
                raise RowError(f"column {column!r}: {value!r} is neither a level index nor one of the levels {levels}")
            index = lowered.index(str(value).lower())
        if not 0 <= index < len(levels):
            raise RowError(f"column {column!r}: level {index} is outside 0..{len(levels) - 1}")
        return index
    if layout.type == "set":
        labels = _labels(value, column)
        unknown = [label for label in labels if label not in layout.options]
        if unknown:
            raise RowError(f"column {column!r}: label(s) {unknown} are not among {list(layout.options)}")
        return labels
    option = _text(value, column)
    if option not in layout.options:
        raise RowError(f"column {column!r}: {option!r} is not one of the options {list(layout.options)}")
    return option


def _labels(value: Any, column: str) -> list[str]:
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    text = str(value).strip()
    if text.startswith("["):
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            raise RowError(f"column {column!r}: {text!r} is not a JSON list of labels") from None
        if isinstance(parsed, list):
            return [str(v) for v in parsed]
    return [part.strip() for part in text.split(";") if part.strip()]


def layout_record(row: Mapping[str, Any], where: str, layout: ColumnLayout, row_key: str) -> dict[str, Any]:
    """One decision record from one table row (RowError naming the column when a value does not fit)."""
    if layout.state_is_object:
        state: Any = {c: row.get(c) for c in layout.state_columns if row.get(c) not in (None, "")}
        if not state:
            raise RowError(f"columns {list(layout.state_columns)} are all empty")
    else:
        state = _text(row.get(layout.state_columns[0]), layout.state_columns[0])
    answer = parse_answer(row.get(layout.answer_column), layout)
    if layout.id_column:
        rid = _text(row.get(layout.id_column), layout.id_column)
    else:
        rid = f"{layout.task}-{row_key}"
    question: dict[str, Any] = {"type": layout.type, "instructions": layout.instructions}
    if layout.criteria is not None:
        question["criteria"] = layout.criteria
    return {
        "id": rid,
        "task": layout.task,
        "lang": layout.lang,
        "state": state,
        "question": question,
        "answer": answer,
        "_where": where,
    }


def layout_records(rows: Iterable[Row], layout: ColumnLayout, stem: str) -> Iterator[dict[str, Any]]:
    """Records (or error rows) for every row of a table read by ``data_sources._files``."""
    for where, row, error in rows:
        if error is not None:
            yield error_row(where, error, row)
            continue
        try:
            yield layout_record(row, where, layout, row_key(where, stem))
        except RowError as err:
            yield error_row(where, str(err), row)


def convert(
    path: str | None = None,
    *,
    limit: int | None = None,
    seed: int = 13,
    type: str,
    instructions: str,
    criteria: dict[str, str] | list[str] | None = None,
    state_column: str | list[str] = "text",
    answer_column: str = "label",
    task: str | None = None,
    id_column: str | None = None,
    lang: str = "en",
) -> Iterator[dict[str, Any]]:
    """Yield one record per row of the CSV / TSV file at ``path`` (``seed`` is unused: no randomness)."""
    if path is None:
        raise ValueError("the csv source needs a path to a .csv or .tsv file")
    existing(path)
    layout = make_layout(
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
    )
    check_columns(path, csv_columns(path), layout)
    return capped(layout_records(iter_csv(path), layout, file_stem(path)), limit)
