"""Per option precision / recall / F1, confusion matrices and headline intervals of evaluation's report, on
predictions built by hand (exact values)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mydecide.evaluation.classes import class_tables, classes_markdown, headline_intervals
from mydecide.evaluation.rows import MetricRow


def choice(task: str, probs: dict[str, float], gold: str) -> dict[str, Any]:
    return {"task": task, "type": "choice", "probabilities": probs, "target": {k: float(k == gold) for k in probs}}


def test_a_choice_task_gets_its_confusion_matrix_and_per_option_scores() -> None:
    p = {"a": 0.7, "b": 0.2, "c": 0.1}
    q = {"a": 0.1, "b": 0.8, "c": 0.1}
    predictions = [
        choice("t", p, "a"),
        choice("t", p, "a"),
        choice("t", p, "b"),
        choice("t", q, "b"),
        choice("t", q, "c"),
    ]
    [table] = class_tables(predictions)
    assert table["options"] == ["a", "b", "c"]
    assert table["confusion"] == [[2, 0, 0], [1, 1, 0], [0, 1, 0]]  # gold rows, predicted columns
    assert table["per_option"]["a"] == {"precision": 2 / 3, "recall": 1.0, "f1": 0.8, "support": 2}
    assert table["per_option"]["b"] == {"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2}
    assert table["per_option"]["c"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    assert table["macro_f1"] == pytest.approx((0.8 + 0.5 + 0.0) / 3)
    markdown = "\n".join(classes_markdown({"classes": [table]}))
    assert "| gold \\ predicted | a | b | c |" in markdown and "| b | 1 | 1 | 0 |" in markdown
    assert "| a | 0.667 | 1.000 | 0.800 | 2 |" in markdown


def test_a_set_task_gets_per_label_counts_at_one_half() -> None:
    rows = [
        {"task": "tags", "type": "set", "probabilities": {"x": 0.9, "y": 0.2}, "target": {"x": 1.0, "y": 1.0}},
        {"task": "tags", "type": "set", "probabilities": {"x": 0.6, "y": 0.5}, "target": {"x": 0.0, "y": 0.0}},
        {"task": "other", "type": "noul", "probabilities": {"yes": 0.9, "no": 0.1}, "target": {"yes": 1.0, "no": 0.0}},
    ]
    [table] = class_tables(rows)
    assert table["confusion"] == {"x": [[0, 1], [0, 1]], "y": [[0, 1], [1, 0]]}  # [[tn, fp], [fn, tp]]
    assert table["per_option"]["x"] == {"precision": 0.5, "recall": 1.0, "f1": 2 / 3, "support": 1}
    assert table["per_option"]["y"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    assert table["macro_f1"] == pytest.approx(1 / 3)


def row(task: str, qtype: str, probs: list[float], gold: int) -> MetricRow:
    target = np.eye(len(probs))[gold]
    return MetricRow(0, qtype, task, "en", len(probs), 0, np.array(probs), target, False)


def test_headline_intervals_hold_the_metrics_and_leave_spans_out() -> None:
    rng = np.random.default_rng(0)
    rows = [row("t", "choice", list(rng.dirichlet([1, 1, 1])), int(rng.integers(3))) for _ in range(40)]
    rows += [row("s", "span", [0.9, 0.1], 0)]
    found = headline_intervals(rows)
    assert sorted(found) == ["all", "by_task", "choice"] and list(found["by_task"]) == ["t"]
    losses = [-np.log(r.probs[int(np.argmax(r.target))]) for r in rows[:40]]
    low, high = found["all"]["log_loss"]
    assert found["all"]["n"] == 40 and low < float(np.mean(losses)) < high
    markdown = "\n".join(classes_markdown({"intervals": found}))
    assert f"| all | 40 | {found['all']['accuracy'][0]:.3f} – {found['all']['accuracy'][1]:.3f} |" in markdown
