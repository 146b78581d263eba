"""The jevbench source: JevBench case files exploded into one record per question, gold from gold.jsonl."""

from __future__ import annotations

from pathlib import Path

import pytest

from data_sources import jevbench

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data_sources" / "jevbench"
CASES, GOLD = str(FIXTURES / "cases.jsonl"), str(FIXTURES / "gold.jsonl")


def test_each_question_becomes_a_record_with_its_gold_answer() -> None:
    rows = list(jevbench.convert(CASES, gold=GOLD))
    assert [r.get("id") for r in rows] == [
        "jevbench-support-901-export_failing",
        "jevbench-support-901-primary_team",
        "jevbench-support-901-urgency",
        None,
        "jevbench-logistics-902-delayed",
        None,
    ]
    noul, choice, score = rows[:3]
    assert noul["task"] == "jevbench_customer_support" and noul["answer"] is True
    assert noul["question"] == {"type": "noul", "instructions": "Is a scheduled export failing for this customer?"}
    assert noul["state"].startswith("Customer writes: the CSV export has failed")
    assert noul["meta"] == {"case": "support-901", "question_key": "export_failing", "domain": "customer_support"}
    assert choice["answer"] == "engineering" and set(choice["question"]["criteria"]) == {"engineering", "billing"}
    assert score["answer"] == 1 and score["question"]["criteria"] == ["Can wait", "This week", "Today"]
    assert all(r["_where"] == "cases.jsonl:1" for r in rows[:4])
    assert rows[4]["answer"] is True and rows[4]["_where"] == "cases.jsonl:2"  # inline "expected"


def test_unknown_missing_and_malformed_gold_are_error_rows() -> None:
    rows = list(jevbench.convert(CASES, gold=GOLD))
    assert rows[3]["_error"] == "question 'plan_tier': gold answer is 'unknown': the text does not settle the question"
    assert rows[3]["raw"]["case"] == "support-901"
    assert rows[5] == {
        "_where": "cases.jsonl:3",
        "_error": "a case needs 'id', 'state' and a non-empty 'questions' object",
        "raw": {"id": "broken-903", "state": "A case without questions."},
    }
    without_gold = list(jevbench.convert(CASES))
    assert without_gold[0]["_error"] == "question 'export_failing' has no gold answer (give the gold.jsonl file)"
    assert "answer" in without_gold[4]  # the inline answer needs no gold file


def test_gold_values_are_checked_against_their_question() -> None:
    choice = {"type": "choice", "instructions": "x", "criteria": {"a": "A", "b": "B"}}
    assert jevbench.answer_of(choice, "b") == "b"
    with pytest.raises(ValueError, match="'c' is not one of the options"):
        jevbench.answer_of(choice, "c")
    with pytest.raises(ValueError, match=r"level index 0\.\.1"):
        jevbench.answer_of({"type": "score", "instructions": "x", "criteria": ["lo", "hi"]}, 2)
    with pytest.raises(ValueError, match="true or false"):
        jevbench.answer_of({"type": "noul", "instructions": "x"}, "yes")


def test_a_bad_gold_file_names_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "gold.jsonl"
    bad.write_text('{"id": "x", "gold": {}}\n{"id": "y"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"gold.jsonl:2: a gold line needs"):
        jevbench.convert(CASES, gold=str(bad))


def test_no_path_needs_the_jevbench_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jevbench, "package_file", lambda package, relative: None)
    with pytest.raises(FileNotFoundError, match="jevbench package is not installed"):
        jevbench.convert(None)
