"""Any dataset ``datasets.load_dataset`` reads (hub name, csv / json / parquet files or globs), columns mapped.

``path`` is one of: a Hugging Face dataset name (``owner/name``; ``config`` and ``split`` pick the part; offline,
a dataset already in the local ``datasets`` cache), a local data file (``.csv``, ``.tsv``, ``.json``, ``.jsonl``,
``.parquet``, also ``.gz`` / ``.bz2`` compressed text), a glob of such files (``data/*.parquet``; each file is read
on its own, in name order, so a row's location names its file), a directory written by ``save_to_disk``, or a
directory of data files in the hub layout. ``streaming: true`` reads row by row without building the arrow cache
(for large data); ``cache_dir`` overrides the ``datasets`` cache; ``revision`` pins a hub dataset.

``fields`` maps record fields to columns: ``state`` (a column, or a list of columns: the state is then a JSON
object ``{column: value}``), ``answer`` or ``target`` (a soft target: a number, a map, or its JSON text), ``id``,
``task``, ``lang``, ``type``, ``instructions``, ``criteria`` (per-row questions) and ``meta`` (a list of columns
carried in ``meta``). Default ``{state: text, answer: label}``. What no column gives comes from the options
``type``, ``instructions``, ``criteria``, ``task`` (default: the dataset's or file's name) and ``lang`` (``en``).
A ``ClassLabel`` answer column is read by its names (and gives a choice its criteria when none are set).

Several label columns of one row: ``questions``, a list of ``{task, type, column, instructions, options / levels}``
as for the csv source, in place of ``fields.answer`` / ``target`` / ``task`` and the question options: one record per
question, sharing the row's state, with the id ``<row id>:<task>``.

A column named in ``fields`` that the dataset lacks is a recipe error naming the source and the columns it has;
a row whose value does not fit is an error row (counted, written to rejects.jsonl) naming the column, with
``_where`` = ``<file or name/split>:<0-based row>``.
"""

from __future__ import annotations

import glob
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_sources._class_labels import class_names, named
from data_sources._columns import ColumnLayout, RowError, make_layout, parse_answer, question_layouts
from data_sources._files import base_suffix, capped, error_row, file_stem, json_safe

FIELDS = ("state", "answer", "target", "id", "task", "lang", "type", "instructions", "criteria", "meta")
QUESTION_FIELDS = ("type", "instructions", "criteria")
BUILDERS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".ndjson": "json", ".parquet": "parquet"}
GLOB_CHARS = "*?["


class SourceError(ValueError):
    """The recipe's options or the dataset do not fit together (names the source and what is wrong)."""


@dataclass(frozen=True)
class Part:
    """One table to read: ``load`` builds it, ``label`` starts each row's ``_where``, ``name`` is the default task."""

    label: str
    name: str
    kind: str  # "hub", "files" or "disk"
    target: str
    builder: str | None = None


@dataclass(frozen=True)
class FieldMap:
    """The recipe's field mapping, checked: which column each record field comes from, or a fixed value."""

    source: str
    columns: dict[str, Any]
    fixed_question: bool
    layout: ColumnLayout | None  # when the question is the same for every row: the csv source's answer parser
    type: str | None
    instructions: str | None
    criteria: Any
    task: str | None
    lang: str
    questions: tuple[ColumnLayout, ...] = ()  # the ``questions`` option: one record per entry


def convert(
    path: str | None = None,
    *,
    limit: int | None = None,
    seed: int = 13,
    fields: dict[str, Any] | None = None,
    type: str | None = None,
    instructions: str | None = None,
    criteria: dict[str, str] | list[str] | None = None,
    task: str | None = None,
    lang: str = "en",
    split: str = "train",
    config: str | None = None,
    revision: str | None = None,
    streaming: bool = False,
    cache_dir: str | None = None,
    questions: list[dict[str, Any]] | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield one record (or error row) per row and question of the dataset at ``path`` (``seed`` is unused)."""
    if path is None:
        raise SourceError("the datasets source needs a path: a hub dataset name, a data file, a glob or a directory")
    source = f"datasets source {path!r}"
    if questions is not None:
        mapping = question_mapping(source, fields, questions, type, instructions, criteria, task, lang)
    else:
        mapping = check_mapping(source, fields, type, instructions, criteria, task, lang)
    parts = find_parts(path, split)
    options = {"split": split, "config": config, "revision": revision, "streaming": streaming, "cache_dir": cache_dir}
    return capped(_records(source, parts, mapping, options), limit)


def check_mapping(
    source: str,
    fields: dict[str, Any] | None,
    qtype: str | None,
    instructions: str | None,
    criteria: Any,
    task: str | None,
    lang: str,
) -> FieldMap:
    """The field mapping with its defaults; SourceError naming the option when it cannot make records."""
    given = dict(fields or {})
    unknown = sorted(set(given) - set(FIELDS))
    if unknown:
        raise SourceError(f"{source}: fields {unknown} are not record fields; they are {list(FIELDS)}")
    columns = {"state": "text", **({} if "target" in given else {"answer": "label"}), **given}
    for key, column in columns.items():
        many = key in ("state", "meta")
        ok = (isinstance(column, str) and column) or (
            many and isinstance(column, list) and column and all(isinstance(c, str) and c for c in column)
        )
        if not ok:
            what = "a column name or a list of them" if many else "a column name"
            raise SourceError(f"{source}: fields.{key} must be {what}, got {column!r}")
    if "answer" in columns and "target" in columns:
        raise SourceError(f"{source}: fields.answer and fields.target both given; a record has one gold")
    if isinstance(columns.get("meta"), str):
        columns["meta"] = [columns["meta"]]
    per_row = [k for k in QUESTION_FIELDS if k in columns]
    if "type" not in columns and qtype is None:
        raise SourceError(f"{source}: option 'type' (choice, noul, score or set) or fields.type is needed")
    if "instructions" not in columns and not (isinstance(instructions, str) and instructions.strip()):
        raise SourceError(f"{source}: option 'instructions' (a non-empty string) or fields.instructions is needed")
    layout = None
    if not per_row and "answer" in columns and not (qtype == "choice" and criteria is None):
        layout = make_layout(  # the question is the same for every row: answers are read as the csv source reads them
            source=source,
            path="",
            type=str(qtype),
            instructions=instructions,
            criteria=criteria,
            state_column=columns["state"],
            answer_column=columns["answer"],
            task="-",
            id_column=None,
            lang=lang,
        )
    return FieldMap(
        source=source,
        columns=columns,
        fixed_question=not per_row,
        layout=layout,
        type=qtype,
        instructions=instructions,
        criteria=criteria,
        task=task,
        lang=lang,
    )


def question_mapping(
    source: str,
    fields: dict[str, Any] | None,
    questions: Any,
    qtype: str | None,
    instructions: str | None,
    criteria: Any,
    task: str | None,
    lang: str,
) -> FieldMap:
    """The mapping of a source with ``questions``: ``fields`` give the state, id, lang and meta only."""
    per_question = sorted(set(fields or {}) & {"answer", "target", "task", "type", "instructions", "criteria"})
    options = [k for k, v in {"type": qtype, "criteria": criteria, "task": task}.items() if v is not None]
    if per_question or options:
        given = [f"fields.{k}" for k in per_question] + options
        raise SourceError(f"{source}: {given} belong in each entry of 'questions', not beside it")
    base = check_mapping(source, {"answer": "-", **(fields or {})}, "noul", instructions or "-", None, None, lang)
    columns = {k: v for k, v in base.columns.items() if k != "answer"}
    layouts = question_layouts(
        source=source,
        path="",
        questions=questions,
        instructions=instructions,
        state_column=columns["state"],
        id_column=None,
        lang=lang,
    )
    return FieldMap(source, columns, True, None, None, instructions, None, None, lang, tuple(layouts))


def find_parts(path: str, split: str) -> list[Part]:
    """What ``path`` names: files (one part each), a save_to_disk or data directory, or a hub dataset."""
    if any(c in path for c in GLOB_CHARS):
        matches = sorted(glob.glob(path, recursive=True))
        files = [m for m in matches if Path(m).is_file()]
        if not files:
            raise FileNotFoundError(f"{path}: no file matches")
        folder = Path(path.split("*", 1)[0].split("?", 1)[0].split("[", 1)[0] or ".").resolve()
        return [_file_part(f, name=(folder if folder.is_dir() else folder.parent).name) for f in files]
    p = Path(path)
    if p.is_file():
        return [_file_part(path)]
    if p.is_dir():
        saved = (p / "dataset_dict.json").is_file() or (p / "state.json").is_file()
        return [Part(f"{p.name}/{split}", p.name, "disk" if saved else "files", path)]
    looks_local = path.startswith((".", "/", "~")) or path.count("/") > 1 or Path(path).suffix.lower() in BUILDERS
    if looks_local or not path.strip():
        raise FileNotFoundError(f"{path}: no such file or directory")
    return [Part(f"{path}/{split}", path.rsplit("/", 1)[-1], "hub", path)]


def _file_part(path: str, name: str | None = None) -> Part:
    """One data file; ``name`` (the default task) is the file's stem, or for a glob the folder it starts in."""
    suffix = base_suffix(path)
    if suffix not in BUILDERS:
        raise SourceError(f"{path}: unknown file format {suffix!r} (expected {', '.join(sorted(BUILDERS))})")
    return Part(Path(path).name, name or file_stem(path), "files", path, BUILDERS[suffix])


def load_part(part: Part, options: Mapping[str, Any]) -> Any:
    """The rows of one part as a ``datasets`` Dataset or IterableDataset (loading errors name the path)."""
    import datasets

    datasets.disable_progress_bars()
    split, streaming, cache_dir = options["split"], options["streaming"], options["cache_dir"]
    if part.kind == "disk":
        loaded = datasets.load_from_disk(part.target)
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise SourceError(f"{part.target}: no split {split!r}; it has {sorted(loaded)}")
            loaded = loaded[split]
        return loaded.to_iterable_dataset() if streaming else loaded
    if part.builder is not None:  # one local file
        extra = {"delimiter": "\t"} if base_suffix(part.target) == ".tsv" else {}
        return datasets.load_dataset(
            part.builder,
            data_files=str(part.target),
            split="train",
            streaming=streaming,
            cache_dir=cache_dir,
            **extra,
        )
    return datasets.load_dataset(
        part.target,
        options["config"],
        split=split,
        revision=options["revision"],
        streaming=streaming,
        cache_dir=cache_dir,
    )


def _records(source: str, parts: list[Part], mapping: FieldMap, options: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for part in parts:
        try:
            table = load_part(part, options)
        except (FileNotFoundError, SourceError):
            raise
        except Exception as err:  # datasets' many error types (offline hub, unknown split, unreadable file)
            raise SourceError(f"{source}: cannot load {part.target!r} ({_short(err)})") from None
        reader = RowReader(source, part, mapping, getattr(table, "features", None))
        rows = iter(table)
        index = 0
        while True:
            try:
                row = next(rows)
            except StopIteration:
                break
            except Exception as err:  # a file that turns out unreadable part way (streaming, bad JSON line)
                raise SourceError(f"{source}: {part.label}: unreadable after row {index - 1} ({_short(err)})") from None
            yield from reader.records(dict(row), index)
            index += 1


def _short(err: Exception) -> str:
    return " ".join(str(err).split())[:300] or type(err).__name__


class RowReader:
    """Turns the rows of one table into records, with the table's ClassLabel names applied."""

    def __init__(self, source: str, part: Part, mapping: FieldMap, features: Any):
        self.source, self.part, self.m = source, part, mapping
        self.names = class_names(features) if features is not None else {}
        self.checked = False
        self.layout = mapping.layout
        answer = mapping.columns.get("answer")
        if mapping.fixed_question and self.layout is None and answer is not None:  # a choice without criteria
            names = self.names.get(answer)
            if not names:
                raise SourceError(
                    f"{source}: option 'criteria' is needed: the answer column {answer!r} is not a ClassLabel"
                )
            self.layout = make_layout(
                source=source,
                path="",
                type="choice",
                instructions=mapping.instructions,
                criteria=list(names),
                state_column=mapping.columns["state"],
                answer_column=answer,
                task="-",
                id_column=None,
                lang=mapping.lang,
            )
        if features is not None:
            self.check_columns(list(features))

    def check_columns(self, have: list[str]) -> None:
        wanted = [c for v in self.m.columns.values() for c in (v if isinstance(v, list) else [v])]
        wanted += [layout.answer_column for layout in self.m.questions]
        missing = [c for c in dict.fromkeys(wanted) if c not in have]
        if missing:
            raise SourceError(
                f"{self.source}: {self.part.label}: column(s) {missing} named in fields are not in the dataset; "
                f"it has {have}"
            )
        self.checked = True

    def records(self, row: dict[str, Any], index: int) -> list[dict[str, Any]]:
        """The row's record (or error row); with ``questions``, one per question, each failing on its own."""
        where = f"{self.part.label}:{index}"
        if not self.checked:  # a streamed table may not know its columns before the first row
            self.check_columns(list(row))
        if not self.m.questions:
            try:
                return [{**self._record(row, index), "_where": where}]
            except RowError as err:
                return [error_row(where, f"{err} (row {index} of {self.part.label})", row)]
        try:
            base = self._base(row, index)
        except RowError as err:
            return [error_row(where, f"{err} (row {index} of {self.part.label})", row)]
        out = []
        for layout in self.m.questions:
            try:
                answer = parse_answer(self._named_answer(row, layout.answer_column), layout)
            except RowError as err:
                out.append(error_row(where, f"{err} (task {layout.task}, row {index} of {self.part.label})", row))
                continue
            question: dict[str, Any] = {"type": layout.type, "instructions": layout.instructions}
            if layout.criteria is not None:
                question["criteria"] = layout.criteria
            rid = f"{base['id']}:{layout.task}"
            out.append(
                {**base, "id": rid, "task": layout.task, "question": question, "answer": answer, "_where": where}
            )
        return out

    def _named_answer(self, row: dict[str, Any], column: str) -> Any:
        names = self.names.get(column)
        return named(row.get(column), names, column) if names is not None else row.get(column)

    def _base(self, row: dict[str, Any], index: int) -> dict[str, Any]:
        """What every question of a row shares: its id, lang, state and meta."""
        cols = self.m.columns
        state = self._state(row)
        out: dict[str, Any] = {}
        if "id" in cols:
            out["id"] = _text(row.get(cols["id"]), cols["id"])
        else:
            out["id"] = f"{self.part.name}-{self.part.label.replace('/', '-')}-{index}"
        out["lang"] = _text(row.get(cols["lang"]), cols["lang"]) if "lang" in cols else self.m.lang
        out["state"] = state
        if "meta" in cols:
            out["meta"] = {c: json_safe(row.get(c)) for c in cols["meta"]}
        return out

    def _state(self, row: dict[str, Any]) -> Any:
        state_column = self.m.columns["state"]
        if isinstance(state_column, list):
            state: Any = {c: json_safe(row.get(c)) for c in state_column if row.get(c) not in (None, "")}
            if not state:
                raise RowError(f"columns {state_column} are all empty")
            return state
        if isinstance(row.get(state_column), (list, dict)) and row.get(state_column):
            return json_safe(row[state_column])  # a list of strings or an object: records take those as they are
        return _text(row.get(state_column), state_column)

    def _record(self, row: dict[str, Any], index: int) -> dict[str, Any]:
        cols, m = self.m.columns, self.m
        out = self._base(row, index)
        out["task"] = _text(row.get(cols["task"]), cols["task"]) if "task" in cols else (m.task or self.part.name)
        if m.fixed_question:
            question: dict[str, Any] = {"type": m.type, "instructions": m.instructions}
            criteria = m.criteria if m.criteria is not None else (self.layout.criteria if self.layout else None)
        else:
            question = {
                "type": _text(row.get(cols["type"]), cols["type"]) if "type" in cols else m.type,
                "instructions": (
                    _text(row.get(cols["instructions"]), cols["instructions"])
                    if "instructions" in cols
                    else m.instructions
                ),
            }
            criteria = _structured(row.get(cols["criteria"]), cols["criteria"]) if "criteria" in cols else m.criteria
        if criteria is not None:
            question["criteria"] = criteria
        out["question"] = question
        if "answer" in cols:
            answer = self._named_answer(row, cols["answer"])
            if self.layout is not None:
                out["answer"] = parse_answer(answer, self.layout)  # names the column when the value does not fit
            elif answer is None or answer == "":
                raise RowError(f"column {cols['answer']!r} is empty")
            else:
                out["answer"] = json_safe(answer)  # checked by the validator against this row's question
        else:
            target = _structured(row.get(cols["target"]), cols["target"])
            if target is None:
                raise RowError(f"column {cols['target']!r} is empty")
            out["target"] = target
        return out


def _text(value: Any, column: str) -> str:
    """A cell as text: a string, or a number written out; bytes, a map, a list or NaN is no text to guess at (a
    list or map state is taken as it is before this)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise RowError(f"column {column!r} is empty")
    if isinstance(value, (bytes, bytearray, dict, list, tuple)):
        kind = "bytes" if isinstance(value, (bytes, bytearray)) else "a map" if isinstance(value, dict) else "a list"
        raise RowError(f"column {column!r} holds {kind}, not text")
    if isinstance(value, float) and not math.isfinite(value):
        raise RowError(f"column {column!r} holds {value} (NaN is a missing value), not text")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, str) else str(json_safe(value))


def _structured(value: Any, column: str) -> Any:
    """A criteria / target cell: a map, list or number as it is, or JSON text read into one."""
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise RowError(f"column {column!r}: {text[:60]!r} is not JSON (a map, a list or a number)") from None
    return json_safe(value)
