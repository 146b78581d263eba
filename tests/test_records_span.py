"""Span questions in the record format: parts (`over`), gold spans, the word × label grid, and one-line rejects."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mydecide.record_files import read_records
from mydecide.records import RecordError, parse_record
from mydecide.spans import Span, merge_spans, state_part, trim_edges, words

TEXT = "Call Anna Berg at anna.berg@example.se before Friday."
CRITERIA = {"PERSON": "a person's name", "EMAIL": "an e-mail address"}


def span_record(**changes: object) -> dict:
    record: dict = {
        "task": "pii_spans",
        "state": TEXT,
        "question": {"type": "span", "instructions": "Which pieces of text are personal data?", "criteria": CRITERIA},
        "answer": [{"label": "PERSON", "start": 5, "end": 14}, {"label": "EMAIL", "start": 18, "end": 38}],
    }
    record.update(changes)
    return record


def test_a_span_record_holds_its_spans_and_their_word_grid() -> None:
    (record,) = parse_record(span_record())
    assert record.spans == (Span(5, 14, "PERSON"), Span(18, 38, "EMAIL"))
    assert [TEXT[s.start : s.end] for s in record.spans] == ["Anna Berg", "anna.berg@example.se"]
    # words: Call Anna Berg at anna.berg@example.se before Friday. → rows (PERSON, EMAIL)
    assert record.target == (0, 0, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0)
    again = parse_record(json.loads(json.dumps(record.to_json())))[0]
    assert again == record and again.question.to_json()["criteria"] == CRITERIA


def test_labels_may_be_a_list_and_an_empty_answer_means_nothing_to_find() -> None:
    question = {"type": "span", "instructions": "Where are names?", "criteria": ["PERSON"]}
    (record,) = parse_record(span_record(question=question, answer=[]))
    assert record.question.options == ("PERSON",) and record.spans == () and sum(record.target) == 0


def test_over_picks_a_named_part_and_an_object_state_defaults_to_the_answer_part() -> None:
    state = {"request": "Who is Anna Berg?", "answer": "Anna Berg is a chef in Oslo."}
    question = {"type": "span", "instructions": "Which claims are unsupported?", "criteria": {"CLAIM": "a claim"}}
    (default,) = parse_record(
        span_record(state=state, question=question, answer=[{"label": "CLAIM", "start": 15, "end": 27}])
    )
    assert default.question.over is None and state_part(state, None)[15:27] == "chef in Oslo"
    asked = dict(question, over="request")
    (record,) = parse_record(
        span_record(state=state, question=asked, answer=[{"label": "CLAIM", "start": 7, "end": 16}])
    )
    assert record.question.to_json()["over"] == "request" and len(record.target) == 4


def test_offsets_are_code_points_on_text_with_multibyte_characters() -> None:
    text = "Hej 😀 Åsa Öberg, och 李小龙 skrev från zoë@exämple.se 🇸🇪 idag."
    start = text.index("Åsa")
    end = start + len("Åsa Öberg")
    cjk = text.index("李小龙")
    rec = span_record(
        state=text,
        answer=[
            {"label": "PERSON", "start": start, "end": end, "text": "Åsa Öberg"},
            {"label": "PERSON", "start": cjk, "end": cjk + 3},
        ],
    )
    (record,) = parse_record(rec)
    assert all(text[a:b] and not text[a:b].isspace() for a, b in words(text))
    # the grid marks exactly the words of the gold spans, and merging it returns the same offsets and text
    spans = merge_spans(text, [float(v) for v in record.target], record.question.options)
    assert [(s["start"], s["end"], s["text"]) for s in spans] == [
        (start, end, "Åsa Öberg"),
        (cjk, cjk + 3, "李小龙"),
    ]


BAD = [
    ({"answer": [{"label": "PERSON", "start": 5, "end": 99}]}, "offsets 5..99 are outside the text"),
    ({"answer": [{"label": "PERSON", "start": -1, "end": 4}]}, "outside the text"),
    ({"answer": [{"label": "PERSON", "start": 4, "end": 4}]}, "need 0 <= start < end"),
    (
        {"answer": [{"label": "PERSON", "start": 4, "end": 5}]},
        "span answer[0]: offsets 4..5 hold only whitespace (' '), no word to mark",
    ),
    (
        {"answer": [{"label": "PERSON", "start": 5, "end": 14}, {"label": "PERSON", "start": 10, "end": 20}]},
        "gold spans 5..14 and 10..20 of label 'PERSON' overlap",
    ),
    ({"answer": [{"label": "PHONE", "start": 5, "end": 9}]}, "label 'PHONE' is not one of the labels"),
    ({"answer": [{"label": "PERSON", "start": 5, "end": 9, "text": "Bob"}]}, "text 'Bob' is not the text at 5..9"),
    ({"answer": [{"label": "PERSON", "start": True, "end": 9}]}, "start and end must be integers"),
    ({"answer": "Anna Berg"}, "span answer must be a list"),
    ({"answer": None, "target": {"PERSON": 1.0}}, "a soft target is not supported"),
    ({"question": {"type": "span", "instructions": "Where?", "criteria": {}}}, "span needs 1 to 32 labels, got 0"),
    ({"question": {"type": "span", "instructions": "Where?", "criteria": []}}, "span needs 1 to 32 labels, got 0"),
    (
        {"question": {"type": "span", "instructions": "Where?", "criteria": [f"L{i}" for i in range(33)]}},
        "span needs 1 to 32 labels, got 33",
    ),
    (
        {"question": {"type": "noul", "instructions": "Is it?", "over": "answer"}, "answer": True},
        "over (a state part's name, a non-empty string) belongs to span questions only",
    ),
    (
        {"question": {"type": "span", "instructions": "Where?", "criteria": ["PERSON"], "over": "answer"}},
        "over names the part 'answer', but the state is plain text",
    ),
    (
        {
            "state": {"request": "Hi", "reply": "Anna Berg"},
            "question": {"type": "span", "instructions": "Where?", "criteria": ["PERSON"], "over": "context"},
            "answer": [],
        },
        "over part 'context' is not in the state; its text parts are ['reply', 'request']",
    ),
    (
        {"state": {"request": "Hi", "reply": "Anna"}, "answer": []},
        "over part 'answer' (the default part when over is absent) is not in the state",
    ),
    ({"state": ["Anna", "Berg"], "answer": []}, "a span question needs a state that is text or an object"),
]


@pytest.mark.parametrize(("changes", "rule"), BAD, ids=[rule for _, rule in BAD])
def test_every_span_rule_has_a_one_line_reject(changes: dict, rule: str) -> None:
    with pytest.raises(RecordError) as err:
        parse_record(span_record(**changes))
    assert rule in str(err.value) and "\n" not in str(err.value)


def test_a_span_with_whitespace_around_its_word_is_kept() -> None:
    (record,) = parse_record(span_record(answer=[{"label": "PERSON", "start": 4, "end": 10}]))  # " Anna "
    assert [(s.start, s.end) for s in record.spans] == [(4, 10)] and sum(record.target) == 1.0


def test_different_labels_may_overlap() -> None:
    both = [{"label": "PERSON", "start": 18, "end": 27}, {"label": "EMAIL", "start": 18, "end": 38}]
    (record,) = parse_record(span_record(answer=both))
    assert len(record.spans) == 2


def test_a_bad_span_row_is_rejected_with_its_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    rows = [span_record(), span_record(answer=[{"label": "PERSON", "start": 40, "end": 60}])]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    records, rejects = read_records(path)
    assert len(records) == 1 and len(rejects) == 1
    assert rejects[0].where.endswith("spans.jsonl:2") and "offsets 40..60 are outside the text" in rejects[0].reason


def test_the_examples_of_spans_md_are_valid_records_and_requests() -> None:
    import re

    from mydecide.serving.request import parse_request

    docs = Path(__file__).resolve().parents[1] / "docs"
    blocks = re.findall(r"```json\n(.*?)```", (docs / "spans.md").read_text(encoding="utf-8"), re.S)
    objects = [json.loads(block) for block in blocks]
    records = [o for o in objects if "question" in o]
    assert len(records) == 2 and all(parse_record(o) for o in records)
    (request,) = [o for o in objects if "questions" in o]
    parsed = parse_request(request)
    assert state_part(request["state"], parsed.questions["pii"].over)[9:29] == "anna.berg@example.se"


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("Anna,", "Anna"),
        ("<bo@ek.se>", "bo@ek.se"),
        ("(bo@ek.se),", "bo@ek.se"),
        ("Friday.", "Friday"),
        ("(555) 123-4567.", "(555) 123-4567"),
        ("+49(0)5365397661", "+49(0)5365397661"),
        ('"Åsa Öberg"', "Åsa Öberg"),
        ("...", "..."),
    ],
)
def test_a_merged_span_loses_the_punctuation_at_its_edges(text: str, kept: str) -> None:
    start, end = trim_edges(text, 0, len(text))
    assert text[start:end] == kept
