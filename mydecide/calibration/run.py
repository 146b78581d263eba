"""Calibrating a model: refuse a training or test split, score the dev file, fit temperatures, write
temperatures.json (``mydecide calibrate``). The fitting itself is :mod:`mydecide.calibration.temperatures`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from mydecide.calibration.temperatures import DEFAULT_MIN_ROWS, TEMPERATURES_FORMAT, fit_temperatures
from mydecide.config import dump_recipe
from mydecide.io import atomic_write_json, atomic_write_text, provenance
from mydecide.manifest import MANIFEST, recorded_as, split_digest
from mydecide.modeling import load_model
from mydecide.record_files import load_records
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


def protected_split(path: str | Path) -> str | None:
    """Why ``path`` must not be used for calibration, or None.

    Refused: a file named like prepare's train, test or held-out split, and a renamed copy of one (a file with the
    sha256 that the ``manifest.json`` beside it records for one of those splits).
    """
    path = Path(path)
    if path.name in PROTECTED_SPLITS:
        return f"{path} is named like the {PROTECTED_SPLITS[path.name][1]} split written by prepare"
    if path.is_dir():  # a partitioned split: train/, test/, heldout_tasks/
        named = f"{path.name}.jsonl"
        if named in PROTECTED_SPLITS:
            return f"{path} is named like the {PROTECTED_SPLITS[named][1]} split written by prepare"
        return None
    copied = recorded_as(path, list(PROTECTED_SPLITS))
    if copied is not None:
        role = PROTECTED_SPLITS[copied][1]
        return f"{path} has the sha256 that {path.parent / MANIFEST} records for {copied}, the {role} split"
    return None


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
