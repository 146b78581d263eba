"""Collapse detection fires on a model that always answers one letter and stays silent on one that reads content."""

from __future__ import annotations

import random

from mydecide.training.diagnostics import collapse_report


def _gold_positions(n: int, k: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(k) for _ in range(n)]


def test_always_letter_a_fires() -> None:
    gold = _gold_positions(200, 4, 0)
    predicted = [0] * 200  # always "A", whatever the options are
    flips = [g != 0 for g in gold]  # its canonical-order answer moves whenever the option order does
    accuracy = sum(g == 0 for g in gold) / 200
    report = collapse_report(predicted, gold, flips, accuracy, majority_accuracy=0.3)
    assert report.top_letter == "A" and report.top_letter_share == 1.0
    assert any("letter A" in w for w in report.warnings)
    assert any("majority" in w for w in report.warnings)


def test_content_model_is_silent() -> None:
    gold = _gold_positions(200, 4, 1)
    rng = random.Random(2)
    predicted = [g if rng.random() < 0.8 else rng.randrange(4) for g in gold]  # right 80%+, by content
    flips = [rng.random() < 0.05 for _ in gold]
    accuracy = sum(p == g for p, g in zip(predicted, gold, strict=True)) / 200
    report = collapse_report(predicted, gold, flips, accuracy, majority_accuracy=0.3)
    assert report.warnings == []


def test_skewed_gold_is_not_mistaken_for_collapse() -> None:
    gold = [0] * 150 + [1] * 50  # most gold answers really are on letter A
    report = collapse_report(gold, gold, [False] * 200, accuracy=1.0, majority_accuracy=0.75)
    assert report.warnings == []


def test_one_answer_to_every_yes_no_question_is_not_called_an_answer_position() -> None:
    gold = [1] * 140 + [0] * 60  # yes / no questions: B is always "no", 70% of the gold answers
    predicted = [1] * 200  # "no" to everything
    accuracy = 140 / 200
    report = collapse_report(predicted, gold, [], accuracy, majority_accuracy=0.7, letters_shuffled=False)
    assert report.top_letter == "B" and report.top_letter_share == 1.0
    collapse = [w for w in report.warnings if "letter B" in w]
    assert collapse == [
        "100% of dev answers are letter B (gold: 70%): the model is giving one answer to most questions (each "
        "letter is one answer in these questions), not the task"
    ]
    shuffled = collapse_report(predicted, gold, [], accuracy, majority_accuracy=0.7)
    assert "answer position" in next(w for w in shuffled.warnings if "letter B" in w)
