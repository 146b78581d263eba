"""Soft training targets: a record's ``meta.soft_target`` (VADER: its raters' levels) is what train rows are trained
on when the data recipe sets ``augment.soft_targets``; dev and test keep the hard answer; a bad one is a one-line
error naming the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prepare_builders import SCORE, make, write_jsonl

from data_sources import vader
from mydecide.config import DataRecipe
from mydecide.data.prepare import prepare
from mydecide.records import RecordError, parse_record

SHARES = {"low": 0.25, "medium": 0.5, "high": 0.25}


def prepared(tmp_path: Path, soft: bool) -> dict[str, list[dict]]:
    rows = [make(i, question=SCORE, answer=1, meta={"soft_target": SHARES}) for i in range(60)]
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    out = tmp_path / ("soft" if soft else "hard")
    recipe = DataRecipe.model_validate(
        {
            "sources": [{"kind": "jsonl", "path": str(source)}],
            "out": str(out),
            "split": {"dev_fraction": 0.25, "test_fraction": 0.25},
            "augment": {"soft_targets": soft},
            "dedup": {"near": {"enabled": False}},
        }
    )
    manifest = prepare(recipe)
    step = next(s for s in json.loads((out / "manifest.json").read_text())["steps"] if s["step"] == "augment")
    assert step == next(s for s in manifest["steps"] if s["step"] == "augment")
    files = {name: [json.loads(line) for line in (out / f"{name}.jsonl").open()] for name in ("train", "dev", "test")}
    return {**files, "step": [step]}


def test_train_rows_take_the_distribution_and_dev_and_test_keep_the_answer(tmp_path: Path) -> None:
    out = prepared(tmp_path, soft=True)
    assert out["train"] and out["dev"] and out["test"]
    assert out["step"][0]["soft_targets"] == len(out["train"])
    for row in out["train"]:
        assert row["target"] == {"0": 0.25, "1": 0.5, "2": 0.25} and "answer" not in row
        assert "soft_target" not in row.get("meta", {})  # moved into the target, not kept twice
        (record,) = parse_record(row)
        assert record.soft and record.target == (0.25, 0.5, 0.25)
    for row in out["dev"] + out["test"]:
        assert row["answer"] == 1 and "target" not in row
        assert row["meta"]["soft_target"] == SHARES  # still there for whoever wants it, never scored against


def test_without_the_setting_every_split_keeps_the_hard_answer(tmp_path: Path) -> None:
    out = prepared(tmp_path, soft=False)
    assert out["step"][0]["soft_targets"] == 0
    assert all(row["answer"] == 1 and "target" not in row for name in ("train", "dev", "test") for row in out[name])


@pytest.mark.parametrize(
    ("question", "value", "message"),
    [
        (SCORE, {"low": 0.5, "medium": 0.2}, "meta.soft_target: score target probabilities must sum to 1, got 0.7000"),
        (SCORE, {"urgent": 1.0}, "meta.soft_target: target key 'urgent' is not one of the options ['0', '1', '2']"),
        (SCORE, [0.2, 0.8], "meta.soft_target: score target must be a non-empty map option → probability"),
        (
            {"type": "set", "instructions": "Which?", "criteria": {"a": "first", "b": "second"}},
            {"a": 1.0, "b": 0.0},
            "meta.soft_target: only choice, score and noul questions take one, not set",
        ),
    ],
)
def test_a_bad_soft_target_is_a_one_line_error_naming_the_key(question: dict, value: object, message: str) -> None:
    answer = ["a"] if question["type"] == "set" else 1
    with pytest.raises(RecordError) as err:
        parse_record(make(0, question=question, answer=answer, meta={"soft_target": value}))
    assert str(err.value) == message


def test_vader_raters_give_each_score_record_its_share_of_raters_per_level(tmp_path: Path) -> None:
    (tmp_path / "tweets_GroundTruth.txt").write_text("1\t2.5\tLove it!\n2\t-0.6\tMeh.\n3\t0.1\tNo raters line.\n")
    (tmp_path / "tweets_anonDataRatings.txt").write_text(
        "1\t2.5\t0.5\t[2, 3, 3, 2]\n2\t-0.6\t0.8\t[-1, 0, -1, -2, 1]\n9\t1\t0\t[1, one]\n"
    )
    rows = list(vader.convert(str(tmp_path)))
    error = rows[0]  # the unreadable ratings line is an error row with its file and line, not a silent gap
    assert error["_where"] == "tweets_anonDataRatings.txt:3" and "is not a list of numbers" in error["_error"]
    first, second, third = rows[1:]
    assert first["answer"] == 4 and first["meta"]["raters"] == 4
    assert first["meta"]["soft_target"] == {
        "very negative": 0.0,
        "negative": 0.0,
        "neutral": 0.0,
        "positive": 0.0,
        "very positive": 1.0,
    }
    assert second["answer"] == 1
    assert second["meta"]["soft_target"] == {
        "very negative": 0.2,
        "negative": 0.4,
        "neutral": 0.2,
        "positive": 0.2,
        "very positive": 0.0,
    }
    assert "soft_target" not in third["meta"] and third["answer"] == 2
    (record,) = parse_record({k: v for k, v in second.items() if not k.startswith("_")})
    assert record.meta["soft_target"]["negative"] == 0.4  # a valid meta.soft_target as records read it
    assert all("soft_target" not in r.get("meta", {}) for r in vader.convert(str(tmp_path), form="noul"))


def test_the_shipped_vader_sample_carries_its_raters_for_all_but_one_text() -> None:
    rows = list(vader.convert())
    rated = [r for r in rows if "soft_target" in r["meta"]]
    assert len(rated) == 1499 and min(r["meta"]["raters"] for r in rated) >= 10
    for r in rated:
        assert abs(sum(r["meta"]["soft_target"].values()) - 1.0) < 1e-9


def test_prepare_says_how_many_train_rows_take_their_soft_target(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from mydecide.cli import app

    rows = [make(i, question=SCORE, answer=1, meta={"soft_target": SHARES}) for i in range(40)]
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps({"sources": [{"kind": "jsonl", "path": str(source)}]}))
    result = CliRunner().invoke(
        app, ["prepare", str(recipe), "--out", str(tmp_path / "out"), "augment.soft_targets=true", "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    train = (tmp_path / "out" / "train.jsonl").read_text().splitlines()
    assert f"; soft targets on {len(train)} of the {len(train)} train rows" in result.output
