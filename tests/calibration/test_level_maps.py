"""Level maps for score questions (``calibration/level_maps.py``): fitted where a temperature cannot fix a model that
puts its probability on the wrong levels, kept only where held-out dev says so, written to and read from
temperatures.json, and applied by evaluate and serve."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mydecide.calibration.level_maps import LevelMap, fit_level_map, min_questions
from mydecide.calibration.run import calibrate, fit_report
from mydecide.calibration.temperatures import TemperatureTable, load_temperatures
from mydecide.errors import UserError
from mydecide.evaluation.report import render_markdown
from mydecide.evaluation.run import run_evaluation
from mydecide.metrics import ece, log_loss, ordinal_summary
from mydecide.records import parse_record
from mydecide.scoring.probabilities import calibrated_probabilities, softmax, to_probabilities

LEVELS = ["very negative", "negative", "neutral", "positive", "very positive"]


def shy_of_the_middle(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Logits of a model that rarely says the middle level, and gold levels drawn from where the truth is: the
    model's own distribution with the middle level's share moved up from both of its neighbours' sides."""
    rng = np.random.default_rng(seed)
    centre = rng.uniform(-0.5, 4.5, size=n)
    z = -np.abs(np.arange(5)[None, :] - centre[:, None]) * 1.5
    z[:, 2] -= 1.5  # the model keeps away from "neutral"
    truth = softmax(z)
    truth[:, 2] += 0.5 * (truth[:, 1] + truth[:, 3])
    truth[:, 1] *= 0.5
    truth[:, 3] *= 0.5
    gold = np.array([rng.choice(5, p=p / p.sum()) for p in truth])
    return z, gold


def score_records(z: np.ndarray, gold: np.ndarray, prefix: str) -> tuple[list, dict]:
    records, logits = [], {}
    for i, (row, y) in enumerate(zip(z, gold, strict=True)):
        record = parse_record(
            {
                "task": "sentiment",
                "state": f"{prefix} text {i}",
                "question": {"type": "score", "instructions": "How positive is it?", "criteria": LEVELS},
                "answer": int(y),
            }
        )[0]
        records.append(record)
        logits[record.state] = row
    return records, logits


def scorer_of(logits: dict):
    return lambda items, orders=None: [logits[state] for state, _ in items]


def test_the_identity_map_gives_the_temperatures_answer() -> None:
    identity = LevelMap(np.eye(5), np.zeros(5))
    z = np.array([0.3, -1.2, 2.0, 0.1, -0.4])
    assert identity.probabilities(z, 1.7) == pytest.approx(to_probabilities("score", z, 1.7), abs=1e-12)
    table = TemperatureTable({"score": 1.7}, level_maps={5: identity})
    assert calibrated_probabilities("score", 5, z, table) == pytest.approx(to_probabilities("score", z, 1.7))
    # other types and other K never go through it
    assert calibrated_probabilities("choice", 5, z, table) == pytest.approx(to_probabilities("choice", z, 1.0))
    assert calibrated_probabilities("score", 5, z, None) == pytest.approx(to_probabilities("score", z))


def test_a_level_map_moves_probability_where_a_temperature_cannot(tmp_path: Path) -> None:
    dev, dev_logits = score_records(*shy_of_the_middle(600, seed=1), prefix="dev")
    fit = calibrate(None, dev, scorer=scorer_of(dev_logits), progress=False)
    entry = fit["level_maps"]["5"]
    assert "fallback" not in entry and entry["cv_log_loss_map"] < entry["cv_log_loss_temperature"]
    assert fit["overall"]["log_loss_after"] < fit["types"]["score"]["log_loss_after"]  # the overall counts the map
    assert any(line.startswith("score K=5: level map on 600 dev questions") for line in fit_report(_document(fit)))

    path = tmp_path / "temperatures.json"
    path.write_text(json.dumps(_document(fit)), encoding="utf-8")
    table = load_temperatures(path)
    assert set(table.level_maps) == {5}

    z, gold = shy_of_the_middle(3000, seed=2)  # fresh questions from the same model and world
    targets = list(np.eye(5)[gold])
    tempered = [to_probabilities("score", row, table("score", 5)) for row in z]
    mapped = [calibrated_probabilities("score", 5, row, table) for row in z]
    assert ece(mapped, targets) < 0.5 * ece(tempered, targets)
    assert log_loss(mapped, targets) < log_loss(tempered, targets) - 0.02
    assert ordinal_summary(mapped, targets)["threshold_ece"] < ordinal_summary(tempered, targets)["threshold_ece"]
    assert np.mean([p[2] for p in mapped]) == pytest.approx(np.mean(gold == 2), abs=0.03)  # neutral gets its share


def _document(fit: dict) -> dict:
    return {"format": "mydecide.temperatures/1", "records": 0, **fit}


def test_too_few_questions_or_no_held_out_gain_keep_the_temperature() -> None:
    z, gold = shy_of_the_middle(min_questions(5) - 1, seed=3)
    fitted, summary = fit_level_map(list(z), list(np.eye(5)[gold]), 1.0)
    assert fitted is None and "fewer than 300" in summary["fallback"]

    rng = np.random.default_rng(4)  # a calibrated model: gold drawn from its own distribution
    z = rng.normal(0.0, 2.0, size=(600, 5))
    gold = np.array([rng.choice(5, p=p) for p in softmax(z)])
    fitted, summary = fit_level_map(list(z), list(np.eye(5)[gold]), 1.0)
    if fitted is not None:  # a map that wins held-out by chance may keep it, but it must barely move anything
        moved = np.abs(fitted.probabilities(z) - softmax(z)).max()
        assert moved < 0.1 and summary["cv_log_loss_map"] > summary["cv_log_loss_temperature"] - 0.01


def test_calibrate_without_level_maps_or_score_questions_writes_none() -> None:
    dev, dev_logits = score_records(*shy_of_the_middle(400, seed=5), prefix="dev")
    assert "level_maps" not in calibrate(None, dev, scorer=scorer_of(dev_logits), progress=False, level_maps=False)
    choice = [
        parse_record(
            {
                "task": "t",
                "state": f"s{i}",
                "question": {"type": "choice", "instructions": "Pick", "criteria": ["a", "b"]},
                "answer": "a",
            }
        )[0]
        for i in range(40)
    ]
    assert "level_maps" not in calibrate(None, choice, scorer=lambda items, orders=None: [np.zeros(2)] * len(items))


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"weights": [[1, 0], [0, 1]], "bias": [0, 0, 0]}, "level_maps.3: weights must be K × K"),
        ({"bias": [0, 0, 0]}, "level_maps.3: a level map needs 'weights'"),
        ({"weights": [[1, 0, 0], [0, 1, 0], [0, 0, "x"]], "bias": [0, 0, 0]}, "level_maps.3: weights and bias must be"),
        ({"weights": [[1, 0, 0], [0, 1, 0], [0, 0, None]], "bias": [0, 0, 0]}, "level_maps.3: weights and bias must"),
        ({"weights": np.eye(2).tolist(), "bias": [0, 0]}, "level_maps.3: a map of 2 levels is filed under K = 3"),
    ],
)
def test_a_bad_level_map_is_one_line_naming_its_key(tmp_path: Path, entry: dict, message: str) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"types": {"score": 1.0}, "level_maps": {"3": entry}}), encoding="utf-8")
    with pytest.raises(UserError, match=message) as err:
        load_temperatures(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_evaluate_applies_the_map_and_says_so() -> None:
    tilted = LevelMap(np.eye(5) * 0.8, np.array([0.0, 0.2, 0.6, 0.2, 0.0]))
    table = TemperatureTable({"score": 1.3}, level_maps={5: tilted})
    records, logits = score_records(*shy_of_the_middle(12, seed=6), prefix="test")
    result = run_evaluation(None, records, table, scorer=scorer_of(logits), permutations=0, progress=False)
    for record, row in zip(records, result.predictions, strict=True):
        expected = tilted.probabilities(logits[record.state], 1.3)
        assert list(row["probabilities"].values()) == pytest.approx(expected.tolist(), abs=1e-12)
        assert row["level_map"] is True and row["temperature"] == 1.3
    assert result.report["level_maps_used"] == [5]
    assert "level map" in render_markdown(result.report)


def test_serving_applies_the_map(tiny_llama_dir: Path) -> None:
    from mydecide.config import Limits
    from mydecide.modeling import load_model
    from mydecide.scoring.forward import score_prompts
    from mydecide.scoring.plan import score_plans
    from mydecide.serving.request import parse_request
    from mydecide.serving.response import build_response, render_request

    model = load_model(str(tiny_llama_dir))
    parsed = parse_request(
        {
            "state": "The soup was cold and the waiter forgot us.",
            "questions": {
                "mood": {"type": "score", "instructions": "How positive?", "criteria": ["bad", "fine", "good"]},
                "pick": {"type": "choice", "instructions": "Which?", "criteria": ["soup", "waiter", "bill"]},
            },
        },
        Limits(),
    )
    rendered = render_request(model, parsed)
    score_plans([rendered.plan], lambda p: score_prompts(model, p))
    tilted = LevelMap(np.array([[1.0, 0.2, 0.0], [0.0, 0.5, 0.0], [0.3, 0.0, 1.2]]), np.array([0.1, 0.9, -0.2]))
    table = TemperatureTable({"score": 0.7, "choice": 1.4}, level_maps={3: tilted})
    answers = build_response(rendered, table)["answers"]
    logits = dict(zip(rendered.names, rendered.plan.logits(), strict=True))
    mood = np.array(list(answers["mood"]["probabilities"].values()))
    assert mood == pytest.approx(tilted.probabilities(logits["mood"], 0.7), abs=1e-9)
    pick = np.array(list(answers["pick"]["probabilities"].values()))
    assert pick == pytest.approx(to_probabilities("choice", logits["pick"], 1.4), abs=1e-9)  # K = 3 too: not a score
