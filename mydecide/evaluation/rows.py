"""Metric rows and slices: every scored question as rows, and every metric of any group of rows.

A question is one row; a ``set`` question one yes/no row per label, a ``span`` question one per word × label cell
(``scoring.probabilities.answer_rows``), its spans scored by :func:`span_metrics`. Every
block counts those rows (``n``) and the questions they come from (``questions``) separately. The report is a
function of predictions.jsonl: :func:`rows_from_predictions` rebuilds the rows from it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mydecide import metrics
from mydecide.calibration.temperatures import option_bucket
from mydecide.records import QUESTION_TYPES, Question, Record
from mydecide.scoring.probabilities import answer_rows
from mydecide.spans import SpanDecisions, merge_spans, state_part

STATE_TOKEN_BUCKETS = (128, 512, 2048)
METRIC_KEYS = (
    "n",
    "questions",
    "accuracy",
    "chance_corrected",
    "log_loss",
    "brier",
    "ece",
    "ece_band",
    "rps",
    "aurc",
    "soft_accuracy",
    "total_variation",
    "n_soft",
    "flip_rate",
    "flip_n",
    "latency_p50_ms",
    "latency_p95_ms",
)


@dataclass(frozen=True)
class MetricRow:
    """One scored probability row: a question, or one label of a set question (a yes/no row)."""

    question: int  # index of the question the row comes from
    qtype: str
    task: str
    lang: str
    k: int  # options of the question (set: labels)
    state_tokens: int
    probs: np.ndarray  # (K,) predicted distribution (set label: (P(yes), P(no)))
    target: np.ndarray  # (K,) target distribution
    soft: bool
    flipped: bool | None = None
    latency: float | None = None
    file: str = ""
    label: str = ""  # set label rows: the label


@dataclass
class Evaluation:
    """Everything one evaluation produced: the report, the per-question predictions, the plot's data."""

    report: dict[str, Any]
    predictions: list[dict[str, Any]]
    base_predictions: list[dict[str, Any]] | None = None
    rows: list[MetricRow] = field(default_factory=list)  # calibrated rows of the model
    raw_rows: list[MetricRow] | None = None  # the same at T = 1, when temperatures were given


def question_rows(
    n: int,
    record: Record,
    probs: np.ndarray,
    *,
    state_tokens: int = 0,
    flipped: bool | None = None,
    latency: float | None = None,
    file: str = "",
) -> list[MetricRow]:
    """The metric rows of one question: itself, or one binary row per set label."""
    q = record.question
    common: dict[str, Any] = {
        "question": n,
        "qtype": q.type,
        "task": record.task,
        "lang": record.lang,
        "k": q.k,
        "state_tokens": state_tokens,
        "soft": record.soft,
        "latency": latency,
        "file": file,
    }
    return _rows(common, probs, record.target, q.options, flipped)


def _rows(
    common: dict[str, Any], probs: Any, target: Any, options: Sequence[str], flipped: bool | None
) -> list[MetricRow]:
    pairs = answer_rows(common["qtype"], probs, target)
    if common["qtype"] == "span":  # word × label cells, word-major
        return [
            MetricRow(probs=p, target=y, label=options[n % len(options)], **common) for n, (p, y) in enumerate(pairs)
        ]
    if common["qtype"] != "set":
        return [MetricRow(probs=p, target=y, flipped=flipped, **common) for p, y in pairs]
    return [MetricRow(probs=p, target=y, label=label, **common) for (p, y), label in zip(pairs, options, strict=True)]


def _percentile_ms(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values) * 1000.0, q)) if values else None


def block(rows: Sequence[MetricRow]) -> dict[str, Any]:
    """Every metric of one group of rows (all keys of ``METRIC_KEYS``; values None where not defined)."""
    if not rows:
        return dict.fromkeys(METRIC_KEYS, None) | {"n": 0, "questions": 0}
    probs = [r.probs for r in rows]
    targets = [r.target for r in rows]
    out: dict[str, Any] = metrics.summarize(probs, targets, [r.qtype == "score" for r in rows])
    out["questions"] = len({r.question for r in rows})
    out["types"] = [t for t in QUESTION_TYPES if any(r.qtype == t for r in rows)]
    soft = [r for r in rows if r.soft]
    out["n_soft"] = len(soft)
    out["soft_accuracy"] = metrics.soft_accuracy([r.probs for r in soft], [r.target for r in soft]) if soft else None
    out["total_variation"] = (
        metrics.total_variation([r.probs for r in soft], [r.target for r in soft]) if soft else None
    )
    flips = [r.flipped for r in rows if r.flipped is not None]
    out["flip_rate"] = float(np.mean(flips)) if flips else None
    out["flip_n"] = len(flips)
    latencies = list({r.question: r.latency for r in rows if r.latency is not None}.values())
    out["latency_p50_ms"] = _percentile_ms(latencies, 50)
    out["latency_p95_ms"] = _percentile_ms(latencies, 95)
    set_rows = [r for r in rows if r.qtype == "set"]
    if set_rows:
        out.update(set_metrics(set_rows))
    score_rows = [r for r in rows if r.qtype == "score"]
    if score_rows:
        out["ordinal"] = metrics.ordinal_summary([r.probs for r in score_rows], [r.target for r in score_rows])
    return {key: out.get(key) for key in METRIC_KEYS} | {k: v for k, v in out.items() if k not in METRIC_KEYS}


def _f1(tp: int, fp: int, fn: int) -> float:
    """F1 of counts; 1.0 when there is nothing to find and nothing was predicted."""
    return 2 * tp / (2 * tp + fp + fn) if (tp + fp + fn) else 1.0


def set_metrics(rows: Sequence[MetricRow]) -> dict[str, Any]:
    """Metrics of the label rows of set questions, each label a yes/no decision at 0.5.

    ``exact_set_accuracy``: every label of a question right; ``micro_f1``: F1 of the pooled label decisions;
    ``macro_f1``: the mean F1 of each label (a task's label; a label never gold nor predicted counts 1.0);
    ``label_log_loss``: the mean binary log loss per label row; ``by_label``: n, log loss and F1 per label.
    """
    right: dict[int, bool] = {}
    counts: dict[str, list[int]] = {}  # label → [tp, fp, fn]
    per_label: dict[str, list[MetricRow]] = {}
    for r in rows:
        predicted, gold = bool(r.probs[0] >= 0.5), bool(r.target[0] >= 0.5)
        right[r.question] = right.get(r.question, True) and predicted == gold
        key = f"{r.task}/{r.label}" if r.label else r.task
        c = counts.setdefault(key, [0, 0, 0])
        c[0] += predicted and gold
        c[1] += predicted and not gold
        c[2] += gold and not predicted
        per_label.setdefault(key, []).append(r)
    tp, fp, fn = (sum(c[i] for c in counts.values()) for i in range(3))
    return {
        "exact_set_accuracy": float(np.mean(list(right.values()))),
        "micro_f1": _f1(tp, fp, fn),
        "macro_f1": float(np.mean([_f1(*c) for c in counts.values()])),
        "label_log_loss": metrics.log_loss([r.probs for r in rows], [r.target for r in rows]),
        "by_label": {
            key: {
                "n": len(got),
                "log_loss": metrics.log_loss([r.probs for r in got], [r.target for r in got]),
                "f1": _f1(*counts[key]),
            }
            for key, got in sorted(per_label.items())
        },
    }


def state_bucket(tokens: int) -> str:
    """State length bucket in tokens: 0-127, 128-511, 512-2047, 2048+."""
    low = 0
    for edge in STATE_TOKEN_BUCKETS:
        if tokens < edge:
            return f"{low}-{edge - 1}"
        low = edge
    return f"{low}+"


def confidence_bin(row: MetricRow, bins: int = 10) -> str:
    """The equal-width bin of the row's top probability, e.g. "0.6-0.7" (1.0 falls in the last bin)."""
    b = min(math.floor(float(np.max(row.probs)) * bins), bins - 1)
    return f"{b / bins:.1f}-{(b + 1) / bins:.1f}"


SLICES: dict[str, Callable[[MetricRow], str]] = {
    "lang": lambda r: r.lang,
    "option_count": lambda r: option_bucket(r.k),
    "state_tokens": lambda r: state_bucket(r.state_tokens),
    "confidence": confidence_bin,
}


def _group(rows: Sequence[MetricRow], key: Callable[[MetricRow], str]) -> dict[str, list[MetricRow]]:
    groups: dict[str, list[MetricRow]] = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    return groups


def _bucket_order(name: str) -> tuple[float, str]:
    head = name.split("-")[0].rstrip("+")
    try:
        return float(head), name
    except ValueError:
        return math.inf, name


def metric_blocks(rows: Sequence[MetricRow], *, slices: bool = True) -> dict[str, Any]:
    """ "all", one block per question type, "by_task", "by_file" (several files) and, optionally, "slices".

    "all" holds every question but span questions: a span question is hundreds of word × label cells, which would
    outweigh every other question; its cells are in the "span" block (and its span-level F1 beside them)."""
    out: dict[str, Any] = {"all": block([r for r in rows if r.qtype != "span"])}
    for qtype in QUESTION_TYPES:
        out[qtype] = block([r for r in rows if r.qtype == qtype])
    out["by_task"] = {task: block(group) for task, group in sorted(_group(rows, lambda r: r.task).items())}
    files = _group(rows, lambda r: r.file)
    if len(files) > 1:
        out["by_file"] = {name: block(group) for name, group in files.items()}
    if slices:
        out["slices"] = {
            name: {
                value: block(group)
                for value, group in sorted(_group(rows, key).items(), key=lambda kv: _bucket_order(kv[0]))
            }
            for name, key in SLICES.items()
        }
    return out


def _keyed(question: Question, values: Sequence[float] | np.ndarray) -> dict[str, float]:
    """Probabilities keyed by option id (noul: yes/no, score: level index as a string, set: label)."""
    return {option: float(v) for option, v in zip(question.options, values, strict=True)}


def prediction_row(
    record: Record,
    logits: np.ndarray,
    probs: np.ndarray,
    temperature: float,
    *,
    latency: float | None,
    flipped: bool | None,
    state_tokens: int,
    file: str,
    decisions: SpanDecisions | None = None,
    level_map: bool = False,
) -> dict[str, Any]:
    """One line of predictions.jsonl. ``level_map``: the probabilities went through a score level map after the
    temperature (``calibration.level_maps``), so they are not softmax(logits / temperature)."""
    q = record.question
    # a span question: its grid, predicted and gold spans instead of per-option probabilities
    answer = (
        span_prediction(record, probs, decisions)
        if q.type == "span"
        else {"probabilities": _keyed(q, probs), "gold": record.answer_json(), "target": _keyed(q, record.target)}
    )
    return {
        "id": record.id,
        "task": record.task,
        "type": q.type,
        "lang": record.lang,
        "k": q.k,
        "file": file,
        "state_tokens": state_tokens,
        **answer,
        "soft": record.soft,
        "logits": [float(z) for z in logits],
        "temperature": temperature,
        **({"level_map": True} if level_map else {}),
        "latency_ms": None if latency is None else latency * 1000.0,
        "flipped": flipped,
    }


def rows_from_predictions(predictions: Sequence[dict[str, Any]]) -> list[MetricRow]:
    """Metric rows rebuilt from predictions.jsonl rows (the report is a function of this file)."""
    rows: list[MetricRow] = []
    for n, p in enumerate(predictions):
        if p["type"] == "span":
            options, probs, target = p["labels"], np.array(p["grid"]), np.array(p["target_grid"])
        else:
            options = list(p["probabilities"])
            probs = np.array([p["probabilities"][o] for o in options])
            target = np.array([p["target"][o] for o in options])
        latency = None if p.get("latency_ms") is None else p["latency_ms"] / 1000.0
        common: dict[str, Any] = {
            "question": n,
            "qtype": p["type"],
            "task": p["task"],
            "lang": p["lang"],
            "k": p["k"],
            "state_tokens": p["state_tokens"],
            "soft": p["soft"],
            "latency": latency,
            "file": p.get("file", ""),
        }
        rows += _rows(common, probs, target, options, p["flipped"])
    return rows


# ------------------------------------------------------------------------------------------------ span questions
# Span-level metrics: word-level log loss and ECE come with every type's block (a span question's rows are its word ×
# label cells); these score the located spans themselves, from predictions.jsonl rows, so the report stays a function
# of that file. A predicted span matches a gold span of the same label **exactly** when start and end are equal, and
# **by overlap** when their offsets overlap; under overlap each gold and each predicted span is matched at most once
# (greedily, in order), so a gold span split into two predictions counts one hit.

Triple = tuple[str, int, int]  # (label, start, end)


def span_prediction(
    record: Record, probs: Sequence[float] | np.ndarray, decisions: SpanDecisions | None = None
) -> dict[str, Any]:
    """The span part of a prediction row: the grid, its gold, the predicted spans (cut by ``decisions``: per-label
    thresholds and span probabilities fitted on dev) and the gold spans."""
    part = state_part(record.state, record.question.over)
    grid = [float(p) for p in probs]
    return {
        "labels": list(record.question.options),
        "grid": grid,
        "target_grid": [float(y) for y in record.target],
        "spans": merge_spans(part, grid, record.question.options, decisions),
        "gold": [s.to_json(part) for s in record.spans],
    }


def match_counts(gold: Iterable[Triple], predicted: Iterable[Triple]) -> dict[str, tuple[int, int, int]]:
    """(tp, fp, fn) under ``exact`` and ``overlap`` match for one question's spans."""
    gold, predicted = sorted(gold), sorted(predicted)
    exact = len(set(gold) & set(predicted))
    used: set[int] = set()
    overlap = 0
    for label, start, end in predicted:
        for n, (g_label, g_start, g_end) in enumerate(gold):
            if n not in used and g_label == label and g_start < end and start < g_end:
                used.add(n)
                overlap += 1
                break
    return {
        "exact": (exact, len(predicted) - exact, len(gold) - exact),
        "overlap": (overlap, len(predicted) - overlap, len(gold) - overlap),
    }


def _prf(tp: int, fp: int, fn: int) -> dict[str, float]:
    """Precision, recall and F1 of counts (1.0 where there was nothing to find and nothing was found)."""
    return {
        "precision": tp / (tp + fp) if tp + fp else 1.0,
        "recall": tp / (tp + fn) if tp + fn else 1.0,
        "f1": 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 1.0,
    }


def span_metrics(predictions: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Span-level metrics over the span rows of predictions.jsonl (None when there are none): ``exact`` and
    ``overlap`` precision / recall / F1 pooled over every span, and ``by_label`` (keyed ``task/label``) the same
    with the gold and predicted counts and a 95% bootstrap interval of the exact F1 (questions resampled)."""
    rows = [p for p in predictions if p.get("type") == "span"]
    if not rows:
        return None
    totals = {"exact": [0, 0, 0], "overlap": [0, 0, 0]}
    per_label: dict[str, dict[str, list[int]]] = {}
    per_question: dict[str, list[tuple[int, int, int]]] = {}  # label → each of its questions' exact (tp, fp, fn)
    located: list[tuple[float, bool]] = []  # (probability, exactly right) of every predicted span
    for p in rows:
        gold_all = {(s["label"], s["start"], s["end"]) for s in p["gold"]}
        located += [(s["probability"], (s["label"], s["start"], s["end"]) in gold_all) for s in p["spans"]]
        for label in p["labels"]:
            gold = [(s["label"], s["start"], s["end"]) for s in p["gold"] if s["label"] == label]
            predicted = [(s["label"], s["start"], s["end"]) for s in p["spans"] if s["label"] == label]
            counts = per_label.setdefault(f"{p['task']}/{label}", {"exact": [0, 0, 0], "overlap": [0, 0, 0]})
            matched = match_counts(gold, predicted)
            per_question.setdefault(f"{p['task']}/{label}", []).append(matched["exact"])
            for kind, values in matched.items():
                for i, v in enumerate(values):
                    counts[kind][i] += v
                    totals[kind][i] += v
    span_ece, span_ece_band = metrics.span_ece(located)
    return {
        "questions": len(rows),
        "span_ece": span_ece,
        "span_ece_band": span_ece_band,
        "gold_spans": totals["exact"][0] + totals["exact"][2],
        "predicted_spans": totals["exact"][0] + totals["exact"][1],
        "exact": _prf(*totals["exact"]),
        "overlap": _prf(*totals["overlap"]),
        "by_label": {
            key: {
                "gold": c["exact"][0] + c["exact"][2],
                "predicted": c["exact"][0] + c["exact"][1],
                "exact": _prf(*c["exact"]),
                "exact_f1_ci95": list(metrics.f1_interval(np.array(per_question[key]))),
                "overlap": _prf(*c["overlap"]),
            }
            for key, c in sorted(per_label.items())
        },
    }
