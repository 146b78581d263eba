"""The output files of a ``prepare`` run on Ray, written by Ray tasks on the driver's node (:func:`mydecide.data.ray.
driver.write_files`): each split as ``outputs.write_split`` lays it out, ``rejects.jsonl`` and ``near_pairs.jsonl``,
each fetched from the object store one block's lines at a time, counted and hashed as it is written."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mydecide.config import DataRecipe
from mydecide.data.outputs import write_parquet
from mydecide.io import sha256_file
from mydecide.manifest import SPLIT_FILES, split_dir


def write_split(
    out: str, name: str, recipe: DataRecipe, rows: int, refs: list[list[Any]], mode: int
) -> dict[str, dict[str, Any]]:
    """One split, as ``outputs.write_split`` lays it out: ``train.jsonl``, or parts of ``rows_per_file``;
    ``refs`` (wrapped in a list, so Ray passes the references, not the objects) are its lines per block."""
    output = recipe.output
    folder = Path(out)
    chunks = _fetched(refs[0])
    if output.format == "jsonl" and output.rows_per_file is None:
        with Writer(folder / SPLIT_FILES[name], mode) as whole:
            for chunk in chunks:
                whole.write(chunk)
        return {SPLIT_FILES[name]: whole.entry()}
    folder = folder / split_dir(name)
    folder.mkdir(parents=True, exist_ok=True)
    size = output.rows_per_file or max(1, rows)
    table: dict[str, dict[str, Any]] = {}
    for k, lines in enumerate(_parts(chunks, size)):
        part = f"part-{k:05d}.{output.format}"
        if output.format == "jsonl":
            with Writer(folder / part, mode) as writer:
                writer.write(b"".join(lines))
            table[f"{folder.name}/{part}"] = writer.entry()
        else:
            write_parquet(folder / part, [json.loads(line) for line in lines])
            table[f"{folder.name}/{part}"] = Writer.of_file(folder / part, rows=len(lines))
    return table


def write_rejects(out: str, refs: list[list[Any]], mode: int) -> dict[str, dict[str, Any]]:
    """rejects.jsonl from its lines per block and step, in order."""
    with Writer(Path(out) / "rejects.jsonl", mode) as rejects:
        for chunk in _fetched(refs[0]):
            rejects.write(chunk)
    return {"rejects.jsonl": rejects.entry()}


def write_near_pairs(out: str, per_chunk: int, ranges: list[list[Any]], mode: int) -> dict[str, dict[str, Any]]:
    """near_pairs.jsonl, one range of ranks at a time: every block's (rank, line) of the range, sorted."""
    import ray

    with Writer(Path(out) / "near_pairs.jsonl", mode) as pairs:
        for refs in ranges:
            for chunk in _sorted_lines(per_chunk, *ray.get(refs)):
                pairs.write(chunk)
    return {"near_pairs.jsonl": pairs.entry()}


class Writer:
    """A file written through a temporary name, counting its lines and hashing it as it goes; given ``mode`` (the
    driver's: a writer task's process may have another umask)."""

    def __init__(self, path: Path, mode: int):
        self.path = path
        self.mode = mode
        self.temporary = path.with_name(f".{path.name}.tmp")
        self.digest = hashlib.sha256()
        self.lines = 0

    def __enter__(self) -> Writer:
        self.handle = open(self.temporary, "wb")  # closed in __exit__
        return self

    def write(self, data: bytes) -> None:
        self.handle.write(data)
        self.digest.update(data)
        self.lines += data.count(b"\n")

    def __exit__(self, kind: Any, *_: Any) -> None:
        self.handle.close()
        if kind is None:
            os.chmod(self.temporary, self.mode)
            os.replace(self.temporary, self.path)

    def entry(self) -> dict[str, Any]:
        return {"rows": self.lines, "sha256": self.digest.hexdigest()}

    @staticmethod
    def of_file(path: Path, rows: int | None = None) -> dict[str, Any]:
        return {"rows": rows, "sha256": sha256_file(path)}


def file_mode() -> int:
    """The mode of a new file of this process (0o666 less its umask), which the writer tasks are given: their
    processes may have another umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _fetched(refs: list[Any]) -> Iterator[Any]:
    """The objects behind ``refs``, one at a time (the previous one is released before the next is fetched)."""
    import ray

    for ref in refs:
        yield ray.get(ref)


def _parts(chunks: Iterator[bytes], size: int) -> Iterator[list[bytes]]:
    """The lines of the chunks in parts of ``size`` (one empty part when there is no line)."""
    part: list[bytes] = []
    emitted = False
    for chunk in chunks:
        for line in chunk.split(b"\n")[:-1]:
            part.append(line + b"\n")
            if len(part) == size:
                yield part
                part, emitted = [], True
    if part or not emitted:
        yield part


def _sorted_lines(per_chunk: int, *shares: list[tuple[int, bytes]]) -> Iterator[bytes]:
    """One range of near_pairs.jsonl: its (rank, line) from every block, in rank order, ``per_chunk`` lines at a
    time."""
    lines = sorted(line for share in shares for line in share)
    for a in range(0, len(lines), per_chunk):
        yield b"".join(line for _rank, line in lines[a : a + per_chunk])
