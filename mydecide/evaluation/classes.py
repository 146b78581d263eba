"""What a classifier's user reads beside the calibration metrics: per option precision / recall / F1 and the confusion
matrix of each choice task, the same per label of each set task (each label a yes / no decision at 0.5, as the set
metrics read it), and bootstrap intervals on the headline accuracy and log loss.

:func:`class_tables` reads predictions.jsonl's rows (they name each option), :func:`headline_intervals` the metric
rows; report.json holds both (``classes``, ``intervals``), report.md shows them (:func:`classes_markdown`) and
confusion.png plots the matrices (:func:`plot_confusions`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mydecide import metrics
from mydecide.io import atomic_write_figure
from mydecide.records import QUESTION_TYPES

if TYPE_CHECKING:
    from mydecide.evaluation.rows import MetricRow

CONFUSION_PLOT = "confusion.png"
LEVEL = 0.95  # the intervals' confidence level


def _first(values: Sequence[float]) -> int:
    """The first index of the largest value (the metrics' argmax rule)."""
    return int(np.argmax(np.asarray(values, dtype=float)))


def class_tables(predictions: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One table per choice task and per set task, in task order: its options (labels), the confusion matrix
    (choice: rows gold, columns predicted; set: per label ``[[tn, fp], [fn, tp]]``), per option precision, recall,
    F1 and support, and the macro F1."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for p in predictions:
        if p["type"] in ("choice", "set"):
            groups.setdefault((p["task"], p["type"]), []).append(p)
    return [
        (_choice_table if qtype == "choice" else _set_table)(task, rows)
        for (task, qtype), rows in sorted(groups.items())
    ]


def _per_option(options: list[str], matrix: np.ndarray) -> dict[str, dict[str, float | int]]:
    found = metrics.per_option(matrix)
    return {
        option: {
            "precision": float(found["precision"][i]),
            "recall": float(found["recall"][i]),
            "f1": float(found["f1"][i]),
            "support": int(found["support"][i]),
        }
        for i, option in enumerate(options)
    }


def _choice_table(task: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    options = list(dict.fromkeys(option for p in rows for option in p["probabilities"]))
    index = {option: i for i, option in enumerate(options)}
    gold, predicted = [], []
    for p in rows:
        keys = list(p["probabilities"])
        gold.append(index[keys[_first([p["target"][key] for key in keys])]])
        predicted.append(index[keys[_first(list(p["probabilities"].values()))]])
    matrix = metrics.confusion(gold, predicted, len(options))
    return {
        "task": task,
        "type": "choice",
        "n": len(rows),
        "options": options,
        "confusion": matrix.tolist(),
        "per_option": _per_option(options, matrix),
        "macro_f1": metrics.macro_f1(matrix),
    }


def _set_table(task: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    labels = list(dict.fromkeys(label for p in rows for label in p["probabilities"]))
    counts = {label: np.zeros((2, 2), dtype=np.int64) for label in labels}  # [[tn, fp], [fn, tp]]
    for p in rows:
        for label, prob in p["probabilities"].items():
            counts[label][int(p["target"][label] >= 0.5), int(prob >= 0.5)] += 1
    per_label = {}
    for label, c in counts.items():
        tp, fp, fn = int(c[1, 1]), int(c[0, 1]), int(c[1, 0])
        precision = tp / (tp + fp) if tp + fp else 0.0
        recall = tp / (tp + fn) if tp + fn else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        per_label[label] = {"precision": precision, "recall": recall, "f1": f1, "support": tp + fn}
    seen = [label for label, c in counts.items() if c[1, 1] + c[0, 1] + c[1, 0]]
    return {
        "task": task,
        "type": "set",
        "n": len(rows),
        "options": labels,
        "confusion": {label: c.tolist() for label, c in counts.items()},
        "per_option": per_label,
        "macro_f1": float(np.mean([per_label[label]["f1"] for label in seen])) if seen else 1.0,
    }


def _interval_block(rows: Sequence[MetricRow]) -> dict[str, Any]:
    probs, targets = [r.probs for r in rows], [r.target for r in rows]
    return {
        "n": len(rows),
        "level": LEVEL,
        "accuracy": list(metrics.mean_interval(metrics.correct_flags(probs, targets), LEVEL)),
        "log_loss": list(metrics.mean_interval(metrics.log_losses(probs, targets), LEVEL)),
    }


def headline_intervals(rows: Sequence[MetricRow]) -> dict[str, Any]:
    """Bootstrap intervals (95 %, percentile, ``metrics.mean_interval``) of accuracy and log loss for "all" (span
    cells left out, as the "all" block does), each question type and each task; the rows are resampled as the
    metrics count them (a set question's labels are rows)."""
    out: dict[str, Any] = {}
    questions = [r for r in rows if r.qtype != "span"]
    if questions:
        out["all"] = _interval_block(questions)
    for qtype in QUESTION_TYPES:
        group = [r for r in rows if r.qtype == qtype]
        if group and qtype != "span":
            out[qtype] = _interval_block(group)
    tasks = sorted({r.task for r in questions})
    out["by_task"] = {task: _interval_block([r for r in questions if r.task == task]) for task in tasks}
    return out


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if math.isfinite(value) else str(value)
    return str(value).replace("|", "\\|")


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return [*lines, *("| " + " | ".join(_cell(v) for v in row) + " |" for row in rows), ""]


def _range(pair: Sequence[float]) -> str:
    return f"{pair[0]:.3f} – {pair[1]:.3f}"


def classes_markdown(report: dict[str, Any]) -> list[str]:
    """report.md's "Intervals" and "Per option" sections (nothing when the report has neither)."""
    lines: list[str] = []
    intervals = report.get("intervals") or {}
    if intervals:
        lines += ["## Intervals", "", "95 % percentile bootstrap over the questions (scipy.stats.bootstrap).", ""]
        named = [(name, intervals[name]) for name in ("all", *QUESTION_TYPES) if name in intervals]
        named += [(f"task {task}", block) for task, block in intervals.get("by_task", {}).items()]
        lines += _table(
            ["", "n", "accuracy", "log loss"],
            [[name, b["n"], _range(b["accuracy"]), _range(b["log_loss"])] for name, b in named],
        )
    tables = report.get("classes") or []
    if tables:
        lines += ["## Per option", "", f"![confusion matrices]({CONFUSION_PLOT})", ""]
    for t in tables:
        lines += [f"### {t['task']} ({t['type']}, {t['n']} questions, macro F1 {t['macro_f1']:.3f})", ""]
        lines += _table(
            ["option", "precision", "recall", "F1", "support"],
            [[o, v["precision"], v["recall"], v["f1"], v["support"]] for o, v in t["per_option"].items()],
        )
        if t["type"] == "choice":
            lines += _table(
                ["gold \\ predicted", *t["options"]],
                [[o, *row] for o, row in zip(t["options"], t["confusion"], strict=True)],
            )
        else:
            lines += _table(
                ["label", "tn", "fp", "fn", "tp"],
                [[label, c[0][0], c[0][1], c[1][0], c[1][1]] for label, c in t["confusion"].items()],
            )
    return lines


def plot_confusions(tables: Sequence[dict[str, Any]], path: str | Path) -> None:
    """confusion.png: one panel per table, counts in the cells (a choice task: gold × predicted; a set task: its
    labels × tn, fp, fn, tp). Written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tables), figsize=(4.5 * len(tables), 4.2), squeeze=False)
    for ax, t in zip(axes[0], tables, strict=True):
        if t["type"] == "choice":
            grid = np.asarray(t["confusion"])
            rows, columns, xlabel = t["options"], t["options"], "predicted"
        else:
            grid = np.asarray([[c[0][0], c[0][1], c[1][0], c[1][1]] for c in t["confusion"].values()])
            rows, columns, xlabel = t["options"], ["tn", "fp", "fn", "tp"], "label decision"
        ax.imshow(grid, cmap="Blues")
        for (i, j), value in np.ndenumerate(grid):
            ax.text(j, i, str(value), ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(columns)), columns, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(rows)), rows, fontsize=8)
        ax.set(xlabel=xlabel, ylabel="gold" if t["type"] == "choice" else "label", title=f"{t['task']} ({t['type']})")
    fig.tight_layout()
    atomic_write_figure(path, fig)
