"""What ``prepare`` writes: the split files, rejects.jsonl, near_pairs.jsonl, the resolved recipe and the manifest
(its account of every step, with the conservation law checked before anything is written)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mydecide.config import DataRecipe, dump_recipe
from mydecide.data import dedup
from mydecide.data.ledger import Ledger, Row
from mydecide.io import atomic_write_text, provenance, staged_directory
from mydecide.jsonl import write_jsonl
from mydecide.manifest import MANIFEST, SPLIT_FILES, listed_outputs, write_manifest

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


# what prepare writes; an existing --out may hold only these (anything else is the user's and stays untouched)
OUTPUT_FILES = (
    *SPLIT_FILES.values(),
    "rejects.jsonl",
    "near_pairs.jsonl",
    "recipe.yaml",
    MANIFEST,
)


def write_outputs(
    out: Path, splits: dict[str, list[Row]], ledger: Ledger, manifest: dict[str, Any], recipe: DataRecipe
) -> None:
    """Write every output into a new directory beside ``out`` that then replaces ``out`` whole, so an interrupted
    re-run leaves the previous outputs or the new ones, never a mix; readers check files against the manifest."""
    with staged_directory(out, {*OUTPUT_FILES, *earlier_outputs(out)}) as staging:
        write_files(staging, splits, ledger, manifest, recipe)


def earlier_outputs(out: Path) -> list[str]:
    """The files that an earlier run's manifest in ``out`` lists (a newer version may have written more)."""
    try:
        outputs = listed_outputs(out)
    except ValueError:  # an unreadable manifest vouches for nothing: only prepare's own names may be replaced
        return []
    return [name for name in outputs if "/" not in name]


def write_files(
    out: Path, splits: dict[str, list[Row]], ledger: Ledger, manifest: dict[str, Any], recipe: DataRecipe
) -> None:
    """Each file is written atomically; the manifest (with every output's sha256) comes last."""
    out.mkdir(parents=True, exist_ok=True)
    written = ["train", "dev", "heldout"] + (["test"] if recipe.split.test_fraction > 0 else [])
    files = {SPLIT_FILES[name]: splits[name] for name in written}
    if "test" not in written:
        (out / SPLIT_FILES["test"]).unlink(missing_ok=True)  # a stale one from an earlier run would mislead
    for name, rows in files.items():
        write_jsonl(out / name, (row.record.to_json() for row in rows))
    write_jsonl(out / "rejects.jsonl", ledger.dropped)
    write_jsonl(out / "near_pairs.jsonl", ledger.near_pairs)
    atomic_write_text(out / "recipe.yaml", dump_recipe(recipe))
    write_manifest(out, manifest, [*files, "rejects.jsonl", "near_pairs.jsonl", "recipe.yaml"])
