"""Evaluation of span questions: exact / overlap span F1 per label, word-level log loss and ECE, report.md."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mydecide.evaluation.rows import match_counts, metric_blocks, rows_from_predictions, span_metrics
from mydecide.evaluation.run import run_evaluation
from mydecide.records import Question, parse_record
from mydecide.spans import words

CRITERIA = {"PERSON": "a name", "EMAIL": "an e-mail address"}


def test_exact_and_overlap_matching() -> None:
    gold = [("PERSON", 5, 14), ("PERSON", 30, 40)]
    predicted = [("PERSON", 5, 14), ("PERSON", 28, 33), ("PERSON", 35, 38), ("PERSON", 50, 55)]
    counts = match_counts(gold, predicted)
    assert counts["exact"] == (1, 3, 1)
    assert counts["overlap"] == (2, 2, 0)  # 35..38 overlaps a gold span already matched by 28..33
    assert match_counts([], []) == {"exact": (0, 0, 0), "overlap": (0, 0, 0)}


def span_records() -> list:
    rows = [
        ("Call Anna Berg at anna.berg@example.se before Friday.", [("PERSON", 5, 14), ("EMAIL", 18, 38)]),
        ("Omar Lind wrote again.", [("PERSON", 0, 9)]),
        ("Nothing personal here.", []),
    ]
    out = []
    for text, spans in rows:
        out += parse_record(
            {
                "task": "pii",
                "state": text,
                "question": {"type": "span", "instructions": "Personal data?", "criteria": CRITERIA},
                "answer": [{"label": label, "start": a, "end": b} for label, a, b in spans],
            }
        )
    out += parse_record(
        {
            "task": "route",
            "state": "The invoice is wrong.",
            "question": {"type": "choice", "instructions": "Team?", "criteria": ["billing", "support"]},
            "answer": "billing",
        }
    )
    return out


def scorer(items: Sequence[tuple[Any, Question]], orders: Any = None) -> list[np.ndarray]:
    """Gold grids as ±3 logits, except that the second text's "Lind" is missed (so its span is cut short)."""
    out = []
    for state, question in items:
        if question.type != "span":
            out.append(np.array([1.0, 0.0]))
            continue
        record = next(r for r in span_records() if r.state == state)
        grid = np.where(np.array(record.target) > 0.5, 3.0, -3.0)
        if state.startswith("Omar"):
            grid[1 * 2 + 0] = -3.0  # word 1 ("Lind") × PERSON
        out.append(grid)
    return out


def test_the_report_has_span_f1_per_label_and_word_level_calibration(tmp_path: Path) -> None:
    from mydecide.evaluation.report import write_outputs

    evaluation = run_evaluation(None, span_records(), scorer=scorer, permutations=0, progress=False)
    report = evaluation.report
    spans = report["span"]["spans"]
    # gold: 3 spans; predicted: Anna Berg, the e-mail, "Omar" (cut short) → exact 2 of 3, overlap 3 of 3
    assert spans["gold_spans"] == 3 and spans["predicted_spans"] == 3
    assert spans["exact"]["f1"] == pytest.approx(2 / 3) and spans["overlap"]["f1"] == 1.0
    assert spans["by_label"]["pii/EMAIL"]["exact"]["f1"] == 1.0
    assert spans["by_label"]["pii/PERSON"]["exact"] == pytest.approx({"precision": 0.5, "recall": 0.5, "f1": 0.5})
    # PERSON: one question exact (1, 0, 0), one cut short (0, 1, 1); resampled, F1 runs from 0 to 1
    assert spans["by_label"]["pii/PERSON"]["exact_f1_ci95"] == [0.0, 1.0]
    assert spans["by_label"]["pii/EMAIL"]["exact_f1_ci95"] == [1.0, 1.0]
    n_cells = sum(len(words(r.state)) * 2 for r in span_records() if r.question.type == "span")
    assert report["span"]["n"] == n_cells and report["span"]["questions"] == 3
    assert report["span"]["log_loss"] > 0 and report["span"]["ece"] is not None
    assert report["choice"]["n"] == 1  # the other types are reported as before, beside it
    # the reliability diagram shows what the "all" block counts: the span cells are left out beside other questions
    from mydecide.evaluation.report import plotted
    from mydecide.metrics import ece

    shown = plotted(evaluation.rows)
    assert shown and all(r.qtype != "span" for r in shown) and len(shown) == report["all"]["n"]
    assert ece([r.probs for r in shown], [r.target for r in shown]) == pytest.approx(report["all"]["ece"])
    span_only = [r for r in evaluation.rows if r.qtype == "span"]
    assert plotted(span_only) == span_only  # a span-only evaluation still has a diagram
    # the report is a function of predictions.jsonl
    paths = write_outputs(evaluation, tmp_path)
    predictions = [json.loads(line) for line in paths["predictions"].read_text().splitlines()]
    assert span_metrics(predictions) == spans
    again = metric_blocks(rows_from_predictions(predictions), slices=False)
    assert again["span"]["log_loss"] == pytest.approx(report["span"]["log_loss"])
    first = next(p for p in predictions if p["type"] == "span")
    assert first["spans"][0] == {
        "label": "PERSON",
        "start": 5,
        "end": 14,
        "text": "Anna Berg",
        "probability": pytest.approx(1 / (1 + np.exp(-3.0))),
    }
    markdown = paths["markdown"].read_text()
    assert "## Spans" in markdown and "| pii/PERSON | 2 | 2 | 0.500 (0.000–1.000) | 1.000 |" in markdown


def test_a_base_model_gets_its_own_span_row(tmp_path: Path) -> None:
    def nothing(items: Sequence[tuple[Any, Question]], orders: Any = None) -> list[np.ndarray]:
        return [np.full(len(words(s)) * q.k, -2.0) if q.type == "span" else np.zeros(2) for s, q in items]

    report = run_evaluation(
        None, span_records(), scorer=scorer, base_scorer=nothing, permutations=0, progress=False
    ).report
    base = report["baselines"]["base_model"]["span"]["spans"]
    assert base["predicted_spans"] == 0 and base["exact"]["recall"] == 0.0 and base["exact"]["f1"] == 0.0


def test_span_questions_get_their_own_temperature_fitted_on_the_grid() -> None:
    from mydecide.calibration.run import calibrate

    fit = calibrate(None, span_records(), scorer=scorer, min_rows=1, progress=False)
    span = fit["types"]["span"]
    assert span["n"] == 3 and span["rows"] == sum(len(words(r.state)) * 2 for r in span_records()[:3])
    # fitted on the word grid (on Platt-smoothed targets); used only where it lowers the raw dev log loss
    assert span["fitted_temperature"] != 1.0 and "fallback" not in span
    if "kept_t1" in span:
        assert span["temperature"] == 1.0 and span["log_loss_after"] == span["log_loss_before"]
    else:
        assert span["temperature"] == span["fitted_temperature"]
        assert span["log_loss_after"] < span["log_loss_before"]
