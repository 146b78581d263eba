"""Reading files of decision records: a JSONL file, a Parquet file of records, or a partitioned split directory
of such part files (``prepare``'s ``output`` layouts), each checked against the manifest beside it. The schema and
its rules are :mod:`mydecide.records`; this module walks the rows and collects the rejects."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mydecide.jsonl import StrictJSONError, iter_jsonl, loads_strict
from mydecide.manifest import Digests, check_against_manifest, part_files
from mydecide.records import Record, RecordError, parse_record

NO_RECORDS = "file holds no records"  # the rule of a file with no row at all (train says what an empty dev means)


@dataclass
class Reject:
    """A row that failed validation: where it came from, why, and the raw content (for rejects.jsonl)."""

    where: str
    reason: str
    raw: Any

    def to_json(self) -> dict[str, Any]:
        return {"where": self.where, "reason": self.reason, "raw": self.raw}


def validate(items: Iterable[tuple[str, Any]], rejects: list[Reject]) -> Iterator[Record]:
    """Yield valid records from ``(where, object)`` pairs; every invalid one is appended to ``rejects``."""
    for where, obj in items:
        try:
            yield from parse_record(obj)
        except RecordError as err:
            rejects.append(Reject(where, err.rule, obj))


def read_records(
    path: str | Path, *, strict: bool = False, digests: Digests | None = None
) -> tuple[list[Record], list[Reject]]:
    """Read a decision-record JSONL file, a Parquet file of records (column ``record``: each record's JSON, as
    ``prepare`` writes with ``output.format: parquet``), or a partitioned split directory of such part files (read in
    name order). Returns (valid records, rejects); ``strict`` raises on the first reject.

    Raises ``FileNotFoundError`` naming the path, :class:`RecordError` for an empty file, and ``ValueError`` for a
    file that the ``manifest.json`` beside it records with another sha256 (a mixed or changed prepare output);
    ``digests`` keeps the sha256s computed for that check (:data:`~mydecide.manifest.Digests`).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    check_against_manifest(path, digests)
    rejects: list[Reject] = []
    records: list[Record] = []
    for where, obj, error in iter_record_rows(path, digests):
        if error is not None:
            rejects.append(Reject(where, error, obj))
        else:
            records.extend(validate([(where, obj)], rejects))
        if strict and rejects:
            raise RecordError(rejects[0].reason, rejects[0].where)
    if not records and not rejects:
        raise RecordError(NO_RECORDS, str(path))
    return records, rejects


def iter_record_rows(path: Path, digests: Digests | None = None) -> Iterator[tuple[str, Any, str | None]]:
    """``(where, object, error)`` for every record of a JSONL file, a Parquet file or a partitioned split directory
    (``where``: ``part file:line`` for JSONL, ``part file:row`` (0-based) for Parquet)."""
    if path.is_dir():
        parts = part_files(path)
        if not parts:
            raise RecordError("holds no .jsonl or .parquet part files", str(path))
        for part in parts:
            check_against_manifest(part, digests)
            yield from iter_record_rows(part)
        return
    if path.suffix != ".parquet":
        yield from iter_jsonl(path)
        return
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
    except (OSError, ValueError) as err:
        raise RecordError(f"unreadable Parquet file ({err})", str(path)) from None
    if "record" not in table.schema_arrow.names:
        raise RecordError("a Parquet file of records needs a column 'record' (each record's JSON text)", str(path))
    index = 0
    for batch in table.iter_batches(batch_size=4096, columns=["record"]):
        for text in batch.column(0).to_pylist():
            where = f"{path.name}:{index}"
            index += 1
            try:
                yield where, loads_strict(text), None
            except (TypeError, json.JSONDecodeError, StrictJSONError) as err:
                yield where, text, f"column 'record' is not JSON text ({err})"


def load_records(path: str | Path, digests: Digests | None = None) -> list[Record]:
    """Read a file that must be entirely valid (evaluation, calibration): the first bad line is an error."""
    records, _ = read_records(path, strict=True, digests=digests)
    return records
