"""Calibrating a model: refuse a training or test split, score the dev file, fit temperatures, write
temperatures.json (``mydecide calibrate``). The fitting itself is :mod:`mydecide.calibration.temperatures`."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from mydecide.calibration.temperatures import DEFAULT_MIN_ROWS, TEMPERATURES_FORMAT, fit_temperatures
from mydecide.config import dump_recipe
from mydecide.data.dedup import normalise, state_text
from mydecide.io import atomic_write_json, atomic_write_text, provenance
from mydecide.manifest import MANIFEST, SPLIT_FILES, recorded_as, split_digest, split_dir, split_path
from mydecide.modeling import load_model
from mydecide.record_files import load_records, read_records
from mydecide.records import Record
from mydecide.scoring.engine import QuestionScorer, model_scorer, prompt_counter, score_records

if TYPE_CHECKING:
    from mydecide.config import CalibrateRecipe
    from mydecide.modeling import LoadedModel

PROTECTED_SPLITS = {
    "train.jsonl": ("train", "training"),
    "test.jsonl": ("test", "test"),
    "heldout_tasks.jsonl": ("heldout", "held-out test"),
}
"""Prepare outputs that calibration must never see: fitting there would leak into training or testing."""


# -------------------------------------------------------------------------------------- training-split guard


def state_digest(record: Record) -> str:
    """sha256 of a record's normalised state: the text prepare's split is keyed on (``data.split``)."""
    return hashlib.sha256(normalise(state_text(record.state)).encode()).hexdigest()


def train_split_of(path: Path) -> Path | None:
    """The training split of the prepare output that holds ``path`` (the file or partitioned split beside it; for a
    part file of a partitioned split, beside that split), or None when there is none or it holds ``path``."""
    directory = path.parent
    if path.is_file() and directory.name in {split_dir(split) for split in SPLIT_FILES}:  # dev/part-00000.jsonl
        directory = directory.parent
    train = split_path(directory, "train")
    if not train.exists() or train.resolve() == path.resolve() or train.resolve() in path.resolve().parents:
        return None
    return train


def training_rows_in(path: Path) -> str | None:
    """How many rows of ``path`` are training rows, when any are: rows whose state (by :func:`state_digest`) is a
    state of the training split beside it, with or without its row id (a copied row keeps both; prepare keeps every
    question on one state in one split, so a shared state is one the model saw in training). A row that shares
    only an id with a training row is not counted: hand-written files reuse ids such as 1, 2, 3."""
    train = train_split_of(path)
    if train is None:
        return None
    trained, _ = read_records(train)  # lenient: a training row prepare would have rejected is not one
    states = {state_digest(r): r.id for r in trained}
    ids = {r.id for r in trained}
    rows = load_records(path)
    shared = [r for r in rows if state_digest(r) in states]
    if not shared:
        return None
    with_id = sum(r.id in ids for r in shared)
    return (
        f"{len(shared)} of its {len(rows)} rows are rows of the training split {train} ({with_id} by row id and "
        f"state, {len(shared) - with_id} by state alone: the sha256 of the normalised state)"
    )


def protected_split(path: str | Path) -> str | None:
    """Why ``path`` must not be used for calibration, or None.

    Refused: a file named like prepare's train, test or held-out split, a renamed copy of one (a file with the
    sha256 that the ``manifest.json`` beside it records for one of those splits), and a file that holds rows of the
    training split beside it (a copy with changes, a concatenation: :func:`training_rows_in`).
    """
    path = Path(path)
    if path.name in PROTECTED_SPLITS:
        return f"{path} is named like the {PROTECTED_SPLITS[path.name][1]} split written by prepare"
    if path.is_dir():  # a partitioned split: train/, test/, heldout_tasks/
        named = f"{path.name}.jsonl"
        if named in PROTECTED_SPLITS:
            return f"{path} is named like the {PROTECTED_SPLITS[named][1]} split written by prepare"
        return training_rows_in(path)
    copied = recorded_as(path, list(PROTECTED_SPLITS))
    if copied is not None:
        role = PROTECTED_SPLITS[copied][1]
        return f"{path} has the sha256 that {path.parent / MANIFEST} records for {copied}, the {role} split"
    return training_rows_in(path)


def check_calibration_data(path: str | Path, force: bool = False) -> None:
    """Raise ValueError when ``path`` is a training or held-out split, unless ``force``."""
    reason = protected_split(path)
    if reason and not force:
        raise ValueError(
            f"refusing to calibrate on {path}: {reason}; fit temperatures on dev data "
            "(dev.jsonl), or pass --force if this file really is held-out dev data"
        )


# ------------------------------------------------------------------------------------------ calibrate a model


def calibrate(
    model: LoadedModel | None,
    records: Sequence[Record],
    *,
    by_bucket: bool = False,
    min_rows: int = DEFAULT_MIN_ROWS,
    batch_size: int = 16,
    shared_prefix: bool = True,
    progress: bool = True,
    scorer: QuestionScorer | None = None,
) -> dict:
    """Score dev ``records`` with ``model`` (a ``LoadedModel``) and fit temperatures on their logits.

    ``scorer`` replaces the model's scoring (see ``scoring.engine.QuestionScorer``). Returns what
    :func:`~mydecide.calibration.temperatures.fit_temperatures` returns.
    """
    if not records:
        raise ValueError("cannot calibrate on zero records")
    if scorer is None:
        if model is None:
            raise ValueError("calibrate needs a model or a scorer")
        scorer = model_scorer(model, batch_size=batch_size, shared_prefix=shared_prefix)
    logits, _ = score_records(
        scorer,
        [(r.state, r.question) for r in records],
        chunk_prompts=batch_size,
        desc="calibrate: scoring",
        progress=progress,
        prompts_of=prompt_counter(model),
    )
    items = [(r.question.type, r.question.k, z, r.target) for r, z in zip(records, logits, strict=True)]
    return fit_temperatures(items, by_bucket=by_bucket, min_rows=min_rows)


def calibrate_file(recipe: CalibrateRecipe, *, force: bool = False, progress: bool = True) -> dict:
    """``mydecide calibrate``: refuse a training split, score the dev file, fit, write temperatures.json.

    Returns the written document.
    """
    if recipe.data is None:
        raise ValueError("give the dev data to fit on: --data DEV.jsonl")
    data = Path(recipe.data)
    if not data.exists():
        raise FileNotFoundError(f"{data}: no such data file or split directory")
    check_calibration_data(data, force)
    records = load_records(data)
    if recipe.limit is not None:
        records = records[: recipe.limit]
    model = load_model(
        recipe.model, recipe.adapter, option_form=recipe.option_form, allow_other_base=recipe.allow_other_base
    )
    fit = calibrate(
        model,
        records,
        by_bucket=recipe.by_bucket,
        min_rows=recipe.min_rows,
        batch_size=recipe.batch_size,
        shared_prefix=recipe.shared_prefix,
        progress=progress,
    )
    document = {
        "format": TEMPERATURES_FORMAT,
        "model": recipe.model,
        "adapter": recipe.adapter,
        "data": str(data),
        "data_sha256": split_digest(data),
        "records": len(records),
        "forced": bool(force and protected_split(data)),
        **fit,
        "recipe": recipe.model_dump(mode="json"),
        "provenance": provenance(),
    }
    atomic_write_json(recipe.out, document)
    atomic_write_text(Path(recipe.out).with_suffix(".recipe.yaml"), dump_recipe(recipe, provenance()))
    return document
