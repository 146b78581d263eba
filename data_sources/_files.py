"""Shared reading code for the converters (not a source): open a file, walk its rows with their locations.

A row comes out as ``(where, row, error)``: ``where`` is ``"<file name>:<n>"`` (the 1-based first line of the
row in text files, the 0-based row index in Parquet files and Hugging Face splits); ``row`` is the parsed row
(a dict) or, when ``error`` is set, the raw text that could not be parsed.
"""

from __future__ import annotations

import csv
import glob
import importlib.util
import json
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from mydecide import jsonl
from mydecide.jsonl import COMPRESSIONS, open_text, printable, text_problem

SAMPLES = Path(__file__).resolve().parent / "samples"

Row = tuple[str, Any, str | None]


GLOB_CHARS = frozenset("*?[")


def existing(path: str | Path) -> Path:
    """``path`` as a Path, or FileNotFoundError naming it; a glob pattern must match at least one file."""
    p = Path(path)
    if GLOB_CHARS & set(str(p)):
        if not parts_of(p):
            raise FileNotFoundError(f"{p}: no file matches this pattern")
        return p
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or directory")
    return p


def parts_of(path: str | Path, suffixes: tuple[str, ...] = ()) -> list[Path]:
    """The files a source path stands for, in name order: the file itself; the files of a directory (a partitioned
    data set as Spark, Ray or ``mydecide prepare`` write one: names starting with ``_`` or ``.``, such as
    ``_SUCCESS``, are skipped); or the files a glob pattern (``shards/part-*.parquet``) matches. With ``suffixes``
    (format suffixes without compression, e.g. ``(".jsonl",)``), any other file of the directory or pattern is an
    error naming it."""
    p = Path(path)
    if GLOB_CHARS & set(str(p)):
        found = sorted(Path(x) for x in glob.glob(str(p)))
    elif p.is_dir():
        found = sorted(p.iterdir())
    else:
        return [p]
    parts = [x for x in found if x.is_file() and not x.name.startswith(("_", "."))]
    other = [x for x in parts if suffixes and base_suffix(x) not in suffixes]
    if other:  # never skipped silently: a stray file is a mistake in the data set, or in the path
        raise ValueError(f"{other[0]}: not a {' / '.join(suffixes)} file, among the part files of {p}")
    return parts


def file_stem(path: str | Path) -> str:
    """The file name without any suffix: ``train.jsonl.gz`` → ``train`` (used in ids and task names)."""
    return Path(path).name.split(".", 1)[0]


def package_file(package: str, relative: str) -> Path | None:
    """A file inside an installed package, found without importing it (None when either is absent)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    return path if path.exists() else None


def row_key(where: str, stem: str) -> str:
    """The generated id's tail for the row at ``where`` (``file:n``) of the source named ``stem``: ``stem-n`` for a
    single file, ``stem-part-n`` for a part file of a directory or pattern, whose row numbers restart in each part
    (without the part the ids of a partitioned source would repeat)."""
    file, number = where.rsplit(":", 1)
    part = file_stem(file)
    return f"{stem}-{number}" if part == stem else f"{stem}-{part}-{number}"


def base_suffix(path: str | Path) -> str:
    """The format suffix of ``path`` without a compression suffix: ``train.csv.bz2`` → ``.csv``."""
    p = Path(path)
    if p.suffix in COMPRESSIONS:
        p = p.with_suffix("")
    return p.suffix.lower()


def error_row(where: str, reason: str, raw: Any) -> dict[str, Any]:
    """The dict a converter yields for a row it cannot convert (counted and written to rejects.jsonl)."""
    return {"_where": where, "_error": reason, "raw": json_safe(raw)}


def json_safe(value: Any) -> Any:
    """``value`` made JSON-serialisable (numpy scalars, dates and bytes become plain values or strings)."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if hasattr(value, "tolist"):  # numpy scalars and arrays from pandas / pyarrow
        return json_safe(value.tolist())
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _starts_with_bracket(path: str | Path) -> bool:
    with open_text(path) as handle:
        return handle.read(64).lstrip().startswith("[")


def iter_jsonl(path: str | Path) -> Iterator[Row]:
    """JSON Lines (also ``.json`` files with one object per line, as OCNLI's) through the one strict reader
    (``mydecide.jsonl``); a line that is not an object is an error row.

    A ``.json`` file that starts with ``[`` is read as one JSON array (``where`` = file:index, 0-based).
    A directory or a glob pattern reads its ``.jsonl`` / ``.ndjson`` / ``.json`` files in name order
    (:func:`parts_of`); ``where`` then names the part file.
    """
    parts = parts_of(path, (".jsonl", ".ndjson", ".json"))
    if not parts:
        raise FileNotFoundError(f"{path}: holds no .jsonl, .ndjson or .json files")
    for part in parts:
        name = part.name
        if base_suffix(part) == ".json" and _starts_with_bracket(part):
            yield from _json_array(part, name)
            continue
        for where, obj, error in jsonl.iter_jsonl(part):
            if error is None and not isinstance(obj, dict):
                error = f"line is a JSON {type(obj).__name__}, not an object"
            yield where, obj, error


def _json_array(path: str | Path, name: str) -> Iterator[Row]:
    with open_text(path) as handle:
        text = handle.read()
    problem = jsonl.text_problem(text)
    if problem is not None:
        raise ValueError(f"{path}: {problem}")
    try:
        items = jsonl.loads_strict(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: invalid JSON array ({err.msg} at line {err.lineno})") from None
    except (jsonl.StrictJSONError, RecursionError) as err:
        raise ValueError(f"{path}: invalid JSON array ({err or 'nested too deep to read'})") from None
    for index, item in enumerate(items):
        error = None if isinstance(item, dict) else f"item is a JSON {type(item).__name__}, not an object"
        yield f"{name}:{index}", item, error


def iter_csv(path: str | Path, *, delimiter: str | None = None) -> Iterator[Row]:
    """CSV / TSV rows as dicts keyed by the header; ``where`` is the first line of the row (quoted fields
    may span lines). Blank lines are skipped; a row with fewer fields than the header gets ``None`` for the
    missing columns, a row with more fields is an error. Quotes are read strictly: a quote that does not close
    where its field ends makes that row (all the lines it ran over) an error row, never part of another row."""
    name = Path(path).name
    if delimiter is None:
        delimiter = "\t" if base_suffix(path) == ".tsv" else ","
    csv.field_size_limit(1 << 30)
    with open_text(path) as handle:
        reader = csv.reader(handle, delimiter=delimiter, strict=True)
        try:
            header = next(reader, None)
        except csv.Error as err:
            raise ValueError(f"{path}:{reader.line_num}: unreadable CSV header ({err})") from None
        if header is None:
            return
        check_header(path, header)
        repeated = sorted({column for column in header if header.count(column) > 1})
        if repeated:  # the last one would win, silently
            raise ValueError(f"{path}:1: the header names column(s) {repeated} more than once; rename them")
        end = reader.line_num
        while True:
            start = end + 1
            try:
                fields = next(reader)
            except StopIteration:
                return
            except csv.Error as err:
                end = reader.line_num
                yield (
                    f"{name}:{start}",
                    f"lines {start}-{end}",
                    f"unreadable CSV row, lines {start}-{end} ({err}): a quote that never closes, or text after "
                    "a closing quote",
                )
                continue
            end = reader.line_num
            if not fields:
                continue
            where = f"{name}:{start}"
            problem = next(filter(None, map(text_problem, fields)), None)
            if problem is not None:
                yield where, [printable(f) for f in fields], problem
            elif len(fields) > len(header):
                yield where, fields, f"row has {len(fields)} fields, the header has {len(header)}"
            else:
                padded: list[str | None] = [*fields, *[None] * (len(header) - len(fields))]
                yield where, dict(zip(header, padded, strict=True)), None


def csv_columns(path: str | Path, *, delimiter: str | None = None) -> list[str]:
    """The header of a CSV / TSV file."""
    if delimiter is None:
        delimiter = "\t" if base_suffix(path) == ".tsv" else ","
    with open_text(path) as handle:
        header = next(csv.reader(handle, delimiter=delimiter), [])
    check_header(path, header)
    return header


def check_header(path: str | Path, header: list[str]) -> None:
    """A header whose bytes are not UTF-8 names no column the recipe can name: say so, with the likely cause."""
    problem = next(filter(None, map(text_problem, header)), None)
    if problem is not None:
        raise ValueError(
            f"{path}:1: the header has {problem}: convert the file from its encoding (Latin-1? "
            "Windows-1252?), e.g. with iconv"
        )


def iter_parquet(path: str | Path) -> Iterator[Row]:
    """Parquet rows as dicts, streamed batch by batch; ``where`` is ``part file:row`` (0-based row index in that
    file). A directory or a glob pattern reads its ``.parquet`` files in name order (:func:`parts_of`)."""
    import pyarrow.parquet as pq

    parts = parts_of(existing(path), (".parquet",))
    if not parts:
        raise FileNotFoundError(f"{path}: holds no .parquet files")
    for part in parts:
        try:
            table = pq.ParquetFile(part)
        except (OSError, ValueError) as err:  # pyarrow raises ArrowInvalid (a ValueError) on non-Parquet files
            raise ValueError(f"{part}: unreadable Parquet file ({err})") from None
        index = 0
        batches = table.iter_batches(batch_size=4096)
        while True:
            try:
                batch = next(batches, None)
            except (OSError, ValueError) as err:  # a damaged page: pyarrow's OSError or ArrowInvalid
                raise ValueError(f"{part}: unreadable Parquet file after row {index} ({err})") from None
            if batch is None:
                break
            for row in batch.to_pylist():
                yield f"{part.name}:{index}", row, None
                index += 1


def parquet_columns(path: str | Path) -> list[str]:
    import pyarrow.parquet as pq

    parts = parts_of(existing(path), (".parquet",))
    if not parts:
        raise FileNotFoundError(f"{path}: holds no .parquet files")
    try:
        return list(pq.ParquetFile(parts[0]).schema_arrow.names)
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: unreadable Parquet file ({err})") from None


def iter_rows(path: str | Path) -> Iterator[Row]:
    """Rows of a CSV / TSV / JSON Lines / Parquet file, chosen by its suffix (compressed text files too); a directory
    or a glob pattern of such files (:func:`parts_of`) by the suffix of its first file."""
    parts = parts_of(existing(path))
    if not parts:
        raise FileNotFoundError(f"{path}: holds no files")
    suffix = base_suffix(parts[0])
    if suffix in (".csv", ".tsv") and len(parts) > 1:
        raise ValueError(f"{path}: a CSV / TSV source is one file (a directory or pattern works for JSONL and Parquet)")
    if suffix in (".csv", ".tsv"):
        path = parts[0]
    if suffix in (".csv", ".tsv"):
        return iter_csv(path)
    if suffix in (".jsonl", ".ndjson", ".json"):
        return iter_jsonl(path)
    if suffix == ".parquet":
        return iter_parquet(path)
    raise ValueError(f"{path}: unknown file format {suffix!r} (expected .csv, .tsv, .jsonl, .json or .parquet)")


def load_hub(name: str, split: str, config: str | None = None) -> Any:
    """A Hugging Face dataset split (needs the network or a filled cache)."""
    from datasets import load_dataset

    return load_dataset(name, config, split=split) if config else load_dataset(name, split=split)


def iter_hub(dataset: Any, name: str, split: str) -> Iterator[Row]:
    """Rows of a loaded Hugging Face split; ``where`` is ``name/split:index`` (0-based)."""
    for index, row in enumerate(dataset):
        yield f"{name}/{split}:{index}", dict(row), None


def capped(rows: Iterator[dict[str, Any]], limit: int | None) -> Iterator[dict[str, Any]]:
    """At most ``limit`` rows (error rows included); ``None`` means all."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a non-negative integer or None, got {limit!r}")
    return islice(rows, limit)
