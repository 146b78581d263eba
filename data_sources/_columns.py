"""Shared column code of the table sources (csv, parquet, datasets): how a table's columns map onto decision records
(:class:`ColumnLayout`, :func:`make_layout`; several questions of one row: :func:`question_layouts`), the check that
the mapped columns exist, and each row read into records or error rows naming their column (answers read per
question type: :func:`parse_answer`)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from data_sources._files import Row, error_row, file_stem, row_key

QUESTION_TYPES = ("choice", "noul", "score", "set")
TRUE_WORDS = ("true", "yes", "1")
FALSE_WORDS = ("false", "no", "0")


class RowError(ValueError):
    """A row value that cannot be turned into a record; the message names the column."""


@dataclass(frozen=True)
class ColumnLayout:
    """How the columns of a table map onto a decision record (the csv, parquet and datasets sources)."""

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
    per_question: bool = False  # one of several questions of a row: ids are "<row id>:<task>"

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
    criteria_key: str = "criteria",
) -> ColumnLayout:
    """Check the recipe's column options (ValueError naming the option) and build the layout."""
    if type not in QUESTION_TYPES:
        raise ValueError(f"{source} source: option 'type' must be one of {list(QUESTION_TYPES)}, got {type!r}")
    if not isinstance(instructions, str) or not instructions.strip():
        raise ValueError(f"{source} source: option 'instructions' must be a non-empty string")
    options = _options(source, type, criteria, criteria_key)
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


QUESTION_KEYS = ("task", "type", "column", "instructions", "options", "levels")


def question_layouts(
    *,
    source: str,
    path: str,
    questions: Any,
    instructions: str | None,
    state_column: str | list[str],
    id_column: str | None,
    lang: str,
) -> list[ColumnLayout]:
    """The layouts of a source's ``questions`` option: one question per entry ``{task, type, column, instructions,
    options / levels}``, all of one row sharing its state and its id (each record's id is ``<row id>:<task>``).
    ``instructions`` of an entry defaults to the source's; ``options`` gives a choice's or set's option ids (a map id
    → description or a list), ``levels`` a score's level texts (lowest first); a noul takes neither, or ``options:
    {true: ..., false: ...}``. ValueError naming ``questions[i]`` and the key when an entry cannot make records."""
    if not isinstance(questions, list) or not questions:
        raise ValueError(f"{source} source: option 'questions' must be a non-empty list of {{task, type, column, ...}}")
    layouts = []
    for i, entry in enumerate(questions):
        where = f"{source} source: questions[{i}]"
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where} must be a map {{task, type, column, instructions, options or levels}}")
        unknown = sorted(set(entry) - set(QUESTION_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; the keys are {list(QUESTION_KEYS)}")
        for key in ("task", "type", "column"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise ValueError(f"{where}: '{key}' must be a non-empty string")
        wrong = "options" if entry["type"] == "score" else "levels"
        if wrong in entry:
            right = "levels" if wrong == "options" else "options"
            raise ValueError(f"{where}: a {entry['type']} question takes '{right}', not '{wrong}'")
        key = "levels" if entry["type"] == "score" else "options"
        try:
            layout = make_layout(
                source=source,
                path=path,
                type=entry["type"],
                instructions=entry.get("instructions", instructions),
                criteria=entry.get(key),
                state_column=state_column,
                answer_column=entry["column"],
                task=entry["task"],
                id_column=id_column,
                lang=lang,
                criteria_key=key,
            )
        except ValueError as err:  # make_layout names the source: name the entry too
            raise ValueError(str(err).replace(f"{source} source: ", f"{where}: ", 1)) from None
        layouts.append(replace(layout, per_question=True))
    tasks = [layout.task for layout in layouts]
    repeated = sorted({t for t in tasks if tasks.count(t) > 1})
    if repeated:
        raise ValueError(
            f"{source} source: questions name the task(s) {repeated} more than once; a task is one question"
        )
    return layouts


def table_layouts(
    *,
    source: str,
    path: str,
    type: str | None,
    instructions: str | None,
    criteria: Any,
    state_column: str | list[str],
    answer_column: str | None,
    task: str | None,
    id_column: str | None,
    lang: str,
    questions: Any,
) -> list[ColumnLayout]:
    """The csv and parquet sources' layouts: one question (``type``, ``answer_column``, ...) or ``questions``."""
    if questions is None:
        if type is None:
            raise ValueError(f"{source} source: option 'type' (choice, noul, score or set) or 'questions' is needed")
        return [
            make_layout(
                source=source,
                path=path,
                type=type,
                instructions=instructions,
                criteria=criteria,
                state_column=state_column,
                answer_column=answer_column or "label",
                task=task,
                id_column=id_column,
                lang=lang,
            )
        ]
    given = [
        k for k, v in {"type": type, "criteria": criteria, "answer_column": answer_column, "task": task}.items() if v
    ]
    if given:
        raise ValueError(f"{source} source: option(s) {given} belong in each entry of 'questions', not beside it")
    return question_layouts(
        source=source,
        path=path,
        questions=questions,
        instructions=instructions,
        state_column=state_column,
        id_column=id_column,
        lang=lang,
    )


def check_columns(path: str, header: Iterable[str], layouts: ColumnLayout | list[ColumnLayout]) -> None:
    header = list(header)
    wanted = [layouts] if isinstance(layouts, ColumnLayout) else layouts
    missing = list(dict.fromkeys(c for layout in wanted for c in layout.columns if c not in header))
    if missing:
        raise ValueError(f"{path}: column(s) {missing} named in the recipe are not in the file; it has {header}")


def _options(source: str, qtype: str, criteria: Any, key: str = "criteria") -> tuple[str, ...]:
    """The option ids answers must come from; ValueError naming ``key`` when they do not fit the type."""
    if qtype == "noul":
        if criteria is None or (isinstance(criteria, Mapping) and set(criteria) <= {"true", "false"}):
            return ("true", "false")
        raise ValueError(f"{source} source: option '{key}' of a noul must be absent or {{true: ..., false: ...}}")
    if qtype == "score":
        if isinstance(criteria, list) and len(criteria) >= 2 and all(isinstance(c, str) for c in criteria):
            return tuple(str(i) for i in range(len(criteria)))
        raise ValueError(f"{source} source: option '{key}' of a score must be a list of level texts, lowest first")
    if isinstance(criteria, Mapping) and len(criteria) >= (2 if qtype == "choice" else 1):
        return tuple(str(k) for k in criteria)
    if isinstance(criteria, list) and len(criteria) >= (2 if qtype == "choice" else 1):
        return tuple(str(k) for k in criteria)
    raise ValueError(f"{source} source: option '{key}' of a {qtype} must be a map id → description or a list of ids")


def _text(value: Any, column: str) -> str:
    """A cell as text: a string, or a number written out; bytes, a map, a list or NaN is no text to guess at."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise RowError(f"column {column!r} is empty")
    if isinstance(value, (bytes, bytearray, dict, list, tuple)):
        kind = {bytes: "bytes", bytearray: "bytes", dict: "a map", list: "a list", tuple: "a list"}[type(value)]
        raise RowError(f"column {column!r} holds {kind}, not text")
    if isinstance(value, float) and not math.isfinite(value):
        raise RowError(f"column {column!r} holds {value} (NaN is a missing value), not text")
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
        rid = row_key if layout.per_question else f"{layout.task}-{row_key}"
    if layout.per_question:
        rid = f"{rid}:{layout.task}"
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


def layout_records(rows: Iterable[Row], layouts: list[ColumnLayout], stem: str) -> Iterator[dict[str, Any]]:
    """Records (or error rows) for every row of a table read by ``data_sources._files``: one per layout (question),
    so a bad value in one question's column rejects that question of the row only."""
    for where, row, error in rows:
        if error is not None:
            yield error_row(where, error, row)
            continue
        for layout in layouts:
            try:
                yield layout_record(row, where, layout, row_key(where, stem))
            except RowError as err:
                yield error_row(where, f"{err} (task {layout.task})" if layout.per_question else str(err), row)
