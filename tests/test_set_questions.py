"""`set` questions end to end on a tiny model: per-label training targets → train → calibrate → evaluate → serve."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from mydecide.evaluation.rows import block, question_rows, set_metrics
from mydecide.records import parse_record

LABELS = {"bug": "Something is broken", "billing": "About money", "outage": "A system is down"}
SET = {"type": "set", "instructions": "Which labels apply to this ticket?", "criteria": LABELS}
WORDS = {"bug": "crash", "billing": "invoice", "outage": "down"}


def set_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        labels = [label for label in LABELS if rng.random() < 0.4]
        state = f"ticket {seed}-{i}: " + " ".join(WORDS[label] for label in labels) + " please help"
        rows.append({"id": f"s{seed}-{i}", "task": "labels", "state": state, "question": SET, "answer": labels})
    return rows


def test_set_metrics_exact_values() -> None:
    recs = [
        parse_record({"task": "t", "state": "a", "question": SET, "answer": ["billing"]})[0],
        parse_record({"task": "t", "state": "b", "question": SET, "answer": ["bug", "billing"]})[0],
    ]
    rows = question_rows(0, recs[0], np.array([0.2, 0.9, 0.4])) + question_rows(1, recs[1], np.array([0.3, 0.6, 0.7]))
    got = set_metrics(rows)
    # bug: fn 1 → F1 0; billing: tp 2 → F1 1; outage: fp 1 → F1 0
    assert got["macro_f1"] == pytest.approx(1 / 3)
    assert got["micro_f1"] == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))
    assert got["exact_set_accuracy"] == 0.5  # the first set is all right, the second misses "bug"
    expected = -np.mean(np.log([0.8, 0.9, 0.6, 0.3, 0.6, 0.3]))
    assert got["label_log_loss"] == pytest.approx(expected)
    assert got["by_label"]["t/bug"] == {"n": 2, "log_loss": pytest.approx(-np.mean(np.log([0.8, 0.3]))), "f1": 0.0}
    assert block(rows)["macro_f1"] == got["macro_f1"]


def test_answer_rows_is_the_one_set_expansion_for_metrics_fits_and_dev_metrics() -> None:
    from scipy.special import expit, softmax

    from mydecide.scoring.probabilities import answer_rows, to_probabilities

    z = np.array([1.5, -0.3, 4.0])
    y = [1.0, 0.0, 0.25]
    probs = answer_rows("set", to_probabilities("set", z, 2.0), y)
    assert [list(t) for _, t in probs] == [[1.0, 0.0], [0.0, 1.0], [0.25, 0.75]]
    fits = answer_rows("set", z, y, logits=True)  # (d, 0): softmax((d, 0) / T) is the label's sigmoid
    for (p, _), (d, _) in zip(probs, fits, strict=True):
        assert list(p) == pytest.approx(list(softmax(d / 2.0)), abs=1e-12)
        assert p[0] == pytest.approx(expit(d[0] / 2.0), abs=1e-12)
    (row,) = answer_rows("choice", [0.2, 0.8], [0.0, 1.0])  # any other type: the question is one row
    assert list(row[0]) == [0.2, 0.8] and list(row[1]) == [0.0, 1.0]
    with pytest.raises(ValueError, match="2 values for 3 target entries"):
        answer_rows("set", [0.1, 0.2], [1.0, 0.0, 1.0])


def test_training_dev_metrics_majority_is_the_evaluation_majority() -> None:
    from mydecide.evaluation.baselines import LabelPrior, majority_accuracy, majority_rows
    from mydecide.evaluation.rows import metric_blocks

    choice = {"type": "choice", "instructions": "Team?", "criteria": {"a": "", "b": "", "c": ""}}
    train = [
        parse_record({"task": "t", "state": f"s{i}", "question": choice, "answer": answer})[0]
        for i, answer in enumerate("aab")
    ]
    dev = [
        parse_record({"task": "t", "state": f"d{i}", "question": choice, "answer": answer})[0]
        for i, answer in enumerate("abaa")
    ] + [parse_record(row)[0] for row in set_rows(2, seed=3)]
    prior = LabelPrior.from_records(train, "training split")
    rows, _ = majority_rows(dev, prior)
    assert majority_accuracy(dev, prior) == metric_blocks(rows, slices=False)["choice"]["accuracy"] == 0.75


def test_training_units_of_a_set_are_one_yes_no_question_per_label(tiny_llama_dir: Path) -> None:
    from transformers import AutoTokenizer

    from mydecide.scoring.render import Renderer
    from mydecide.training.batches import epoch_units, make_batch

    renderer = Renderer(AutoTokenizer.from_pretrained(tiny_llama_dir))
    record = parse_record({"task": "t", "state": "crash and invoice", "question": SET, "answer": ["bug", "billing"]})[0]
    units = epoch_units(renderer, [record], seed=0, epoch=0, shuffle_options=True)
    assert [u.target for u in units] == [(1.0, 0.0), (1.0, 0.0), (0.0, 1.0)]  # yes, yes, no
    assert len({u.prompt.prefix for u in units}) == 1 and all(u.prompt.k == 2 for u in units)
    for unit, label in zip(units, LABELS, strict=True):
        assert f"Does this label apply: {label} ({LABELS[label]})?" in renderer.tokenizer.decode(
            list(unit.prompt.suffix)
        )
    tb = make_batch(units, renderer.tokenizer.pad_token_id, shared_prefix=True)
    assert tb.batch.prefix_ids is not None and tb.batch.prefix_ids.shape[0] == 1  # the state once for 3 labels


def test_set_questions_train_calibrate_evaluate_and_serve(tiny_llama_dir: Path, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from mydecide.calibration.run import calibrate
    from mydecide.calibration.temperatures import TemperatureTable
    from mydecide.config import TrainRecipe
    from mydecide.evaluation.run import run_evaluation
    from mydecide.modeling import load_model
    from mydecide.recipe_loading import load_recipe
    from mydecide.scoring.engine import score_questions
    from mydecide.scoring.probabilities import to_probabilities
    from mydecide.serving.app import create_app
    from mydecide.training.loop import train

    data = tmp_path / "data"
    data.mkdir()
    for name, rows in (("train", set_rows(16, 1)), ("dev", set_rows(6, 2))):
        (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    smoke = Path(__file__).resolve().parents[1] / "recipes" / "train" / "smoke.yaml"
    run = train(
        load_recipe(
            smoke,
            [
                f"model={tiny_llama_dir}",
                f"data={data}",
                f"out={tmp_path / 'run'}",
                "optim.max_steps=3",
                "optim.lr=2e-2",
                "eval_every=3",
            ],
            model=TrainRecipe,
        )
    )
    dev_log = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "dev"]
    assert dev_log and all(r["n"] == 6 * 3 and math.isfinite(r["log_loss"]) for r in dev_log)  # label rows

    model = load_model(str(tiny_llama_dir), run / "adapter", device="cpu")
    dev = [parse_record(r)[0] for r in set_rows(6, 2)]
    fit = calibrate(model, dev, min_rows=1, progress=False)
    t_set = fit["types"]["set"]["temperature"]
    assert (
        fit["types"]["set"]["rows"] == 18
        # the fit minimises the log loss against smoothed targets (temperatures.smoothed_targets), so on the raw
        # targets it may end a little above T = 1; how much depends on the adapter the few updates above produce
        and fit["types"]["set"]["log_loss_after"] <= fit["types"]["set"]["log_loss_before"] + 0.01
    )
    temperatures = TemperatureTable({"set": t_set})

    ev = run_evaluation(model, dev, temperatures, permutations=1, progress=False)
    s = ev.report["set"]
    assert (s["n"], s["questions"]) == (18, 6)
    for key in ("exact_set_accuracy", "micro_f1", "macro_f1", "label_log_loss"):
        assert s[key] is not None and 0 <= s[key] <= (1 if key != "label_log_loss" else 20), key
    assert set(s["by_label"]) == {f"labels/{label}" for label in LABELS}
    assert s["label_log_loss"] == pytest.approx(s["log_loss"])  # only set rows in this block
    assert ev.report["baselines"]["base_model"]["set"]["n"] == 18  # the untuned base beside it
    # the report is what the predictions imply: exact-set accuracy recomputed from predictions.jsonl rows
    right = [
        all((p >= 0.5) == (g in row["gold"]) for g, p in zip(LABELS, row["probabilities"].values(), strict=True))
        for row in ev.predictions
    ]
    assert s["exact_set_accuracy"] == pytest.approx(float(np.mean(right)))

    state = dev[0].state
    (z,) = score_questions(model, [(state, dev[0].question)])
    expected = to_probabilities("set", z, t_set)
    with TestClient(create_app(model, temperature=temperatures, warm_up=False)) as client:
        body = {"state": state, "questions": {"labels": SET, "down": {"type": "noul", "instructions": "Down?"}}}
        answer = client.post("/v1/systemone", json=body).json()["answers"]["labels"]
    assert answer["type"] == "set" and list(answer["probabilities"]) == list(LABELS)
    np.testing.assert_allclose(list(answer["probabilities"].values()), expected, atol=1e-4)
    assert answer["selected"] == [label for label, p in zip(LABELS, expected, strict=True) if p >= 0.5]
