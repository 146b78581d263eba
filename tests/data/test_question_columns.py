"""Several questions from one table row (the ``questions`` option of the csv, parquet and datasets sources), and
prepare's per-task account: a task that loses all or most of its rows at one step is a warning naming the step and
the first rows it lost (issue 62: two sources on one CSV with one ``id_column`` lost the second task silently)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from data_sources import csv as csv_source
from data_sources import datasets as datasets_source
from data_sources import parquet as parquet_source
from mydecide.config import DataRecipe
from mydecide.data.prepare import prepare
from mydecide.recipe_parsing import RecipeError
from tests.data.prepare_builders import sentence

TEAMS = ["billing", "engineering", "support"]
URGENCY = ["low", "medium", "high"]
QUESTIONS = [
    {"task": "team", "type": "choice", "column": "team", "instructions": "Which team?", "options": TEAMS},
    {"task": "urgency", "type": "score", "column": "urgency", "instructions": "How urgent?", "levels": URGENCY},
]


def write_tickets(path: Path, n: int = 12) -> Path:
    """``id,text,team,urgency``: ``n`` tickets with two label columns (row k is on line k + 2)."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        out = csv.writer(handle)
        out.writerow(["id", "text", "team", "urgency"])
        for k in range(n):
            out.writerow([f"t-{k}", sentence(k), TEAMS[k % 3], URGENCY[(k // 3) % 3]])
    return path


def one_question(task: str) -> dict[str, Any]:
    """The single-question options (``type``, ``criteria``, ...) of one of :data:`QUESTIONS`."""
    entry = next(q for q in QUESTIONS if q["task"] == task)
    return {
        "type": entry["type"],
        "instructions": entry["instructions"],
        "answer_column": entry["column"],
        "task": task,
        "criteria": entry.get("levels", entry.get("options")),
    }


def recipe(sources: list[dict[str, Any]]) -> DataRecipe:
    return DataRecipe.model_validate({"sources": sources, "split": {"dev_fraction": 0.25, "seed": 13}})


def test_two_sources_on_one_csv_with_one_id_column_warn_that_the_second_task_is_lost(tmp_path: Path) -> None:
    path = str(write_tickets(tmp_path / "tickets.csv"))
    options = {"state_column": "text", "id_column": "id"}
    sources = [
        {"kind": "csv", "name": "routing", "path": path, "options": {**options, **one_question("team")}},
        {"kind": "csv", "name": "urgent", "path": path, "options": {**options, **one_question("urgency")}},
    ]
    lines: list[str] = []
    manifest = prepare(recipe(sources), tmp_path / "out", log=lines.append)
    assert manifest["splits"]["train"]["task"] == {"team": 8}
    summary = [line for line in lines if line.startswith("task ")]
    assert summary == [
        f"task {'team':<20} kept {12:>8}  removed {0:>8}",
        f"task {'urgency':<20} kept {0:>8}  removed {12:>8} (duplicate_ids 12)",
    ]
    warnings = [line for line in lines if "warning" in line]
    assert warnings == [
        "[mydecide] warning: task 'urgency' lost all 12 of its rows at step duplicate_ids; the first: "
        "tickets.csv:2 of source urgent (duplicate id of source routing at tickets.csv:2); "
        "tickets.csv:3 of source urgent (duplicate id of source routing at tickets.csv:3); "
        "tickets.csv:4 of source urgent (duplicate id of source routing at tickets.csv:4) (all in rejects.jsonl); "
        "two sources giving their rows the same ids (one file read twice with one id_column?) keep the first "
        "source's only: read several label columns with one source's `questions`"
    ]


def test_one_source_with_questions_keeps_both_tasks_with_ids_per_question(tmp_path: Path) -> None:
    path = str(write_tickets(tmp_path / "tickets.csv"))
    source = {
        "kind": "csv",
        "path": path,
        "options": {"state_column": "text", "id_column": "id", "questions": QUESTIONS},
    }
    lines: list[str] = []
    manifest = prepare(recipe([source]), tmp_path / "out", log=lines.append)
    assert not [line for line in lines if "warning" in line]
    assert [line for line in lines if line.startswith("task ")] == [
        f"task {'team':<20} kept {12:>8}  removed {0:>8}",
        f"task {'urgency':<20} kept {12:>8}  removed {0:>8}",
    ]
    assert manifest["conservation"]["input"] == 24
    rows = [json.loads(line) for name in ("train", "dev") for line in (tmp_path / "out" / f"{name}.jsonl").open()]
    by_id = {row["id"]: row for row in rows}
    assert by_id["t-4:team"]["state"] == by_id["t-4:urgency"]["state"] == sentence(4)
    assert by_id["t-4:team"]["answer"] == "engineering" and by_id["t-4:urgency"]["answer"] == 1
    assert by_id["t-4:urgency"]["question"] == {"type": "score", "instructions": "How urgent?", "criteria": URGENCY}


@pytest.mark.parametrize("copies", [7, 6])
def test_a_task_losing_most_of_its_rows_is_warned_about_and_half_is_not(tmp_path: Path, copies: int) -> None:
    path = tmp_path / "tickets.csv"
    write_tickets(path)
    text = path.read_text().splitlines()
    for k in range(1, copies + 1):  # tickets 1..copies repeat ticket 0's text: exact duplicates of both its questions
        fields = next(csv.reader([text[k + 1]]))
        fields[1] = sentence(0)
        text[k + 1] = ",".join(fields)
    path.write_text("\n".join(text) + "\n")
    source = {"kind": "csv", "path": str(path), "options": {"state_column": "text", "questions": QUESTIONS}}
    lines: list[str] = []
    prepare(recipe([source]), tmp_path / "out", log=lines.append)
    warnings = [line for line in lines if "warning" in line]
    first = "; ".join(
        f"tickets.csv:{k} of source csv (exact duplicate of source csv at tickets.csv:2)" for k in (3, 4, 5)
    )
    expected = [
        f"[mydecide] warning: task {task!r} lost 7 of the 12 of its rows at step exact_dedup; the first: {first} "
        "(all in rejects.jsonl)"
        for task in ("team", "urgency")
    ]
    assert warnings == (expected if copies == 7 else [])
    assert f"task {'urgency':<20} kept {12 - copies:>8}  removed {copies:>8} (exact_dedup {copies})" in lines


def test_a_bad_value_rejects_that_question_of_the_row_only(tmp_path: Path) -> None:
    path = write_tickets(tmp_path / "tickets.csv", n=3)
    path.write_text(
        path.read_text().replace(",support,high", ",support,urgent").replace(",support,low", ",support,urgent")
    )
    rows = list(csv_source.convert(str(path), state_column="text", id_column="id", questions=QUESTIONS))
    assert [row.get("id") for row in rows] == ["t-0:team", "t-0:urgency", "t-1:team", "t-1:urgency", "t-2:team", None]
    assert rows[-1]["_where"] == "tickets.csv:4"
    assert rows[-1]["_error"] == (
        "column 'urgency': 'urgent' is neither a level index nor one of the levels "
        "['low', 'medium', 'high'] (task urgency)"
    )
    generated = list(csv_source.convert(str(path), state_column="text", questions=QUESTIONS[:1]))
    assert [row["id"] for row in generated] == ["tickets-2:team", "tickets-3:team", "tickets-4:team"]


def test_parquet_and_datasets_sources_take_questions_too(tmp_path: Path) -> None:
    import pandas as pd

    table = pd.read_csv(write_tickets(tmp_path / "tickets.csv", n=4))
    table.to_parquet(tmp_path / "tickets.parquet")
    from_parquet = list(
        parquet_source.convert(
            str(tmp_path / "tickets.parquet"), state_column="text", id_column="id", questions=QUESTIONS
        )
    )
    from_datasets = list(
        datasets_source.convert(
            str(tmp_path / "tickets.csv"), fields={"state": "text", "id": "id"}, questions=QUESTIONS
        )
    )
    for rows, first in ((from_parquet, "tickets.parquet:0"), (from_datasets, "tickets.csv:0")):
        assert [row["id"] for row in rows[:4]] == ["t-0:team", "t-0:urgency", "t-1:team", "t-1:urgency"]
        assert rows[0]["_where"] == rows[1]["_where"] == first
        assert [row["answer"] for row in rows] == ["billing", 0, "engineering", 0, "support", 0, "billing", 1]
        assert rows[1]["task"] == "urgency" and rows[1]["state"] == sentence(0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"questions": [{**QUESTIONS[0], "label": "x"}]}, r"questions\[0\]: unknown key\(s\) \['label'\]"),
        ({"questions": [{**QUESTIONS[1], "options": URGENCY}]}, r"questions\[0\]: a score question takes 'levels'"),
        ({"questions": [QUESTIONS[0], {**QUESTIONS[1], "task": "team"}]}, r"the task\(s\) \['team'\] more than once"),
        ({"questions": QUESTIONS, "type": "choice"}, r"option\(s\) \['type'\] belong in each entry of 'questions'"),
        ({"questions": [{**QUESTIONS[0], "options": ["one"]}]}, r"questions\[0\]: option 'options' of a choice must"),
        ({"questions": [{**QUESTIONS[0], "column": "teams"}]}, r"column\(s\) \['teams'\] named in the recipe"),
        ({"questions": []}, "option 'questions' must be a non-empty list"),
    ],
)
def test_question_entries_that_cannot_make_records_are_recipe_errors(
    tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    path = str(write_tickets(tmp_path / "tickets.csv", n=2))
    with pytest.raises(RecipeError, match=message):
        prepare(recipe([{"kind": "csv", "path": path, "options": {"state_column": "text", **options}}]), tmp_path / "o")
    with pytest.raises(ValueError, match=r"fields\.answer"):
        datasets_source.convert(path, fields={"answer": "team"}, questions=QUESTIONS)
