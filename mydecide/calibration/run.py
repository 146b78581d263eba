"""Calibrating a model: refuse a training or test split, score the dev file, fit temperatures, write
temperatures.json (``mydecide calibrate``). The fitting itself is :mod:`mydecide.calibration.temperatures`."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from mydecide.calibration.conformal_fit import describe as describe_conformal
from mydecide.calibration.conformal_fit import fit_conformal, table_of
from mydecide.calibration.level_maps import describe as describe_level_map
from mydecide.calibration.spans import decisions_to_json, fit_span_decisions
from mydecide.calibration.temperatures import (
    DEFAULT_MIN_ROWS,
    TEMPERATURES_FORMAT,
    WEAK_FIT_QUESTIONS,
    fit_temperatures,
)
from mydecide.config import dump_recipe
from mydecide.data.split import protected_split
from mydecide.errors import UserError
from mydecide.io import atomic_write_json, atomic_write_text, holds, provenance, refuse_link
from mydecide.manifest import MANIFEST, split_digest
from mydecide.modeling import load_model
from mydecide.record_files import load_records
from mydecide.records import Record
from mydecide.scoring.engine import QuestionScorer, model_scorer, prompt_counter, score_records
from mydecide.scoring.probabilities import to_probabilities
from mydecide.scoring.yes_no import family
from mydecide.spans import state_part

if TYPE_CHECKING:
    from mydecide.config import CalibrateRecipe
    from mydecide.scoring.model import LoadedModel

# -------------------------------------------------------------------------------------- training-split guard


def check_calibration_data(path: str | Path, force: bool = False, adapter: str | Path | None = None) -> None:
    """Raise ValueError when ``path`` is a training or held-out split (of ``adapter`` too), unless ``force``."""
    reason = protected_split(path, adapter)
    if reason and not force:
        raise UserError(
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
    keep_fit: bool = False,
    batch_size: int = 16,
    shared_prefix: bool = True,
    progress: bool = True,
    scorer: QuestionScorer | None = None,
    level_maps: bool = True,
    alpha: float | None = None,
    max_risk: float | None = None,
    delta: float = 0.1,
) -> dict:
    """Score dev ``records`` with ``model`` (a ``LoadedModel``) and fit temperatures on their logits, then (with
    ``level_maps``) a level map per K of the score questions where dev has enough of them and it helps held-out
    (:mod:`mydecide.calibration.level_maps`).

    With ``alpha`` and / or ``max_risk``, also the ``conformal`` section: sets that hold the gold answer with
    probability ≥ 1 − alpha, and the auto-act threshold whose error rate is ≤ max_risk with probability ≥ 1 − delta
    (:mod:`mydecide.calibration.conformal_fit`).

    ``scorer`` replaces the model's scoring (see ``scoring.engine.QuestionScorer``). Returns what
    :func:`~mydecide.calibration.temperatures.fit_temperatures` returns.
    """
    if not records:
        raise UserError("cannot calibrate on zero records")
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
    items = [(family(r.question), r.question.k, z, r.target) for r, z in zip(records, logits, strict=True)]
    fit = fit_temperatures(items, by_bucket=by_bucket, min_rows=min_rows, keep_fit=keep_fit, level_maps=level_maps)
    spans = [(r, z) for r, z in zip(records, logits, strict=True) if r.question.type == "span"]
    if spans:  # thresholds and span probabilities, on the grid as calibrated by the span temperature
        t = fit["types"]["span"]["temperature"]
        found = [
            (state_part(r.state, r.question.over), to_probabilities("span", z, t).tolist(), r.question.options, r.spans)
            for r, z in spans
        ]
        decisions, summary = fit_span_decisions(found)
        fit["spans"] = {"decisions": decisions_to_json(decisions), **summary}
    if alpha is not None or max_risk is not None:
        table = table_of(fit)
        fit["conformal"] = fit_conformal(
            records, logits, table, alpha=alpha, max_risk=max_risk, delta=delta, min_rows=min_rows
        )
    return fit


def check_temperatures_out(out: Path, data: Path, adapter: str | None) -> None:
    """Refuse, before any scoring, an ``--out`` that would replace what calibrate did not write (ValueError, one
    line naming it): the dev data itself, a file inside a prepare output (a directory with a manifest.json) or inside
    an adapter directory, an existing file that is not a temperatures.json, a stray ``.recipe.yaml`` beside it, or a
    symbolic link in the place of either (the write would replace the link, or reach what it points to)."""
    if Path(out).name in ("", ".."):  # ".", "/", "..": a directory, and no file name to put a suffix on
        raise UserError(f"{out}: is a directory; give the temperatures file's path (e.g. {out}/temperatures.json)")
    for path in (Path(out), Path(out).with_suffix(".recipe.yaml")):
        refuse_link(path)
    target = Path(os.path.realpath(out))
    side = target.with_suffix(".recipe.yaml")
    # the recipe beside it: a dev directory that holds it holds the target too; it is no link (refused above), so
    # it is compared as it is named
    if holds(data, target) or side == Path(os.path.realpath(data)):
        raise UserError(f"{out}: would overwrite the dev data {data}; choose another --out")
    if adapter is not None and holds(adapter, target.parent):
        raise UserError(f"{out}: is inside the adapter {adapter}, which calibrate must not change; choose --out")
    folder = target.parent
    if (folder / "adapter_config.json").is_file():
        raise UserError(f"{out}: is inside an adapter directory ({folder}); choose another --out")
    if (folder / MANIFEST).is_file():
        raise UserError(f"{out}: is inside a prepare output ({folder}); choose another --out")
    if target.is_dir():
        raise UserError(f"{out}: is a directory; give the temperatures file's path (e.g. {out}/temperatures.json)")
    if target.exists():
        try:
            written = json.loads(target.read_text(encoding="utf-8")).get("format")
        except (OSError, UnicodeDecodeError, ValueError, AttributeError):
            written = None
        if written != TEMPERATURES_FORMAT:
            raise UserError(f"{out}: exists and is not a temperatures.json written by calibrate; choose another --out")
    elif side.exists():
        raise UserError(f"{side}: exists beside --out {out}, which calibrate did not write; choose another --out")


def calibrate_file(recipe: CalibrateRecipe, *, force: bool = False, progress: bool = True) -> dict:
    """``mydecide calibrate``: refuse a training split, score the dev file, fit, write temperatures.json.

    Returns the written document.
    """
    if recipe.data is None:
        raise UserError("give the dev data to fit on: --data DEV.jsonl")
    data = Path(recipe.data)
    if not data.exists():
        raise FileNotFoundError(f"{data}: no such data file or split directory")
    check_calibration_data(data, force, recipe.adapter)
    check_temperatures_out(Path(recipe.out), data, recipe.adapter)
    records = load_records(data)
    if recipe.limit is not None:
        records = records[: recipe.limit]
    model = load_model(
        recipe.model,
        recipe.adapter,
        option_form=recipe.option_form,
        score_form=recipe.score_form,
        allow_other_base=recipe.allow_other_base,
    )
    fit = calibrate(
        model,
        records,
        by_bucket=recipe.by_bucket,
        min_rows=recipe.min_rows,
        keep_fit=recipe.keep_fit,
        batch_size=recipe.batch_size,
        shared_prefix=recipe.shared_prefix,
        progress=progress,
        level_maps=recipe.level_maps,
        alpha=recipe.alpha,
        max_risk=recipe.max_risk,
        delta=recipe.delta,
    )
    document = {
        "format": TEMPERATURES_FORMAT,
        "model": recipe.model,
        "adapter": recipe.adapter,
        "data": str(data),
        "data_sha256": split_digest(data),
        "records": len(records),
        "forced": bool(force and protected_split(data, recipe.adapter)),
        **fit,
        "recipe": recipe.model_dump(mode="json"),
        "provenance": provenance(),
    }
    atomic_write_json(recipe.out, document)
    atomic_write_text(Path(recipe.out).with_suffix(".recipe.yaml"), dump_recipe(recipe, provenance()))
    return document


def fit_report(document: dict) -> list[str]:
    """What ``mydecide calibrate`` prints of a temperatures document: one row per type (and bucket) with its question
    count, the fitted and the used T, dev log loss and ECE before → after, and beside each ECE the band a perfectly
    calibrated model would reach on that many questions (90th percentile, ``metrics.ece_band``); then one line per
    temperature that was not used or is weakly determined, and the overall line."""
    lines = [
        f"{'type':<8} {'bucket':<7} {'n':>6} {'fitted':>7} {'T':>7}  log loss before → after   "
        "ECE before → after (calibrated: up to)"
    ]
    rows = [(t, "all", s) for t, s in document["types"].items()]
    rows += [(t, b, s) for t, bs in document["buckets"].items() for b, s in bs.items()]
    notes = []
    for qtype, bucket, s in rows:
        where = qtype if bucket == "all" else f"{qtype} {bucket}"
        fitted = s.get("fitted_temperature", s["temperature"])
        lines.append(
            f"{qtype:<8} {bucket:<7} {s['n']:>6} {fitted:>7.3f} {s['temperature']:>7.3f}  "
            f"{s['log_loss_before']:>8.4f} → {s['log_loss_after']:<8.4f}   "
            f"{s['ece_before']:.4f} → {s['ece_after']:.4f} ({s.get('ece_band_after', float('nan')):.3f})"
        )
        for key in ("kept_t1", "kept_fit", "fallback"):
            if key in s and not (key == "fallback" and "kept_t1" in s):
                notes.append(f"{where}: {s[key]}")
        if s.get("at_bound"):
            notes.append(
                f"{where}: the fit stopped at the search bound (T = {fitted:.3g}): the logits carry little signal"
            )
        if s.get("weak") and "fallback" not in s:
            notes.append(
                f"{where}: {s['n']} questions: the temperature is weakly determined (fewer than {WEAK_FIT_QUESTIONS}); "
                f"a calibrated model's ECE on this many reaches {s.get('ece_band_after', float('nan')):.3f}"
            )
    o = document["overall"]
    apart = o["n"] < sum(s["n"] for s in document["types"].values())  # span questions left to their own row
    lines += notes
    spans = document.get("spans")
    if spans:
        cuts = ", ".join(f"{label} {t:.2f}" for label, t in spans["thresholds"].items())
        ece_line = (
            f"; span ECE {spans['span_ece_before']:.4f} → {spans['span_ece_after']:.4f} "
            f"(calibrated: up to {spans['span_ece_band']:.3f})"
            if spans["span_ece_before"] is not None
            else ""
        )
        lines.append(
            f"span thresholds: {cuts + '; ' if cuts else ''}any other label {spans['default_threshold']:.2f}; exact F1 "
            f"{spans['exact_f1_at_0.5']:.3f} at 0.5 → {spans['exact_f1']:.3f} on {spans['questions']} dev questions"
            + ece_line
        )
    lines += [describe_level_map(summary) for summary in document.get("level_maps", {}).values()]
    lines += describe_conformal(document.get("conformal") or {})
    lines.append(
        f"overall: log loss {o['log_loss_before']:.4f} → {o['log_loss_after']:.4f}, "
        f"ECE {o['ece_before']:.4f} → {o['ece_after']:.4f} on {o['n']} questions "
        f"(calibrated: up to {o.get('ece_band_after', float('nan')):.3f})"
        + (" (span questions: their own row above)" if apart else "")
    )
    return lines
