"""Every question type through every stage, on a tiny model built in the test: records of each type in
``records.QUESTION_TYPES`` go through ``prepare`` (a data recipe over one JSONL source), a few training updates,
``calibrate``, ``evaluate`` and an answer from the server's request path, and each stage is checked for what that
type must produce there. A new question type gets its record here first (docs/README.md#extending)."""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mydecide.cli import app
from mydecide.records import QUESTION_TYPES, parse_record

SMOKE = Path(__file__).resolve().parents[1] / "recipes" / "train" / "smoke.yaml"
TEAMS = {"billing": "Charges and refunds", "engineering": "Bugs and outages", "support": "How-to questions"}
LEVELS = ["not urgent", "this week", "today"]
LABELS = {"bug": "Something is broken", "refund": "Money back"}
QUESTIONS = {
    "choice": {"type": "choice", "instructions": "Which team should handle this ticket?", "criteria": TEAMS},
    "noul": {"type": "noul", "instructions": "Is a production system down?"},
    "score": {"type": "score", "instructions": "How urgent is it?", "criteria": LEVELS},
    "set": {"type": "set", "instructions": "Which labels apply to this ticket?", "criteria": LABELS},
    "span": {"type": "span", "instructions": "Where are the names?", "criteria": {"PERSON": "a person's name"}},
}
WORDS = [
    "checkout", "invoice", "login", "refund", "crash", "page", "report", "account", "error", "charged", "slow",
    "mobile", "export", "calendar", "search", "plan", "card", "email", "server", "settings", "password", "upload",
    "since", "morning", "twice", "again", "customer", "order", "button", "timeout",
]  # fmt: skip
NAMES = ["Anna Berg", "Omar Lind", "Sara Holm", "Ivo Kask"]
ROWS_PER_TYPE = 8


def answer_of(qtype: str, i: int, state: str) -> object:
    if qtype == "choice":
        return list(TEAMS)[i % 3]
    if qtype == "noul":
        return i % 2 == 0
    if qtype == "score":
        return i % 3
    if qtype == "set":
        return [label for j, label in enumerate(LABELS) if (i >> j) & 1]
    name = NAMES[i % len(NAMES)]
    return [{"label": "PERSON", "start": state.index(name), "end": state.index(name) + len(name)}] if i % 4 else []


def source_rows() -> list[dict]:
    """ROWS_PER_TYPE records of each type, on states of random words (no two near duplicates of each other)."""
    rng = random.Random(7)
    rows = []
    for qtype in QUESTION_TYPES:
        for i in range(ROWS_PER_TYPE):
            words = rng.sample(WORDS, 9)
            if qtype == "span" and i % 4:
                words.insert(rng.randint(1, 8), NAMES[i % len(NAMES)])
            state = f"{qtype} ticket {i}: " + " ".join(words)
            question, answer = QUESTIONS[qtype], answer_of(qtype, i, state)
            rows.append({"id": f"{qtype}-{i}", "task": qtype, "state": state, "question": question, "answer": answer})
    return rows


def cli(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, (args, result.output[-3000:])
    return result.stdout


def test_every_question_type_through_every_stage(tiny_llama_dir: Path, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from mydecide.calibration.temperatures import load_temperatures
    from mydecide.config import DataRecipe
    from mydecide.data.prepare import prepare
    from mydecide.modeling import load_model
    from mydecide.serving.app import create_app

    assert set(QUESTIONS) == set(QUESTION_TYPES), "a new question type needs its record in this test"
    source = tmp_path / "tickets.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in source_rows()), encoding="utf-8")

    # prepare: every row kept, each type in train and in dev
    data = tmp_path / "data"
    recipe = DataRecipe.model_validate(
        {"sources": [{"kind": "jsonl", "path": str(source)}], "split": {"dev_fraction": 0.3, "seed": 2}}
    )
    manifest = prepare(recipe, data)
    assert manifest["conservation"]["kept"] == ROWS_PER_TYPE * len(QUESTION_TYPES)
    splits = {
        name: [json.loads(line) for line in (data / f"{name}.jsonl").read_text().splitlines()]
        for name in ("train", "dev")
    }
    for name, rows in splits.items():
        assert {row["question"]["type"] for row in rows} == set(QUESTION_TYPES), name
    dev = [record for row in splits["dev"] for record in parse_record(row)]

    # train: a few updates on all five types; each update's loss is a number
    run = tmp_path / "run"
    cli("train", str(SMOKE), "--model", str(tiny_llama_dir), "--data", str(data), "--out", str(run),
        "optim.max_steps=3", "eval_every=3", "save_every=3")  # fmt: skip
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in metrics if r["kind"] == "train"]
    assert len(losses) == 3 and all(math.isfinite(loss) for loss in losses)
    adapter = str(run / "adapter")
    assert (run / "adapter" / "adapter_config.json").is_file()

    # calibrate: one temperature per type, fitted on that type's dev questions
    temperatures = tmp_path / "temperatures.json"
    cli("calibrate", "--model", str(tiny_llama_dir), "--adapter", adapter, "--data", str(data / "dev.jsonl"),
        "--out", str(temperatures), "--min-rows", "1")  # fmt: skip
    types = json.loads(temperatures.read_text())["types"]
    assert set(types) == set(QUESTION_TYPES)
    questions = Counter(r.question.type for r in dev)
    cells = {
        "set": len(LABELS) * questions["set"],
        "span": sum(len(r.target) for r in dev if r.question.type == "span"),
    }
    for qtype, fit in types.items():  # a set question is a row per label, a span question a row per word × label
        assert (fit["n"], fit["rows"]) == (questions[qtype], cells.get(qtype, questions[qtype])), qtype
        assert fit["temperature"] > 0 and math.isfinite(fit["temperature"]), qtype

    # evaluate: a prediction row per dev question, with the probabilities its type has
    report = tmp_path / "eval"
    cli("evaluate", "--model", str(tiny_llama_dir), "--adapter", adapter, "--temperatures", str(temperatures),
        "--data", str(data / "dev.jsonl"), "--out", str(report), "permutations=0", "base=false")  # fmt: skip
    predictions = [json.loads(line) for line in (report / "predictions.jsonl").read_text().splitlines()]
    assert sorted(p["id"] for p in predictions) == sorted(r.id for r in dev)
    by_id = {p["id"]: p for p in predictions}
    summary = json.loads((report / "report.json").read_text())
    for record in dev:
        row, qtype = by_id[record.id], record.question.type
        assert row["type"] == qtype
        assert summary[qtype]["n"] > 0, qtype
        check_prediction(qtype, record.question.options, row)

    # serve: on each type's first dev state, a request holding one question of every type, through the app's request
    # path; each answer has its type's shape, and the question of the state's own type is answered as evaluate did
    model = load_model(str(tiny_llama_dir), adapter, device="cpu")
    with TestClient(create_app(model, temperature=load_temperatures(temperatures), warm_up=False)) as client:
        for qtype in QUESTION_TYPES:
            record = next(r for r in dev if r.question.type == qtype)
            response = client.post("/v1/systemone", json={"state": record.state, "questions": QUESTIONS})
            assert response.status_code == 200, response.text
            answers = response.json()["answers"]
            assert {name: answer["type"] for name, answer in answers.items()} == {t: t for t in QUESTION_TYPES}
            check_answers(answers, record.state)
            check_same_as_evaluated(qtype, answers[qtype], by_id[record.id])


def check_prediction(qtype: str, options: tuple[str, ...], row: dict) -> None:
    if qtype in ("choice", "noul", "score"):  # one distribution over the options
        assert list(row["probabilities"]) == list(options)
        assert sum(row["probabilities"].values()) == pytest.approx(1.0, abs=1e-6)
    elif qtype == "set":  # one P(label applies) per label
        assert list(row["probabilities"]) == list(options)
        assert all(0.0 <= p <= 1.0 for p in row["probabilities"].values())
    else:  # span: one P(the word is in a span of the label) per word × label cell, and the spans located
        assert qtype == "span" and row["labels"] == list(options)
        assert len(row["grid"]) == len(row["target_grid"]) > 0
        assert all(0.0 <= p <= 1.0 for p in row["grid"]) and set(row["target_grid"]) <= {0.0, 1.0}
        assert all(piece["label"] in options for piece in row["spans"] + row["gold"])


def check_same_as_evaluated(qtype: str, answer: dict, row: dict) -> None:
    """The served answer to a dev question is the one evaluate predicted for it (same adapter, same temperatures)."""
    if qtype == "noul":
        assert answer["noul"] == pytest.approx(row["probabilities"]["yes"], abs=1e-4)
    elif qtype == "span":
        assert answer["noul"] == pytest.approx(max(row["grid"]), abs=1e-4)
        served = [(s["label"], s["start"], s["end"]) for s in answer["spans"]]
        assert served == [(s["label"], s["start"], s["end"]) for s in row["spans"]]
    else:
        assert answer["probabilities"] == pytest.approx(row["probabilities"], abs=1e-4)


def check_answers(answers: dict, state: str) -> None:
    choice = answers["choice"]
    assert list(choice["probabilities"]) == list(TEAMS)
    assert sum(choice["probabilities"].values()) == pytest.approx(1.0, abs=1e-6)
    best = max(choice["probabilities"], key=choice["probabilities"].get)
    assert choice["choice"] == best
    assert choice["confidence"] == pytest.approx((3 * choice["probabilities"][best] - 1) / 2)

    assert 0.0 <= answers["noul"]["noul"] <= 1.0

    score = answers["score"]
    levels = [score["probabilities"][str(i)] for i in range(len(LEVELS))]
    assert list(score["probabilities"]) == ["0", "1", "2"] and sum(levels) == pytest.approx(1.0, abs=1e-6)
    assert score["score"] == pytest.approx(sum(i * p for i, p in enumerate(levels)))
    assert score["legend"] == {str(i): level for i, level in enumerate(LEVELS)}

    labels = answers["set"]
    assert list(labels["probabilities"]) == list(LABELS)
    assert labels["selected"] == [label for label, p in labels["probabilities"].items() if p >= 0.5]

    span = answers["span"]
    assert 0.0 <= span["noul"] <= 1.0
    for piece in span["spans"]:
        assert piece["label"] == "PERSON" and 0.0 <= piece["probability"] <= 1.0
        assert state[piece["start"] : piece["end"]] == piece["text"]
