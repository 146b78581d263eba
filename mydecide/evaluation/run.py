"""Evaluation, orchestrated: score decision records and say how good, how calibrated and how robust the answers are.

The steps, in the order :func:`run_evaluation` runs them:

1. score every record (batched, questions on one state share the state's computation; progress on stderr)
   and turn the logits into probabilities with the fitted temperatures;
2. score every choice question again with its options shown in other orders (the reversed order plus
   ``permutations`` random ones) to measure the option-order flip rate;
3. metrics for all questions, per type, per task and per slice (language, option count, state length,
   confidence bin), from one flat list of scored rows (:mod:`~mydecide.evaluation.rows`);
4. baselines beside the model: the majority class per task (:mod:`~mydecide.evaluation.baselines`) and the base
   model without its adapter;
5. the auto-act threshold from payoffs and the coverage / accuracy / payoff table around it;
6. optionally, JevBench's coherence laws on ``coherence`` sampled states (:mod:`~mydecide.evaluation.coherence`).

:func:`~mydecide.evaluation.report.write_outputs` writes ``predictions.jsonl``, ``report.json``, ``report.md`` and
``reliability.png``; :func:`evaluate_files` is ``mydecide evaluate``.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mydecide import metrics
from mydecide.calibration.conformal_fit import gold_span_best
from mydecide.calibration.temperatures import load_temperatures
from mydecide.config import Costs, EvalRecipe, dump_recipe
from mydecide.data.split import protected_split
from mydecide.errors import UserError
from mydecide.evaluation.baselines import LabelPrior, majority_rows
from mydecide.evaluation.classes import class_tables, headline_intervals
from mydecide.evaluation.coherence import jevbench_coherence, wire_answerer
from mydecide.evaluation.curves import training_curves
from mydecide.evaluation.guarantees import guarantee_report
from mydecide.evaluation.report import check_report_dir, write_outputs
from mydecide.evaluation.rows import Evaluation, MetricRow, metric_blocks, prediction_row, question_rows, span_metrics
from mydecide.io import directory_lock, provenance
from mydecide.manifest import split_beside
from mydecide.modeling import adapter_disabled, has_adapter, load_model
from mydecide.record_files import load_records
from mydecide.records import MAX_CHOICE_OPTIONS, MAX_SCORE_LEVELS, Record
from mydecide.scoring.engine import QuestionScorer, model_scorer, prompt_counter, score_records
from mydecide.scoring.probabilities import TemperatureLookup, calibrated_probabilities, level_map_of
from mydecide.scoring.render import render_state
from mydecide.scoring.yes_no import family

if TYPE_CHECKING:
    from mydecide.scoring.model import LoadedModel

DEFAULT_COSTS = Costs().model_dump()  # the recipe's defaults, defined once in config
DEFAULT_THRESHOLDS = tuple(EvalRecipe().thresholds)


def permuted_orders(records: Sequence[Record], permutations: int, seed: int) -> list[tuple[int, tuple[int, ...]]]:
    """(record index, shown order) pairs for the flip-rate pass: reversed + ``permutations`` random orders.

    Only choice questions: a client gives their options in some order, while yes / no questions (and set labels)
    are always rendered "A. yes, B. no" and score levels in their order (scoring/render.py), so no request can
    reorder those. Orders equal to the identity or to one already listed are skipped, so K = 2 gets one.
    """
    rng = np.random.default_rng(seed)
    pairs: list[tuple[int, tuple[int, ...]]] = []
    for n, record in enumerate(records):
        q = record.question
        if q.type != "choice" or q.k < 2:
            continue
        identity = tuple(range(q.k))
        seen = {identity}
        candidates = [identity[::-1]] + [tuple(int(i) for i in rng.permutation(q.k)) for _ in range(permutations)]
        for order in candidates:
            if order not in seen:
                seen.add(order)
                pairs.append((n, order))
    return pairs


def flip_flags(
    records: Sequence[Record],
    logits: Sequence[np.ndarray],
    pairs: Sequence[tuple[int, tuple]],
    permuted: Sequence[np.ndarray],
) -> list[bool | None]:
    """Per record: True when any other option order changes the argmax, None when not applicable."""
    flags: list[bool | None] = [None] * len(records)
    for (n, _), z in zip(pairs, permuted, strict=True):
        changed = int(np.argmax(z)) != int(np.argmax(logits[n]))
        flags[n] = bool(flags[n]) or changed
    return flags


def threshold_report(
    rows: Sequence[MetricRow], costs: dict[str, float], thresholds: Sequence[float] = DEFAULT_THRESHOLDS
) -> dict[str, Any]:
    """The auto-act threshold from payoffs and the coverage / accuracy / payoff table around it."""
    auto = metrics.auto_act_threshold(costs["right"], costs["wrong"], costs["escalate"])
    points = sorted({round(t, 6) for t in (*thresholds, auto)})
    table = metrics.threshold_table(
        [r.probs for r in rows], [r.target for r in rows], points, costs["right"], costs["wrong"], costs["escalate"]
    )
    for entry in table:
        entry["auto_act"] = math.isclose(entry["threshold"] or 0.0, auto, abs_tol=1e-6)
    return {"costs": dict(costs), "auto_act_threshold": auto, "table": table}


def _check_scorable(records: Sequence[Record]) -> None:
    """Choices of 27–255 options are scored in groups + a final round (``scoring.plan``); more are refused."""
    limits = {"choice": MAX_CHOICE_OPTIONS, "score": MAX_SCORE_LEVELS}
    for r in records:
        most = limits.get(r.question.type)
        if most is not None and r.question.k > most:
            raise UserError(
                f"record {r.id!r} ({r.task}): {r.question.k} options, but a {r.question.type} "
                f"question has at most {most}"
            )


def run_evaluation(
    model: LoadedModel | None,
    records: Sequence[Record],
    temperatures: TemperatureLookup | str | Path | None = None,
    *,
    permutations: int = 4,
    seed: int = 13,
    costs: dict[str, float] | None = None,
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    coherence: int = 0,
    base: bool = True,
    prior: LabelPrior | None = None,
    files: Sequence[str] | None = None,
    batch_size: int = 16,
    shared_prefix: bool = True,
    progress: bool = True,
    scorer: QuestionScorer | None = None,
    base_scorer: QuestionScorer | None = None,
) -> Evaluation:
    """Score ``records`` and build the full report (see the module docstring for the steps).

    ``temperatures``: a callable (qtype, K) → T, a temperatures.json path, or None (T = 1). ``prior``: the
    training split's label distribution for the majority baseline (None → in-sample majority). ``files``: the
    source file name of each record (for "by_file"). ``scorer`` / ``base_scorer`` replace the model's scoring
    (tests; a base scorer is otherwise the model under ``disable_adapter()`` when an adapter is loaded).
    """
    if not records:
        raise UserError("nothing to evaluate: no records")
    if permutations < 0:
        raise ValueError(f"permutations must be >= 0, got {permutations}")
    if model is None and scorer is None:
        raise ValueError("run_evaluation needs a model or a scorer")
    costs = dict(DEFAULT_COSTS if costs is None else costs)
    metrics.auto_act_threshold(costs["right"], costs["wrong"], costs["escalate"])  # validate early
    temperature_path: str | None = None
    if isinstance(temperatures, (str, Path)):
        temperature_path = str(temperatures)
        temperatures = load_temperatures(temperatures)
    calibrated = temperatures is not None
    temperature: TemperatureLookup = temperatures if temperatures is not None else (lambda qtype, k: 1.0)
    if model is not None:
        _check_scorable(records)
    scorer = scorer or model_scorer(model, batch_size=batch_size, shared_prefix=shared_prefix)  # type: ignore[arg-type]
    files = list(files) if files is not None else [""] * len(records)
    state_tokens = _state_tokens(model, records)
    items = [(r.state, r.question) for r in records]

    prompts_of = prompt_counter(model)

    def scored(score: QuestionScorer, label: str) -> tuple[list[np.ndarray], list[float], list[bool | None]]:
        logits, latency = score_records(
            score, items, chunk_prompts=batch_size, desc=label, progress=progress, prompts_of=prompts_of
        )
        pairs = permuted_orders(records, permutations, seed)
        permuted, _ = score_records(
            score,
            [items[n] for n, _ in pairs],
            [o for _, o in pairs],
            chunk_prompts=batch_size,
            desc=f"{label}: option orders",
            progress=progress,
            prompts_of=prompts_of,
        )
        return logits, latency, flip_flags(records, logits, pairs, permuted)

    def rows_and_predictions(
        logits: list[np.ndarray], latency: list[float] | None, flips: list[bool | None], temp: TemperatureLookup
    ) -> tuple[list[MetricRow], list[dict[str, Any]]]:
        rows: list[MetricRow] = []
        predictions = []
        for n, (record, z) in enumerate(zip(records, logits, strict=True)):
            q = record.question
            t = temp(family(q), q.k)
            p = calibrated_probabilities(family(q), q.k, z, temp)
            lat = latency[n] if latency is not None else None
            rows += question_rows(
                n, record, p, state_tokens=state_tokens[n], flipped=flips[n], latency=lat, file=files[n]
            )
            predictions.append(
                prediction_row(
                    record,
                    z,
                    p,
                    t,
                    latency=lat,
                    flipped=flips[n],
                    state_tokens=state_tokens[n],
                    file=files[n],
                    decisions=getattr(temp, "span_decisions", None),
                    level_map=level_map_of(family(q), q.k, temp) is not None,
                )
            )
        return rows, predictions

    started = time.perf_counter()
    logits, latency, flips = scored(scorer, "scoring")
    rows, predictions = rows_and_predictions(logits, latency, flips, temperature)
    report: dict[str, Any] = {
        "model": model.name if model is not None else "(scorer)",
        "adapter": _adapter_path(model),
        "temperatures": temperature_path or ("(given)" if calibrated else None),
        "records": len(records),
        "settings": {
            "permutations": permutations,
            "seed": seed,
            "batch_size": batch_size,
            "shared_prefix": shared_prefix,
            "coherence": coherence,
            "base": base,
            **(
                {"option_form": model.renderer.config.option_form, "score_form": model.renderer.config.score_form}
                if model is not None
                else {}
            ),
        },
        **metric_blocks(rows),
    }
    if report["span"]["n"]:
        report["span"]["spans"] = span_metrics(predictions)
    raw_rows = None
    if calibrated:
        raw_rows, raw_predictions = rows_and_predictions(logits, latency, flips, lambda qtype, k: 1.0)
        report["uncalibrated"] = metric_blocks(raw_rows, slices=False)
        if report["span"]["n"]:
            report["uncalibrated"]["span"]["spans"] = span_metrics(raw_predictions)
        report["temperatures_used"] = _temperatures_used(records, temperature)
        if mapped := _level_maps_used(records, temperature):
            report["level_maps_used"] = mapped

    baselines: dict[str, Any] = {}
    majority, info = majority_rows(records, prior)
    baselines["majority"] = {**info, **metric_blocks(majority, slices=False)}
    base_predictions = None
    if base and (base_scorer is not None or has_adapter(model)):
        head = base_scorer is None and model is not None and model.renderer.config.span.read == "head"
        if base_scorer is not None:
            b_logits, b_latency, b_flips = scored(base_scorer, "base model")
        else:
            assert model is not None
            with adapter_disabled(model):
                b_logits, b_latency, b_flips = scored(scorer, "base model")
        b_rows, base_predictions = rows_and_predictions(b_logits, b_latency, b_flips, lambda qtype, k: 1.0)
        baselines["base_model"] = {
            "note": "the same weights without the adapter, T = 1"
            + ("; span questions read with the answer letters (a span head comes with the adapter)" if head else ""),
            **metric_blocks(b_rows, slices=False),
        }
        if head:
            baselines["base_model"]["span_read"] = "letters"
        if report["span"]["n"]:
            baselines["base_model"]["span"]["spans"] = span_metrics(base_predictions)
    report["baselines"] = baselines
    report["thresholds"] = threshold_report(rows, costs, thresholds)
    report |= {"classes": class_tables(predictions), "intervals": headline_intervals(rows)}
    if getattr(temperature, "conformal", None) is not None:  # sets and auto-act: what calibrate promised, checked
        report["guarantees"] = _guarantees(records, logits, rows, temperature, report["thresholds"])
    if coherence:
        report["coherence"] = _coherence(scorer, records, temperature, coherence, seed, progress)
    report["wall_s"] = time.perf_counter() - started
    return Evaluation(report, predictions, base_predictions, rows, raw_rows)


def _coherence(
    scorer: QuestionScorer,
    records: Sequence[Record],
    temperature: TemperatureLookup,
    cases: int,
    seed: int,
    progress: bool,
) -> dict[str, Any]:
    """report.json's ``coherence``: jevbench's laws on ``cases`` states, with this scoring and these temperatures."""
    return jevbench_coherence(wire_answerer(scorer, temperature), records, cases=cases, seed=seed, progress=progress)


def _guarantees(
    records: Sequence[Record], logits: Sequence[Any], rows: Sequence[Any], temperature: Any, thresholds: dict[str, Any]
) -> dict[str, Any]:
    """report.json's ``guarantees``: the conformal sets and risk-controlled auto-act of ``temperature``, checked."""
    span_items = [
        (r.task, gold_span_best(r, np.asarray(calibrated_probabilities("span", r.question.k, z, temperature))))
        for r, z in zip(records, logits, strict=True)
        if r.question.type == "span"
    ]
    return guarantee_report(rows, temperature.conformal, span_items, thresholds["auto_act_threshold"])


def _adapter_path(model: LoadedModel | None) -> str | None:
    """ "(loaded)" when the model carries an adapter (``evaluate_files`` writes the adapter's path instead)."""
    return "(loaded)" if has_adapter(model) else None


def _state_tokens(model: LoadedModel | None, records: Sequence[Record]) -> list[int]:
    """Tokens of each record's state (after the renderer's cut); characters / 4 without a model."""
    if model is None:
        return [len(render_state(r.state)) // 4 for r in records]
    renderer = model.renderer
    head = len(model.tokenizer(renderer.head, add_special_tokens=False)["input_ids"])
    return [len(renderer.encode_state(r.state)[0]) - head for r in records]


def _temperatures_used(records: Sequence[Record], temperature: TemperatureLookup) -> dict[str, dict[str, float]]:
    used: dict[str, dict[str, float]] = {}
    for r in records:
        kind = family(r.question)
        used.setdefault(kind, {})[str(r.question.k)] = temperature(kind, r.question.k)
    return {t: dict(sorted(v.items(), key=lambda kv: int(kv[0]))) for t, v in sorted(used.items())}


def _level_maps_used(records: Sequence[Record], temperature: TemperatureLookup) -> list[int]:
    """The K of each score question that went through a level map after its temperature."""
    return sorted({r.question.k for r in records if level_map_of(family(r.question), r.question.k, temperature)})


def evaluate_files(recipe: EvalRecipe, *, progress: bool = True) -> Evaluation:
    """``mydecide evaluate``: read the files (strictly: the first bad line is an error naming file and line),
    load the model, evaluate, and write every output into ``recipe.out``."""
    if not recipe.data:
        raise UserError("give the records to evaluate: --data FILE.jsonl [MORE.jsonl ...]")
    inputs: list[tuple[str, str | None]] = [("--data", str(path)) for path in recipe.data]
    inputs += [("--adapter", recipe.adapter), ("--temperatures", recipe.temperatures)]
    if recipe.model is not None and Path(recipe.model).exists():  # a local model, not a hub name
        inputs.append(("--model", recipe.model))
    check_report_dir(recipe.out, inputs)
    records: list[Record] = []
    files: list[str] = []
    warnings: list[str] = []
    for path in map(Path, recipe.data):
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such data file or split directory")
        loaded = load_records(path)
        if recipe.limit is not None:
            loaded = loaded[: recipe.limit]
        records += loaded
        files += [path.name] * len(loaded)
        reason = protected_split(path, recipe.adapter)
        if reason and "training" in reason:
            warnings.append(f"{reason}: these numbers are in-sample")
    for warning in warnings:
        print(f"[mydecide] warning: {warning}", file=sys.stderr)
    if recipe.temperatures is not None and not Path(recipe.temperatures).is_file():
        raise FileNotFoundError(f"{recipe.temperatures}: no such temperatures file")
    with directory_lock(recipe.out, "evaluate"):  # a second evaluate into the same --out stops here, naming this one
        return _evaluate(recipe, records, files, warnings, progress)


def _evaluate(
    recipe: EvalRecipe, records: list[Record], files: list[str], warnings: list[str], progress: bool
) -> Evaluation:
    train = split_beside(recipe.data, "train")
    prior = LabelPrior.from_file(train) if train is not None else None
    model = load_model(
        recipe.model,
        recipe.adapter,
        option_form=recipe.option_form,
        score_form=recipe.score_form,
        allow_other_base=recipe.allow_other_base,
    )
    evaluation = run_evaluation(
        model,
        records,
        recipe.temperatures,
        permutations=recipe.permutations,
        seed=recipe.seed,
        costs=recipe.costs.model_dump(),
        thresholds=recipe.thresholds,
        coherence=recipe.coherence,
        base=recipe.base,
        prior=prior,
        files=files,
        batch_size=recipe.batch_size,
        shared_prefix=recipe.shared_prefix,
        progress=progress,
    )
    report = evaluation.report
    report["adapter"] = recipe.adapter
    if (curves := training_curves(recipe.adapter)) is not None:  # an adapter in a run directory: train's dev curves
        report["training"] = curves
    report["data"] = [str(p) for p in recipe.data]
    report["warnings"] = warnings
    report["recipe"] = recipe.model_dump(mode="json")
    report["provenance"] = provenance()
    write_outputs(evaluation, recipe.out, dump_recipe(recipe, report["provenance"]))
    return evaluation
