"""The ``prepare`` pipeline: sources → validated, deduplicated, decontaminated, split, augmented JSONL.

:func:`prepare` reads as the table of contents: convert → validate → exact dedup → unique ids → near dedup →
decontaminate → cap per task → split → augment → write. Every step counts rows in and out (per source and per
question type) and says why each removed row left; each removed or rejected row goes to ``rejects.jsonl`` with its
step, its reason, its source location and (for duplicates and contamination) the row or eval item it matched.
Before anything is written the conservation law is checked: input rows = kept + rejected + removed, exactly.

Convert and validate live in :mod:`mydecide.data.inputs`; the steps that remove rows (dedup, unique ids,
decontamination, the cap per task) and the :class:`~mydecide.data.filtering.Engine` the two heavy ones run on, in
:mod:`mydecide.data.filtering`; the split and augment steps here; the writing in :mod:`mydecide.data.outputs`.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping, Sized
from pathlib import Path
from typing import Any

from mydecide.config import DataRecipe, SplitConfig
from mydecide.data import augment as augmenting
from mydecide.data import split
from mydecide.data.filtering import (
    Engine,
    LocalEngine,
    cap_per_task,
    decontaminate,
    exact_dedup,
    near_dedup,
    unique_ids,
)
from mydecide.data.inputs import convert_and_validate
from mydecide.data.ledger import Ledger, Row, short_reasons
from mydecide.data.outputs import build_manifest, check_conservation, check_output_dir, write_outputs
from mydecide.errors import UserError
from mydecide.io import directory_lock
from mydecide.recipe_parsing import RecipeError
from mydecide.records import SOFT_TRAIN_TARGET, Record, train_target

Log = Callable[[str], None]


# ------------------------------------------------------------------------------------------------- the pipeline


def prepare(
    recipe: DataRecipe,
    out: str | Path | None = None,
    *,
    progress: bool = False,
    log: Log | None = None,
    engine: Engine | None = None,
) -> dict[str, Any]:
    """Run the data recipe and write its outputs to ``out`` (default ``recipe.out``); returns the manifest.

    ``recipe.engine: ray`` runs near dedup and decontamination on a Ray cluster (docs/distributed-prepare.md).
    """
    if engine is None and recipe.engine == "ray" and recipe.ray.streaming:
        from mydecide.data.streaming import prepare_streaming

        return prepare_streaming(recipe, out, progress=progress, log=log)
    if engine is None and recipe.engine == "ray":
        from mydecide.data.distributed import ray_engine

        with ray_engine(recipe.ray, log=log) as ray:
            return prepare(recipe, out, progress=progress, log=log, engine=ray)
    engine = engine or LocalEngine()
    out = Path(out if out is not None else recipe.out)
    check_output_dir(out, recipe)  # before any work: what prepare would replace must be its own
    with directory_lock(out, "prepare"):  # a second prepare into the same --out stops here, naming this one
        say = log or (lambda _message: None)
        ledger = Ledger()

        rows = convert_and_validate(recipe.sources, ledger, progress)
        rows = exact_dedup(rows, recipe, ledger)
        rows = unique_ids(rows, ledger)
        rows = near_dedup(rows, recipe, ledger, progress, engine)
        rows = decontaminate(rows, recipe, ledger, progress, engine)
        rows = cap_per_task(rows, recipe, ledger)
        check_absent_labels(rows, recipe)
        splits = split_rows(rows, recipe, ledger)
        splits["train"] = augment_train(splits["train"], recipe, ledger)

        for step in ledger.steps:
            say(f"{step['step']:<14} {step['in']:>8} in  {step['out']:>8} out  {short_reasons(step)}")
        manifest = build_manifest(recipe, ledger, splits)
        check_conservation(manifest, ledger)
        write_outputs(out, splits, ledger, manifest, recipe)
        say(f"wrote {', '.join(sorted(manifest['outputs']))} to {out}")
        return manifest


# ----------------------------------------------------------------------------------------------------- steps


def softened_record(record: Record) -> Record:
    """``record`` trained on the label distribution its ``meta.soft_target`` gives (checked when it was read), the
    key moved out of meta into the target so that augmented copies start from the distribution."""
    meta = {key: value for key, value in record.meta.items() if key != SOFT_TRAIN_TARGET}
    target = train_target(record.question, record.meta[SOFT_TRAIN_TARGET])
    return dataclasses.replace(record, target=target, soft=True, meta=meta)


def split_rows(rows: list[Row], recipe: DataRecipe, ledger: Ledger) -> dict[str, list[Row]]:
    """Held-out tasks whole; the rest train / dev / test by the stable state hash."""
    cfg = recipe.split
    try:
        indices = split.split_records(
            [row.record for row in rows],
            heldout_tasks=cfg.heldout_tasks,
            dev_fraction=cfg.dev_fraction,
            test_fraction=cfg.test_fraction,
            seed=cfg.seed,
        )
    except UserError as err:  # split.heldout_tasks names a task with no records
        raise RecipeError(str(err)) from None
    splits = {name: [rows[i] for i in idx] for name, idx in indices.items()}
    empty = empty_by_recipe(splits, rows, recipe, ledger)
    ledger.steps.append(
        {
            "step": "split",
            "in": len(rows),
            "out": len(rows),
            "removed": 0,
            "splits": {name: len(part) for name, part in splits.items()},
            "empty_by_recipe": empty,
            "by_task": {
                name: dict(sorted(Counter(r.record.task for r in part).items())) for name, part in splits.items()
            },
            "seconds": ledger.lap(),
        }
    )
    return splits


def empty_by_recipe(splits: Mapping[str, Sized], rows: Sized, recipe: DataRecipe, ledger: Ledger) -> dict[str, str]:
    """``{split: why}`` for each empty split the recipe asked to be empty (a fraction of 0, no held-out task); a
    split it asked for that came out empty is a RecipeError naming the cause, so prepare never writes an empty
    train.jsonl, dev.jsonl or test.jsonl and ends as if all were well."""
    cfg = recipe.split
    trained = len(rows) - len(splits["heldout"])
    if not splits["train"]:
        raise RecipeError(f"split: train would be empty: {empty_train_cause(rows, trained, cfg, ledger)}")
    empty = {}
    for name, fraction in (("dev", cfg.dev_fraction), ("test", cfg.test_fraction)):
        if splits[name]:
            continue
        if fraction > 0:
            raise RecipeError(
                f"split: {name} would be empty: split.{name}_fraction {fraction} of the {trained} rows of trained "
                f"tasks gave none; add rows, raise it, or set split.{name}_fraction: 0 to prepare without {name}"
            )
        empty[name] = f"split.{name}_fraction is 0"
    if not cfg.heldout_tasks:
        empty["heldout"] = "no split.heldout_tasks"
    return empty


def empty_train_cause(rows: Sized, trained: int, cfg: SplitConfig, ledger: Ledger) -> str:
    """Why no row went to train: none was left, every task left is held out, or the hash sent all to dev / test."""
    if not rows:
        gone = [f"{s['step']} {n}" for s in ledger.steps if (n := s.get("removed") or s.get("rejected"))]
        return "no row is left to split" + (f" (rows out: {', '.join(gone)})" if gone else "")
    if not trained:
        return f"every task left is held out (split.heldout_tasks: {cfg.heldout_tasks})"
    return (
        f"the {trained} rows of trained tasks all went to dev or test (split.dev_fraction {cfg.dev_fraction}, "
        f"split.test_fraction {cfg.test_fraction}); add rows or lower the fractions"
    )


def check_absent_labels(rows: list[Row], recipe: DataRecipe) -> None:
    """A label the recipe declares absent from the data (``augment.absent_span_labels``) must be no span record's
    own label, in any case: a record that asks for it says the label can occur, so adding it with no gold spans
    could teach the model to miss it. The first record that does is a RecipeError naming the label and the row."""
    absent = recipe.augment.absent_span_labels
    for row in rows if absent else ():
        clash = augmenting.absent_label_clash(row.record, absent)
        if clash is not None:
            declared, own = clash
            named = repr(declared) if own == declared else f"{declared!r} (as {own!r})"
            raise RecipeError(
                f"augment.absent_span_labels: {named} is a label of span record {row.record.id!r} ({row.source}, "
                f"{row.where}); a label declared absent from the data must be no record's label: take it out"
            )


def augment_train(train: list[Row], recipe: DataRecipe, ledger: Ledger) -> list[Row]:
    """Add augmented copies of train rows (after the split, so no other split is touched)."""
    cfg = recipe.augment
    schema = cfg.schema_resampling
    settings = augmenting.AugmentSettings(
        anonymize_options=max(cfg.anonymize_options, schema),
        drop_distractors=max(cfg.drop_distractors, schema),
        paraphrase_instructions=cfg.paraphrase_instructions,
        paraphrases=cfg.paraphrases,
        reword_instructions=max(cfg.reword_instructions, schema),
        negate_noul=max(cfg.negate_noul, cfg.consistency),
        rename_options=max(cfg.rename_options, cfg.consistency),
        drop_span_labels=max(cfg.drop_span_labels, schema),
        rename_span_labels=max(cfg.rename_span_labels, schema),
        paraphrase_span_labels=max(cfg.paraphrase_span_labels, schema),
        span_label_paraphrases=cfg.span_label_paraphrases,
        add_absent_span_labels=max(cfg.add_absent_span_labels, schema),
        absent_span_labels=cfg.absent_span_labels,
        negation_templates=cfg.negation_templates or augmenting.NEGATION_TEMPLATES,
        seed=cfg.seed,
    )
    out: list[Row] = []
    added: Counter[str] = Counter()
    softened = 0
    for row in train:
        if cfg.soft_targets and SOFT_TRAIN_TARGET in row.record.meta:
            row = Row(softened_record(row.record), row.source, row.where)
            softened += 1
        out.append(row)
        for copy in augmenting.copies(row.record, settings):
            out.append(Row(copy, row.source, row.where))
            added[str(copy.meta["augmented"])] += 1
    ledger.augmented = sum(added.values())
    ledger.steps.append(
        {
            "step": "augment",
            "in": len(train),
            "out": len(out),
            "removed": 0,
            "added": {kind: added[kind] for kind in augmenting.AUGMENTATIONS},
            "soft_targets": softened,
            "share": {kind: round(added[kind] / len(train), 4) if train else 0.0 for kind in augmenting.AUGMENTATIONS},
            "seconds": ledger.lap(),
        }
    )
    return out
