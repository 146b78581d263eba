"""Fitting the ``conformal`` section of temperatures.json on dev (``calibrate --alpha α`` and / or ``--max-risk ε``).

The dev questions' probabilities are the calibrated ones (temperature, then a score question's level map), the ones
evaluate, predict and serve answer with, so a set fitted here is a set of the served distribution. Per question type
(and per task with at least ``min_rows`` dev questions, and enough for α):

* choice / score: the conformal score with the smaller mean set on dev (``conformal.choose_score``), then q̂;
* yes/no, and each label of a set question: sets {yes}, {no} or {yes, no} from 1 − p;
* span: per label with enough questions that hold its gold spans, else one pooled threshold, the word threshold that
  bounds the rate of missed gold spans (conformal risk control);
* auto-act (with ``max_risk``): Learn then Test over the top probability (a set question: its least certain label).

A type on dev with fewer questions than α needs is refused in one line (``conformal.min_rows_for``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mydecide.calibration.conformal import (
    SCORES,
    TooFewRows,
    choose_score,
    conformal_quantile,
    fewest_answers,
    gold_scores,
    learn_then_test,
    min_rows_for,
    quantile_rank,
    span_threshold,
)
from mydecide.calibration.conformal_table import confidence
from mydecide.calibration.level_maps import level_map_from_json
from mydecide.calibration.temperatures import TemperatureTable
from mydecide.errors import UserError
from mydecide.records import Record
from mydecide.scoring.probabilities import TemperatureLookup, calibrated_probabilities, to_probabilities
from mydecide.scoring.yes_no import family
from mydecide.spans import state_part, words

KIND = {"choice": "choice", "noul": "binary", "score": "score", "set": "binary"}


def table_of(fit: dict[str, Any]) -> TemperatureTable:
    """The temperatures and level maps of ``fit`` (what ``fit_temperatures`` returns) as evaluate would load them."""
    buckets = {
        t: {b: s["temperature"] for b, s in bs.items() if "fallback" not in s} for t, bs in fit["buckets"].items()
    }
    maps = {
        int(k): level_map_from_json(entry, f"level_maps.{k}")
        for k, entry in fit.get("level_maps", {}).items()
        if "fallback" not in entry
    }
    return TemperatureTable({t: s["temperature"] for t, s in fit["types"].items()}, buckets, None, maps)


def set_rows(qtype: str, probs: np.ndarray, target: Sequence[float]) -> list[tuple[np.ndarray, int]]:
    """(probabilities, gold index) rows a question adds to its type's conformal fit: itself, or per set label
    ((p, 1 − p), 0 for yes)."""
    if qtype == "set":
        return [(np.array([p, 1.0 - p]), 0 if y >= 0.5 else 1) for p, y in zip(probs, target, strict=True)]
    return [(np.asarray(probs, dtype=np.float64), int(np.argmax(target)))]


def wrong_answer(qtype: str, probs: np.ndarray, target: Sequence[float]) -> bool:
    """Whether auto-acting on the answer would be wrong: the top option is not gold (a set: any label)."""
    if qtype == "set":
        return bool(np.any((np.asarray(probs) >= 0.5) != (np.asarray(target) >= 0.5)))
    return int(np.argmax(probs)) != int(np.argmax(target))


def gold_span_best(record: Record, grid: np.ndarray) -> dict[str, np.ndarray]:
    """Per label of a span question with gold spans: the highest word probability inside each of them."""
    q = record.question
    offsets = words(state_part(record.state, q.over))
    k = len(q.options)
    out: dict[str, list[float]] = {}
    for span in record.spans:
        j = q.options.index(span.label)
        inside = [i for i, (a, b) in enumerate(offsets) if a < span.end and span.start < b]
        out.setdefault(span.label, []).append(max((float(grid[i * k + j]) for i in inside), default=0.0))
    return {label: np.array(v) for label, v in out.items()}


def _set_rule(rows: list[tuple[np.ndarray, int]], score: str, alpha: float) -> dict[str, Any]:
    probs, gold = [p for p, _ in rows], [g for _, g in rows]
    q = conformal_quantile(gold_scores(score, probs, gold), alpha)
    n = len(rows)
    return {"score": score, "alpha": alpha, "n": n, "threshold": q, "level": quantile_rank(n, alpha) / n}


def fit_conformal(
    records: Sequence[Record],
    logits: Sequence[np.ndarray],
    table: TemperatureLookup,
    *,
    alpha: float | None,
    max_risk: float | None,
    delta: float,
    min_rows: int,
) -> dict[str, Any]:
    """The ``conformal`` section of temperatures.json for dev ``records`` and their ``logits`` under ``table``."""
    by_type: dict[str, list[tuple[np.ndarray, int]]] = {}
    by_task: dict[str, tuple[str, list[tuple[np.ndarray, int]]]] = {}
    acted: dict[str, list[tuple[float, bool, str]]] = {}
    span_best: dict[str, list[np.ndarray]] = {}
    mixed: set[str] = set()
    for record, z in zip(records, logits, strict=True):
        q = record.question
        if q.type == "span":
            for label, best in gold_span_best(record, to_probabilities("span", z, table("span", q.k))).items():
                span_best.setdefault(label, []).append(best)
            continue
        p = calibrated_probabilities(family(q), q.k, z, table)
        rows = set_rows(q.type, p, record.target)
        by_type.setdefault(q.type, []).extend(rows)
        by_task.setdefault(record.task, (q.type, []))[1].extend(rows)
        if by_task[record.task][0] != q.type:  # a task of several types gets only its types' rules
            mixed.add(record.task)
        wrong = wrong_answer(q.type, p, record.target)
        acted.setdefault(q.type, []).append((confidence(q.type, p), wrong, record.task))
    section: dict[str, Any] = {"alpha": alpha, "max_risk": max_risk, "delta": delta if max_risk else None}
    section["dev_tasks"] = sorted({r.task for r in records})
    by_task = {task: rows for task, rows in by_task.items() if task not in mixed}
    if alpha is not None:
        section |= _sets(by_type, by_task, span_best, alpha, min_rows)
    if max_risk is not None:
        section["auto_act"], section["task_auto_act"] = _auto_act(acted, max_risk, delta, min_rows, mixed)
    return section


def _sets(
    by_type: dict[str, list[tuple[np.ndarray, int]]],
    by_task: dict[str, tuple[str, list[tuple[np.ndarray, int]]]],
    span_best: dict[str, list[np.ndarray]],
    alpha: float,
    min_rows: int,
) -> dict[str, Any]:
    need = min_rows_for(alpha)
    sets: dict[str, Any] = {}
    for qtype, rows in sorted(by_type.items()):
        if len(rows) < need:
            what = "set label rows" if qtype == "set" else f"{qtype} questions"
            raise UserError(
                f"dev holds {len(rows)} {what}, too few for --alpha {alpha:g}: a conformal set needs "
                f"⌈(n + 1)(1 − α)⌉ ≤ n, at least {need} (use a larger α or more dev data)"
            )
        score, sizes = choose_score(SCORES[KIND[qtype]], [p for p, _ in rows], [g for _, g in rows], alpha)
        sets[qtype] = _set_rule(rows, score, alpha) | ({"mean_size_by_score": sizes} if sizes else {})
    task_sets = {
        task: {"type": qtype, **_set_rule(rows, sets[qtype]["score"], alpha)}
        for task, (qtype, rows) in sorted(by_task.items())
        if len(rows) >= max(min_rows, need)
    }
    out: dict[str, Any] = {"sets": sets, "task_sets": task_sets}
    if span_best:
        pooled = [best for label in sorted(span_best) for best in span_best[label]]
        try:
            default = span_threshold(pooled, alpha)
        except TooFewRows:
            raise UserError(
                f"dev holds {len(pooled)} span question × label pairs with gold spans, too few for --alpha {alpha:g}: "
                f"it needs at least {need}"
            ) from None
        labels = {
            label: {"threshold": span_threshold(best, alpha), "n": len(best)}
            for label, best in sorted(span_best.items())
            if len(best) >= max(min_rows, need)
        }
        out["spans"] = {"alpha": alpha, "n": len(pooled), "default_threshold": default, "thresholds": labels}
    return out


def _auto_act(
    acted: dict[str, list[tuple[float, bool, str]]], max_risk: float, delta: float, min_rows: int, mixed: set[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    def rule(rows: list[tuple[float, bool, str]], qtype: str) -> dict[str, Any]:
        found = learn_then_test(np.array([c for c, _, _ in rows]), np.array([w for _, w, _ in rows]), max_risk, delta)
        return {"type": qtype, "max_risk": max_risk, "delta": delta, "n": len(rows), **found}

    types = {qtype: rule(rows, qtype) for qtype, rows in sorted(acted.items())}
    tasks: dict[str, Any] = {}
    for qtype, rows in sorted(acted.items()):
        for task in sorted({t for _, _, t in rows}):
            mine = [r for r in rows if r[2] == task]
            if len(mine) >= min_rows and task not in mixed:
                tasks[task] = rule(mine, qtype)
    return types, tasks


def describe(section: dict[str, Any]) -> list[str]:
    """calibrate's lines for the conformal section."""
    lines = []
    for qtype, s in section.get("sets", {}).items():
        sizes = s.get("mean_size_by_score")
        measured = f" (mean dev set size {', '.join(f'{k} {v:.2f}' for k, v in sizes.items())})" if sizes else ""
        lines.append(
            f"{qtype}: conformal sets at alpha {s['alpha']:g} on {s['n']} dev rows: score {s['score']}, threshold "
            f"{s['threshold']:.4f} (the {s['level']:.4f} quantile){measured}"
        )
    if section.get("task_sets"):
        lines.append(f"conformal sets per task: {', '.join(section['task_sets'])}")
    spans = section.get("spans")
    if spans:
        own = ", ".join(f"{label} {e['threshold']:.3f}" for label, e in spans["thresholds"].items())
        lines.append(
            f"span: missed gold spans bounded at {spans['alpha']:g}: word threshold {own + '; ' if own else ''}"
            f"any other label {spans['default_threshold']:.3f} ({spans['n']} question × label pairs)"
        )
    for qtype, a in section.get("auto_act", {}).items():
        if a["threshold"] is None:
            least = fewest_answers(a["max_risk"], a["delta"])
            lines.append(
                f"{qtype}: no threshold shows an error rate ≤ {a['max_risk']:g} at delta {a['delta']:g} on {a['n']} "
                f"dev questions (one can pass only with {least} or more answered): every answer escalates"
            )
            continue
        lines.append(
            f"{qtype}: auto-act at p ≥ {a['threshold']:.3f} (error rate ≤ {a['max_risk']:g} with probability ≥ "
            f"{1 - a['delta']:g}): answers {a['answered']:.1%} of {a['n']} dev questions, dev error {a['dev_risk']:.3f}"
        )
    return lines
