"""What ``prepare`` writes: the split files, rejects.jsonl, near_pairs.jsonl, the resolved recipe and the manifest
(its account of every step, with the conservation law checked before anything is written)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mydecide.config import DataRecipe, OutputConfig, dump_recipe
from mydecide.data import dedup
from mydecide.data.ledger import Ledger, Row
from mydecide.errors import UserError
from mydecide.io import atomic_write_text, foreign_entries, holds, provenance, staged_directory
from mydecide.jsonl import json_line, write_jsonl
from mydecide.manifest import MANIFEST, SPLIT_FILES, listed_outputs, read_manifest, split_dir, write_manifest

STATE_LENGTH_BINS = (64, 128, 256, 512, 1024, 2048, 4096)


def distributions(rows: Sequence[Row]) -> dict[str, Any]:
    """Type, language, task and option-count counts and the state-length profile (characters) of a split."""
    lengths = sorted(len(dedup.state_text(row.record.state)) for row in rows)
    bins: Counter[str] = Counter()
    for n in lengths:
        bins[next((f"<={b}" for b in STATE_LENGTH_BINS if n <= b), f">{STATE_LENGTH_BINS[-1]}")] += 1

    def quantile(q: float) -> int | None:
        return lengths[min(len(lengths) - 1, int(q * len(lengths)))] if lengths else None

    return {
        "rows": len(rows),
        "type": dict(sorted(Counter(row.record.question.type for row in rows).items())),
        "lang": dict(sorted(Counter(row.record.lang for row in rows).items())),
        "task": dict(sorted(Counter(row.record.task for row in rows).items())),
        "option_count": {str(k): n for k, n in sorted(Counter(row.record.question.k for row in rows).items())},
        "state_chars": {
            "min": lengths[0] if lengths else None,
            "median": quantile(0.5),
            "p90": quantile(0.9),
            "max": lengths[-1] if lengths else None,
            "histogram": {
                b: bins[b] for b in [f"<={x}" for x in STATE_LENGTH_BINS] + [f">{STATE_LENGTH_BINS[-1]}"] if bins[b]
            },
        },
    }


def build_manifest(recipe: DataRecipe, ledger: Ledger, splits: dict[str, list[Row]]) -> dict[str, Any]:
    kept = sum(len(part) for part in splits.values()) - ledger.augmented
    return {
        "conservation": {
            "input": ledger.rows_read + ledger.exploded_extra,
            "rows_read": ledger.rows_read,
            "exploded_extra": ledger.exploded_extra,
            "kept": kept,
            "rejected": ledger.rejected,
            "removed": ledger.removed,
            "augmented_copies": ledger.augmented,
            "law": "input = kept + rejected + removed (augmented copies are extra rows of train)",
        },
        "steps": ledger.steps,
        "splits": {
            name: distributions(part)
            for name, part in splits.items()
            if name != "test" or recipe.split.test_fraction > 0
        },
        "recipe": recipe.model_dump(mode="json"),
        "provenance": provenance(),
        "outputs": {},
    }


def check_conservation(manifest: dict[str, Any], ledger: Ledger) -> None:
    """Input rows = kept + rejected + removed, and every rejected or removed row is in rejects.jsonl."""
    c = manifest["conservation"]
    if c["input"] != c["kept"] + c["rejected"] + c["removed"]:
        raise RuntimeError(
            f"row conservation broken: input {c['input']} != kept {c['kept']} + rejected "
            f"{c['rejected']} + removed {c['removed']}"
        )
    if len(ledger.dropped) != c["rejected"] + c["removed"]:
        raise RuntimeError(
            f"rejects.jsonl would hold {len(ledger.dropped)} rows, not "
            f"{c['rejected']} rejected + {c['removed']} removed"
        )


def check_output_dir(out: Path, recipe: DataRecipe) -> None:
    """Refuse, before any work, an ``out`` that prepare would replace but did not write (ValueError, one line):

    * the working directory or a directory above it;
    * a directory that holds files but no readable manifest.json of an earlier prepare (a user's own
      ``train.jsonl`` is not an output to replace);
    * one that holds a file or folder, at any depth, that its manifest does not list (checked again when the
      outputs are swapped in): a user's ``test/`` or ``train/NOTES.md`` stays theirs;
    * one that holds a source or a ``decontaminate_against`` file of the recipe."""
    target = Path(os.path.realpath(out))
    if holds(out, Path.cwd()):
        raise UserError(f"{out}: is the working directory or above it, which prepare would replace; choose --out")
    inputs = [("sources", i, spec.path) for i, spec in enumerate(recipe.sources)]
    for i, entry in enumerate(recipe.decontaminate_against):
        inputs.append(("decontaminate_against", i, entry if isinstance(entry, str) else entry.path))
    for section, i, path in inputs:
        if path is None:
            continue
        if holds(out, path):
            raise UserError(
                f"{section}[{i}]: {path} is inside --out {out}, which prepare replaces whole; move it out or choose "
                "another --out"
            )
    if not target.is_dir():
        return  # absent (made new) or not a directory (staged_directory says so)
    present = foreign_entries(target)
    if not present:
        return
    try:
        earlier = read_manifest(target)
    except ValueError:
        raise UserError(
            f"{target / MANIFEST}: unreadable, so prepare cannot tell its own files from yours; remove it or choose "
            "an empty or new output directory"
        ) from None
    if earlier is None or "conservation" not in earlier:
        raise UserError(
            f"{out}: holds {', '.join(present[:5])} but no manifest.json of an earlier prepare: these are not its "
            "outputs to replace; choose an empty or new output directory"
        )
    foreign = foreign_entries(target, earlier_outputs(target))
    if foreign:
        raise UserError(
            f"{out}: holds {', '.join(foreign[:5])}, which this command did not write; choose an empty or new "
            "output directory"
        )


def write_outputs(
    out: Path, splits: dict[str, list[Row]], ledger: Ledger, manifest: dict[str, Any], recipe: DataRecipe
) -> None:
    """Write every output into a new directory beside ``out`` that then replaces ``out`` whole, so an interrupted
    re-run leaves the previous outputs or the new ones, never a mix; readers check files against the manifest.
    ``out`` is checked again (:func:`check_output_dir`): it may have changed while prepare ran."""
    check_output_dir(out, recipe)
    with staged_directory(out, earlier_outputs(out)) as staging:
        write_files(staging, splits, ledger, manifest, recipe)


def earlier_outputs(out: Path) -> list[str]:
    """What prepare may replace in ``out``: the files an earlier run's manifest lists (``train/part-00000.jsonl``
    included) and the manifest itself; nothing when it is unreadable, since it then vouches for nothing."""
    try:
        outputs = listed_outputs(out)
    except ValueError:
        return []
    return [MANIFEST, *outputs] if outputs else []


def write_files(
    out: Path, splits: dict[str, list[Row]], ledger: Ledger, manifest: dict[str, Any], recipe: DataRecipe
) -> None:
    """Each file is written atomically; the manifest (with every output's sha256) comes last."""
    out.mkdir(parents=True, exist_ok=True)
    written = ["train", "dev", "heldout"] + (["test"] if recipe.split.test_fraction > 0 else [])
    if "test" not in written:
        (out / SPLIT_FILES["test"]).unlink(missing_ok=True)  # a stale one from an earlier run would mislead
    files: list[str] = []
    for name in written:
        files += write_split(out, name, [row.record.to_json() for row in splits[name]], recipe.output)
    write_jsonl(out / "rejects.jsonl", ledger.dropped)
    write_jsonl(out / "near_pairs.jsonl", ledger.near_pairs)
    atomic_write_text(out / "recipe.yaml", dump_recipe(recipe))
    write_manifest(out, manifest, [*files, "rejects.jsonl", "near_pairs.jsonl", "recipe.yaml"])


def write_split(out: Path, split: str, records: list[dict[str, Any]], output: OutputConfig) -> list[str]:
    """Write one split as ``output`` says and return the names written (relative to ``out``): ``train.jsonl``, or
    the part files ``train/part-00000.jsonl`` / ``.parquet`` of at most ``rows_per_file`` records each (one part
    when it is None; an empty split still gets one, empty, part so that readers find the split)."""
    if output.format == "jsonl" and output.rows_per_file is None:
        write_jsonl(out / SPLIT_FILES[split], records)
        return [SPLIT_FILES[split]]
    folder = out / split_dir(split)
    folder.mkdir(parents=True, exist_ok=True)
    size = output.rows_per_file or max(1, len(records))
    names = []
    for k, start in enumerate(range(0, max(1, len(records)), size)):
        name = f"part-{k:05d}.{output.format}"
        chunk = records[start : start + size]
        if output.format == "jsonl":
            write_jsonl(folder / name, chunk)
        else:
            write_parquet(folder / name, chunk)
        names.append(f"{folder.name}/{name}")
    return names


def write_parquet(path: Path, records: list[dict[str, Any]]) -> None:
    """Records as one Parquet file (temp file + rename): the columns id, task, type and lang for filtering, and
    ``record``, each record's JSON text (states and questions vary in shape, so they stay JSON)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "id": pa.array([r["id"] for r in records], pa.string()),
            "task": pa.array([r["task"] for r in records], pa.string()),
            "type": pa.array([r["question"]["type"] for r in records], pa.string()),
            "lang": pa.array([r.get("lang") for r in records], pa.string()),
            "record": pa.array([json_line(r) for r in records], pa.string()),
        }
    )
    temporary = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, temporary)
    os.replace(temporary, path)
