"""The ``prepare`` steps that remove rows: exact dedup, duplicate ids, near dedup, decontamination and the cap per
task, each counted in the ledger with why every removed row left and the row or eval item it matched. Near dedup also
keeps its removals for ``near_pairs.jsonl`` (least similar first, so a threshold can be audited).

A run on Ray (:mod:`mydecide.data.ray`) calls the same rules block by block and shares the manifest's step details
(:func:`near_step_details`, :func:`decontamination_details`), the eval index and the near-pair lines from here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from mydecide.config import DataRecipe, NearDedupConfig
from mydecide.data import split
from mydecide.data.decontaminate import EvalIndex
from mydecide.data.dedup import exact_duplicates, exact_key
from mydecide.data.inputs import eval_items
from mydecide.data.ledger import (
    Ledger,
    Row,
    decision_sketches,
    decision_words,
    decisions,
    in_out,
    progress_bar,
    release,
    shingling,
)
from mydecide.data.near_dedup import NearMatch, near_duplicates_of
from mydecide.recipe_parsing import RecipeError


# ----------------------------------------------------------------------------------------------------- steps
def exact_dedup(rows: list[Row], recipe: DataRecipe, ledger: Ledger) -> list[Row]:
    """Drop rows whose normalised key repeats an earlier row's (the first is kept)."""
    if not recipe.dedup.exact:
        return ledger.step("exact_dedup", rows, rows, [], skipped=True)
    duplicates = exact_duplicates([exact_key(row.record) for row in rows])
    conflicts = sum(rows[i].record.target != rows[k].record.target for i, k in duplicates.items())
    removed = [(rows[i], "exact duplicate", rows[k].ref()) for i, k in duplicates.items()]
    kept = [row for i, row in enumerate(rows) if i not in duplicates]
    return ledger.step("exact_dedup", rows, kept, removed, label_conflicts=conflicts)


def unique_ids(rows: list[Row], ledger: Ledger) -> list[Row]:
    """Keep the first record of each id, in source order then line order; a later one is removed, naming where the
    first is (ids are the strings records carry, so ``7`` and ``"7"`` are one id).

    It runs after exact dedup, whose keep rule is the same (the first): an exact copy is counted once, as an exact
    duplicate, and what reaches this step under one id is two different records (or, with ``dedup.exact: false``,
    copies, which an id cannot tell apart either)."""
    first: dict[str, Row] = {}
    kept, removed = [], []
    for row in rows:
        seen = first.setdefault(row.record.id, row)
        if seen is row:
            kept.append(row)
        else:
            removed.append((row, "duplicate id", seen.ref()))
    return ledger.step("duplicate_ids", rows, kept, removed)


def near_dedup(rows: list[Row], recipe: DataRecipe, ledger: Ledger, progress: bool = False) -> list[Row]:
    """Drop rows that ask the same question as an earlier kept row about a nearly identical state."""
    near = recipe.dedup.near
    if not near.enabled or not rows:
        return ledger.step("near_dedup", rows, rows, [], skipped=not near.enabled)
    found = decisions(rows)
    with progress_bar(progress, "near dedup", total=len(rows)) as bar:
        matches = near_duplicates_of(
            decision_sketches(rows, found, near),
            threshold=near.threshold,
            progress=bar.update,
            shingling=shingling(near),
            keep_slot_changes=near.keep_slot_changes,
            decisions=found,
        )
    removed = [
        (rows[i], "near duplicate", {**rows[m.kept].ref(), "similarity": round(m.similarity, 4)})
        for i, m in sorted(matches.items())
    ]
    kept = [row for i, row in enumerate(rows) if i not in matches]
    ledger.near_pairs = near_pairs(rows, matches)
    bands = Counter(similarity_band(m.similarity) for m in matches.values())
    return ledger.step("near_dedup", rows, kept, removed, **near_step_details(near, bands))


def near_step_details(near: NearDedupConfig, bands: Mapping[str, int]) -> dict[str, Any]:
    """What the manifest's near_dedup step records beside its counts: the settings, the removed rows by similarity
    band (``bands``: band → rows) and where the pairs are; the same for both prepare paths."""
    return {
        "threshold": near.threshold,
        "num_perm": near.num_perm,
        "ngram": near.ngram,
        "shingling": shingling(near).describe(),
        "keep_slot_changes": near.keep_slot_changes,
        "by_similarity": {band: bands[band] for band in SIMILARITY_BANDS if bands.get(band)},
        "pairs": "near_pairs.jsonl",
    }


SIMILARITY_BANDS = ("<0.7", "0.7-0.8", "0.8-0.9", "0.9-1.0", "1.0")
PAIR_CHARS = 1000  # of each state in near_pairs.jsonl (the whole removed record is in rejects.jsonl)


def similarity_band(similarity: float) -> str:
    if similarity >= 1.0:
        return "1.0"
    return next(
        (f"{lo}-{hi}" for lo, hi in (("0.9", "1.0"), ("0.8", "0.9"), ("0.7", "0.8")) if similarity >= float(lo)), "<0.7"
    )


def near_pairs(rows: Sequence[Row] | Mapping[int, Row], matches: dict[int, NearMatch]) -> list[dict[str, Any]]:
    """One line per near-duplicate removal, least similar first, so a threshold can be audited from the top
    (``rows``: the rows by index, or, on Ray, the rows of the pairs by their place in the run)."""

    def side(row: Row) -> dict[str, Any]:
        text = row.text
        return {**row.ref(), "state": text if len(text) <= PAIR_CHARS else text[:PAIR_CHARS] + "…"}

    return [
        {
            "similarity": round(m.similarity, 4),
            "band": similarity_band(m.similarity),
            "removed": side(rows[i]),
            "kept": side(rows[m.kept]),
        }
        for i, m in sorted(matches.items(), key=lambda item: (item[1].similarity, item[0]))
    ]


def eval_index(recipe: DataRecipe) -> tuple[EvalIndex, dict[str, dict]]:
    """The recipe's eval items (``decontaminate_against``) indexed by its decontamination and near-dedup settings,
    with the per-file counts the manifest reports; both prepare paths match rows against it."""
    items, files = eval_items(recipe)
    settings, near = recipe.decontamination, recipe.dedup.near
    index = EvalIndex(
        items,
        exact=settings.exact,
        near=settings.near,
        threshold=settings.near_threshold or near.threshold,
        num_perm=near.num_perm,
        shingling=shingling(near),
        seed=near.seed,
        overlap_words=settings.ngram,
        whole_min_words=settings.whole_min_words,
        short_edits=settings.short_edits,
        keep_slot_changes=near.keep_slot_changes,
    )
    return index, files


def decontaminate(rows: list[Row], recipe: DataRecipe, ledger: Ledger, progress: bool = False) -> list[Row]:
    """Drop rows whose state matches an eval item: exactly, nearly (MinHash) or by a shared word n-gram."""
    if not recipe.decontaminate_against:
        release(rows)
        return ledger.step("decontaminate", rows, rows, [], eval_files={})
    index, files = eval_index(recipe)
    decided = decisions(rows)
    with progress_bar(progress, "decontaminate", total=len(rows)) as bar:
        found = index.match(
            decided.texts,
            progress=bar.update,
            tokenised=decision_words(rows, decided),
            sketches=decision_sketches(rows, decided, recipe.dedup.near) if recipe.decontamination.near else None,
        )
    removed = [
        (row, f"eval overlap ({hit.method})", hit.to_json())
        for row, hit in zip(rows, found, strict=True)
        if hit is not None
    ]
    kept = [row for row, hit in zip(rows, found, strict=True) if hit is None]
    for file, info in files.items():
        info["rows_removed"] = sum(hit is not None and hit.file == file for hit in found)
    release(rows)
    return ledger.step("decontaminate", rows, kept, removed, **decontamination_details(recipe, index, files))


def decontamination_details(recipe: DataRecipe, index: EvalIndex, files: dict[str, dict]) -> dict[str, Any]:
    """What the manifest's decontaminate step records beside its counts (the eval files with the rows each removed,
    and the settings); the same for both prepare paths."""
    settings = recipe.decontamination
    return {
        "eval_files": files,
        "ngram": settings.ngram,
        "whole_min_words": settings.whole_min_words,
        "short_edits": settings.short_edits,
        "near_threshold": index.threshold,
        "shingling": index.shingling.describe(),
    }


def cap_per_task(rows: list[Row], recipe: DataRecipe, ledger: Ledger) -> list[Row]:
    """Keep at most the cap of each task (a stable hash sample, not the first rows)."""
    caps = recipe.cap_per_task
    if isinstance(caps, dict):
        unknown = sorted(set(caps) - {row.record.task for row in rows})
        if unknown:
            raise RecipeError(f"cap_per_task names task(s) {unknown} that have no records")
    over = split.capped([row.record for row in rows], caps, recipe.split.seed)
    removed = (
        [
            (rows[i], "over the task cap", {"cap": caps if isinstance(caps, int) else caps[task]})
            for i, task in sorted(over.items())
        ]
        if isinstance(caps, (int, dict))
        else []
    )
    kept = [row for i, row in enumerate(rows) if i not in over]
    return ledger.step(
        "cap_per_task", rows, kept, removed, cap=caps, by_task=in_out(rows, kept, lambda r: r.record.task)
    )
