"""The steps of ``prepare`` after filtering, shared by the local pipeline (:mod:`mydecide.data.prepare`) and the
run on Ray (:mod:`mydecide.data.ray`, per block): the check of labels declared absent, the split, the
causes of an empty split, and the train split's augmented copies and soft targets."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sized

from mydecide.config import DataRecipe, SplitConfig
from mydecide.data import augment as augmenting
from mydecide.data import split
from mydecide.data.ledger import Ledger, Row
from mydecide.errors import UserError
from mydecide.recipe_parsing import RecipeError
from mydecide.records import SOFT_TRAIN_TARGET, Record, train_target


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
        negate_noul=cfg.negate_noul,
        rename_options=cfg.rename_options,
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
