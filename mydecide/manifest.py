"""``manifest.json``, the record `mydecide prepare` writes beside its outputs, and every reading of it.

Its ``outputs`` table maps each output's file name to ``{"rows": n (JSONL) or null, "sha256": hex}``; the rest
(``conservation``, ``steps``, ``splits``, ``recipe``, ``provenance``) is prepare's account of what it did. This
module is the one writer of that table and its one reader: records are checked against it (a directory that mixes
two runs is refused), calibration refuses a file it records as a training or test split, evaluation finds the
training split beside a dev file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mydecide.errors import UserError
from mydecide.io import atomic_write_json, sha256_file
from mydecide.jsonl import StrictJSONError, loads_strict

MANIFEST = "manifest.json"
SPLIT_FILES = {"train": "train.jsonl", "dev": "dev.jsonl", "test": "test.jsonl", "heldout": "heldout_tasks.jsonl"}
"""The split files prepare writes, by split name."""
PART_SUFFIXES = (".jsonl", ".parquet")
"""The part files of a partitioned split (``output.rows_per_file`` or ``output.format: parquet``): ``train/`` holds
``part-00000.jsonl`` (or ``.parquet``), ``part-00001...``, read in name order."""


def split_dir(split: str) -> str:
    """The directory name of a partitioned split: ``train``, ``dev``, ``test``, ``heldout_tasks``."""
    return SPLIT_FILES[split].removesuffix(".jsonl")


def split_path(directory: str | Path, split: str) -> Path:
    """Where a prepare output in ``directory`` holds ``split``: the file ``train.jsonl``, else the partitioned
    directory ``train/`` (the file's path when neither exists, so an error names what was expected)."""
    single, partitioned = Path(directory) / SPLIT_FILES[split], Path(directory) / split_dir(split)
    return partitioned if partitioned.is_dir() and not single.is_file() else single


def part_files(directory: str | Path) -> list[Path]:
    """The part files of a partitioned split directory, in name order (``_SUCCESS`` and hidden files skipped)."""
    return sorted(
        p
        for p in Path(directory).iterdir()
        if p.is_file() and p.suffix in PART_SUFFIXES and not p.name.startswith(("_", "."))
    )


Digests = dict[Path, str]
"""The sha256 of each file read so far, kept by a caller that reads a file more than once (train: its digest for
the run's recipe, then the check against the manifest), so that each file is hashed once."""


def file_digest(path: Path, digests: Digests | None = None) -> str:
    """The sha256 of a file, from ``digests`` when it holds it (and kept there)."""
    if digests is None:
        return sha256_file(path)
    if path not in digests:
        digests[path] = sha256_file(path)
    return digests[path]


def split_digest(path: str | Path, digests: Digests | None = None) -> str:
    """The sha256 of a split file, or of a partitioned split (over its parts' names and sha256s, in order)."""
    path = Path(path)
    if not path.is_dir():
        return file_digest(path, digests)
    lines = "".join(f"{p.name} {file_digest(p, digests)}\n" for p in part_files(path))
    return hashlib.sha256(lines.encode()).hexdigest()


def rows_in(path: str | Path) -> int | None:
    """Rows of a JSONL file (its lines) or a Parquet file (its metadata); None for other files."""
    path = Path(path)
    if path.suffix == ".jsonl":
        return path.read_bytes().count(b"\n")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(path).metadata.num_rows)
    return None


def write_manifest(out: Path, manifest: dict[str, Any], outputs: Sequence[str]) -> None:
    """Record the rows and sha256 of each file in ``outputs`` (already written in ``out``) in the manifest's
    ``outputs`` table, then write ``out/manifest.json`` atomically: last, so it vouches for what is there."""
    table = manifest.setdefault("outputs", {})
    for name in outputs:
        table[name] = {"rows": rows_in(out / name), "sha256": sha256_file(out / name)}
    atomic_write_json(out / MANIFEST, manifest)


def read_manifest(directory: str | Path) -> dict[str, Any] | None:
    """The manifest in ``directory``, or None when there is none; ValueError naming it when it is not a JSON
    object."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return None
    try:
        data = loads_strict(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, StrictJSONError) as err:
        raise UserError(f"{path}: unreadable ({err}); re-run `mydecide prepare`") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: unreadable (not a JSON object); re-run `mydecide prepare`")
    return data


def listed_outputs(directory: str | Path) -> dict[str, dict[str, Any]]:
    """The ``outputs`` table of the manifest in ``directory`` ({} when there is none)."""
    outputs = (read_manifest(directory) or {}).get("outputs")
    return outputs if isinstance(outputs, dict) else {}


def check_against_manifest(path: str | Path, digests: Digests | None = None) -> None:
    """Refuse a file that the manifest beside it records with another sha256: its directory mixes the outputs of two
    ``prepare`` runs, or the file was changed after. Files with no manifest beside them (data written by hand), or
    not listed in it, are not checked."""
    path = Path(path)
    if path.is_dir():  # a partitioned split: the manifest one level up lists its parts as "train/part-00000.jsonl"
        outputs = listed_outputs(path.parent)
        listed = {name for name in outputs if name.startswith(path.name + "/")}
        if not listed:
            return
        present = {f"{path.name}/{p.name}" for p in part_files(path)}
        if present != listed:
            odd = sorted(present ^ listed)
            raise UserError(
                f"{path}: its part files are not the ones {path.parent / MANIFEST} lists ({', '.join(odd[:3])} "
                "missing or extra); the directory mixes two prepare runs, re-run `mydecide prepare`"
            )
        return
    entry = listed_outputs(path.parent).get(path.name)
    manifest_dir = path.parent
    if entry is None and path.parent.parent != path.parent:  # a part file of a partitioned split
        entry = listed_outputs(path.parent.parent).get(f"{path.parent.name}/{path.name}")
        manifest_dir = path.parent.parent
    if not isinstance(entry, dict) or "sha256" not in entry:
        return
    if file_digest(path, digests) != entry["sha256"]:
        raise UserError(
            f"{path}: does not match the sha256 that {manifest_dir / MANIFEST} records for it (the directory mixes "
            "two prepare runs, or the file was changed after); re-run `mydecide prepare`"
        )


def recorded_as(path: str | Path, names: Sequence[str]) -> str | None:
    """Which of the outputs ``names`` the manifest beside ``path`` records with ``path``'s sha256 (a renamed copy
    of that output), or None."""
    path = Path(path)
    outputs = listed_outputs(path.parent)
    digests = {name: outputs[name].get("sha256") for name in names if isinstance(outputs.get(name), dict)}
    if not digests:
        return None
    digest = sha256_file(path)
    return next((name for name, recorded in digests.items() if recorded == digest), None)


def split_beside(paths: Sequence[str | Path], split: str) -> Path | None:
    """The ``split`` file (``train``: train.jsonl) of the prepare output that holds one of ``paths``, or None when
    there is none or when that file is the one given."""
    for path in map(Path, paths):
        candidate = split_path(path.parent, split)
        if candidate.exists() and candidate.resolve() != path.resolve():
            return candidate
    return None
