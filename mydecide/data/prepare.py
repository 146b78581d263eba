"""The ``prepare`` pipeline: sources → validated, deduplicated, decontaminated, split, augmented JSONL.

:func:`prepare` reads as the table of contents: convert → validate → exact dedup → unique ids → near dedup →
decontaminate → cap per task → split → augment → write. Every step counts rows in and out (per source and per
question type) and says why each removed row left; each removed or rejected row goes to ``rejects.jsonl`` with its
step, its reason, its source location and (for duplicates and contamination) the row or eval item it matched.
Before anything is written the conservation law is checked: input rows = kept + rejected + removed, exactly.

Convert and validate live in :mod:`mydecide.data.inputs`; the steps that remove rows (dedup, unique ids,
decontamination, the cap per task) in :mod:`mydecide.data.filtering`; the split and augment steps in
:mod:`mydecide.data.split_augment`; the writing in :mod:`mydecide.data.outputs`. ``engine: ray`` runs the same steps
on Ray, block by block (:mod:`mydecide.data.ray`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from mydecide.config import DataRecipe
from mydecide.data.filtering import cap_per_task, decontaminate, exact_dedup, near_dedup, unique_ids
from mydecide.data.inputs import convert_and_validate
from mydecide.data.ledger import Ledger, short_reasons
from mydecide.data.outputs import build_manifest, check_conservation, check_output_dir, write_outputs
from mydecide.data.split_augment import augment_train, check_absent_labels, split_rows
from mydecide.data.task_counts import task_lines
from mydecide.io import directory_lock

Log = Callable[[str], None]


# ------------------------------------------------------------------------------------------------- the pipeline


def prepare(
    recipe: DataRecipe,
    out: str | Path | None = None,
    *,
    progress: bool = False,
    log: Log | None = None,
) -> dict[str, Any]:
    """Run the data recipe and write its outputs to ``out`` (default ``recipe.out``); returns the manifest.

    ``recipe.engine: ray`` runs every step on a Ray cluster, with the same outputs (docs/distributed-prepare.md).
    """
    if recipe.engine == "ray":
        from mydecide.data.ray.driver import prepare_on_ray

        return prepare_on_ray(recipe, out, progress=progress, log=log)
    out = Path(out if out is not None else recipe.out)
    check_output_dir(out, recipe)  # before any work: what prepare would replace must be its own
    with directory_lock(out, "prepare"):  # a second prepare into the same --out stops here, naming this one
        say = log or (lambda _message: None)
        ledger = Ledger()

        rows = convert_and_validate(recipe.sources, ledger, progress)
        rows = exact_dedup(rows, recipe, ledger)
        rows = unique_ids(rows, ledger)
        rows = near_dedup(rows, recipe, ledger, progress)
        rows = decontaminate(rows, recipe, ledger, progress)
        rows = cap_per_task(rows, recipe, ledger)
        check_absent_labels(rows, recipe)
        splits = split_rows(rows, recipe, ledger)
        splits["train"] = augment_train(splits["train"], recipe, ledger)

        for step in ledger.steps:
            say(f"{step['step']:<14} {step['in']:>8} in  {step['out']:>8} out  {short_reasons(step)}")
        manifest = build_manifest(recipe, ledger, splits)
        check_conservation(manifest, ledger)
        write_outputs(out, splits, ledger, manifest, recipe)
        for line in task_lines(manifest, out):
            say(line)
        say(f"wrote {', '.join(sorted(manifest['outputs']))} to {out}")
        return manifest
