"""The pages in docs/ show what the code does: every record example in records.md is read by the record parser, its
field table lists exactly the keys a record may have, the error it quotes is the parser's, and the request and
response of wire.md are a valid request and a response that obeys the formulas the page states."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mydecide.records import RECORD_KEYS, RecordError, parse_record
from mydecide.scoring.probabilities import jev_confidence
from mydecide.serving.request import parse_request

DOCS = Path(__file__).resolve().parents[1] / "docs"


def json_blocks(page: str) -> list[str]:
    return re.findall(r"```json\n(.*?)```", (DOCS / page).read_text(encoding="utf-8"), re.S)


def test_every_record_example_parses() -> None:
    objects = [json.loads(obj) for block in json_blocks("records.md") for obj in re.split(r"\n(?=\{)", block.strip())]
    assert len(objects) >= 8
    for obj in objects:
        records = parse_record(obj)
        assert len(records) == (len(obj["questions"]) if "questions" in obj else 1)


def test_the_field_table_lists_the_record_keys() -> None:
    text = (DOCS / "records.md").read_text(encoding="utf-8")
    table = text.split("## Fields", 1)[1].split("\n## ", 1)[0]
    fields = set(re.findall(r"^\| `(\w+)` \|", table, re.M))
    assert fields == RECORD_KEYS


def test_the_quoted_rejection_is_the_parsers() -> None:
    text = (DOCS / "records.md").read_text(encoding="utf-8")
    quoted = re.search(r"`train\.jsonl:1832: (answer 'enginering' [^`]*)`", text)
    assert quoted is not None
    record = {
        "task": "t",
        "state": "s",
        "answer": "enginering",
        "question": {
            "type": "choice",
            "instructions": "Which team?",
            "criteria": {"billing": "", "engineering": "", "support": ""},
        },
    }
    with pytest.raises(RecordError) as err:
        parse_record(record)
    assert err.value.rule == quoted.group(1)


def test_the_wire_examples_are_a_request_and_its_response() -> None:
    request_text, response_text = json_blocks("wire.md")[:2]
    request = parse_request(json.loads(request_text))
    response = json.loads(response_text)
    assert list(response["answers"]) == list(request.questions)
    for name, answer in response["answers"].items():
        question = request.questions[name]
        assert answer["type"] == question.type
        probabilities = answer.get("probabilities", {})
        if question.type in ("choice", "score"):
            assert sum(probabilities.values()) == pytest.approx(1.0, abs=1e-6)
            assert answer["confidence"] == pytest.approx(
                jev_confidence(max(probabilities.values()), question.k), abs=5e-3
            )
        if question.type == "choice":
            assert list(probabilities) == list(question.options)
            assert answer["choice"] == max(probabilities, key=probabilities.__getitem__)
        if question.type == "score":
            assert answer["score"] == pytest.approx(sum(int(i) * p for i, p in probabilities.items()), abs=5e-3)
            assert answer["legend"] == dict(zip(question.options, question.descriptions, strict=True))
        if question.type == "set":
            assert answer["selected"] == [label for label, p in probabilities.items() if p >= 0.5]
        if question.type == "noul":
            assert 0.0 <= answer["noul"] <= 1.0
