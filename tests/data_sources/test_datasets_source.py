"""The generic `datasets` source: local csv / json / parquet files and globs, save_to_disk directories, a hub
name read from the local `datasets` cache (the suite is offline), streaming, and mapping errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from data_sources import datasets as ds_source
from mydecide.records import parse_record

TEAMS = {"billing": "Money", "engineering": "Bugs"}
CHOICE = {"type": "choice", "instructions": "Which team?", "criteria": TEAMS}
ROWS = [
    {"body": "Checkout returns HTTP 500", "team": "engineering", "ref": "A-1"},
    {"body": "Charged twice", "team": "billing", "ref": "A-2"},
    {"body": "", "team": "billing", "ref": "A-3"},
    {"body": "Logo is ugly", "team": "design", "ref": "A-4"},
]


@pytest.fixture(autouse=True)
def own_datasets_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Arrow copies of the test files go to the test's folder, not the user's datasets cache."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets-cache")


def convert(path: Path | str, **options: Any) -> list[dict[str, Any]]:
    return list(ds_source.convert(str(path), **options))


def write_tables(folder: Path) -> dict[str, Path]:
    """The same four rows as csv, jsonl, a json array and parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    paths = {k: folder / f"tickets.{k}" for k in ("csv", "jsonl", "json", "parquet")}
    paths["csv"].write_text(
        "body,team,ref\n" + "".join(f"{r['body']},{r['team']},{r['ref']}\n" for r in ROWS), encoding="utf-8"
    )
    paths["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    paths["json"].write_text(json.dumps(ROWS, indent=1), encoding="utf-8")
    pq.write_table(pa.Table.from_pylist(ROWS), paths["parquet"])
    return paths


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "json", "parquet"])
def test_local_files_map_columns_to_records_and_name_the_column_and_row_of_a_bad_value(
    fmt: str, tmp_path: Path
) -> None:
    path = write_tables(tmp_path)[fmt]
    rows = convert(path, fields={"state": "body", "answer": "team", "id": "ref"}, **CHOICE)
    assert rows[0] == {
        "id": "A-1",
        "task": "tickets",
        "lang": "en",
        "state": "Checkout returns HTTP 500",
        "question": {"type": "choice", "instructions": "Which team?", "criteria": TEAMS},
        "answer": "engineering",
        "_where": f"tickets.{fmt}:0",
    }
    assert rows[1]["answer"] == "billing" and rows[1]["_where"] == f"tickets.{fmt}:1"
    assert rows[2]["_where"] == f"tickets.{fmt}:2"
    assert rows[2]["_error"] == f"column 'body' is empty (row 2 of tickets.{fmt})"
    assert rows[3]["_error"] == (
        f"column 'team': 'design' is not one of the options ['billing', 'engineering'] (row 3 of tickets.{fmt})"
    )
    assert rows[3]["raw"] == ROWS[3]
    for row in rows[:2]:
        assert parse_record({k: v for k, v in row.items() if k != "_where"})


def test_a_glob_reads_each_file_in_name_order_and_rows_name_their_file(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "shards"
    folder.mkdir()
    for n, rows in enumerate([ROWS[:2], ROWS[1:2]]):
        pq.write_table(pa.Table.from_pylist(rows), folder / f"part-{n}.parquet")
    (folder / "notes.txt").write_text("not data", encoding="utf-8")
    got = convert(folder / "part-*.parquet", fields={"state": "body", "answer": "team"}, **CHOICE)
    assert [r["_where"] for r in got] == ["part-0.parquet:0", "part-0.parquet:1", "part-1.parquet:0"]
    assert [r["id"] for r in got] == ["shards-part-0.parquet-0", "shards-part-0.parquet-1", "shards-part-1.parquet-0"]
    assert {r["task"] for r in got} == {"shards"}  # one task for the glob: the folder's name
    with pytest.raises(FileNotFoundError, match=r"part-\*\.csv: no file matches"):
        convert(folder / "part-*.csv", fields={"state": "body", "answer": "team"}, **CHOICE)


def test_streaming_reads_the_same_rows_and_stops_at_the_limit(tmp_path: Path) -> None:
    path = write_tables(tmp_path)["jsonl"]
    options: dict[str, Any] = {"fields": {"state": "body", "answer": "team"}, **CHOICE}
    assert convert(path, streaming=True, **options) == convert(path, **options)
    assert convert(path, streaming=True, limit=2, **options) == convert(path, **options)[:2]


def saved_dataset(out: Path) -> Path:
    """A DatasetDict with ClassLabel columns, written by save_to_disk (as a user's own pipeline would)."""
    from datasets import ClassLabel, Dataset, DatasetDict, Features, List, Value

    features = Features(
        {
            "text": Value("string"),
            "label": ClassLabel(names=["negative", "positive"]),
            "tags": List(ClassLabel(names=["price", "service"])),
            "source": Value("string"),
        }
    )
    train = Dataset.from_dict(
        {
            "text": ["Great value", "Rude staff", "Fine", "Odd"],
            "label": [1, 0, 1, -1],
            "tags": [[0], [1], [], [0, 1]],
            "source": ["web", "app", "web", "app"],
        },
        features=features,
    )
    DatasetDict({"train": train, "test": train.select([0])}).save_to_disk(str(out))
    return out


def test_save_to_disk_class_labels_give_the_names_and_the_criteria(tmp_path: Path) -> None:
    path = saved_dataset(tmp_path / "reviews")
    rows = convert(path, type="choice", instructions="Tone?", fields={"meta": "source"})
    assert rows[0]["question"] == {"type": "choice", "instructions": "Tone?", "criteria": ["negative", "positive"]}
    assert [r.get("answer") for r in rows] == ["positive", "negative", "positive", None]
    assert rows[0]["meta"] == {"source": "web"} and rows[0]["task"] == "reviews"
    assert rows[0]["_where"] == "reviews/train:0"
    assert rows[3]["_error"] == "column 'label' is empty (row 3 of reviews/train)"  # -1: no label
    topics = {"price": "", "service": ""}
    tags = convert(path, type="set", instructions="Topics?", criteria=topics, split="test", fields={"answer": "tags"})
    assert [r["answer"] for r in tags] == [["price"]] and tags[0]["_where"] == "reviews/test:0"
    with pytest.raises(ValueError, match=r"no split 'dev'; it has \['test', 'train'\]"):
        convert(path, type="choice", instructions="Tone?", split="dev")


def test_a_hub_dataset_is_read_from_the_local_datasets_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``acme/tickets`` as `load_dataset` caches a hub dataset (HF_HUB_OFFLINE=1: the cache is all there is)."""
    import datasets
    from datasets.packaged_modules.json.json import Json

    cache = tmp_path / "cache"
    files = write_tables(tmp_path / "repo")
    test_file = tmp_path / "repo" / "test.jsonl"
    test_file.write_text(json.dumps(ROWS[1]) + "\n", encoding="utf-8")
    # what a download of the hub dataset leaves: <cache>/acme___tickets/<config>/<version>/<hash>/tickets-<split>.arrow
    builder = Json(
        cache_dir=str(cache),
        dataset_name="tickets",
        hash="0123456789abcdef",
        data_files={"train": str(files["jsonl"]), "test": str(test_file)},
    )
    builder.download_and_prepare()
    (config,) = (cache / "tickets").iterdir()
    (cache / "acme___tickets").mkdir()
    shutil.move(config, cache / "acme___tickets" / "default")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    options: dict[str, Any] = {"fields": {"state": "body", "answer": "team"}, **CHOICE}
    rows = convert("acme/tickets", split="test", **options)
    assert rows == [
        {
            "id": "tickets-acme-tickets-test-0",
            "task": "tickets",
            "lang": "en",
            "state": "Charged twice",
            "question": {"type": "choice", "instructions": "Which team?", "criteria": TEAMS},
            "answer": "billing",
            "_where": "acme/tickets/test:0",
        }
    ]
    assert [r.get("answer") for r in convert("acme/tickets", **options)] == ["engineering", "billing", None, None]
    with pytest.raises(ValueError, match=r"cannot load 'acme/elsewhere'"):
        convert("acme/elsewhere", **options)


def test_per_row_questions_and_soft_targets_from_columns(tmp_path: Path) -> None:
    table = tmp_path / "mixed.jsonl"
    rows = [
        {"s": "Disk full", "t": "noul", "q": "Is it down?", "c": None, "p": "0.8"},
        {"s": "Slow page", "t": "score", "q": "How urgent?", "c": '["low", "high"]', "p": '{"0": 0.3, "1": 0.7}'},
        {"s": "Typo", "t": "score", "q": "How urgent?", "c": '["low", "high"]', "p": "{oops"},
    ]
    table.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    fields = {"state": "s", "type": "t", "instructions": "q", "criteria": "c", "target": "p"}
    got = convert(table, fields=fields, task="triage")
    lines = tmp_path / "lines.jsonl"
    lines.write_text(json.dumps({"text": ["first line", "second line"], "label": "yes"}) + "\n", encoding="utf-8")
    (as_list,) = convert(lines, type="noul", instructions="Two lines?")
    assert as_list["state"] == ["first line", "second line"] and as_list["answer"] is True
    assert got[0]["question"] == {"type": "noul", "instructions": "Is it down?"} and got[0]["target"] == 0.8
    assert got[1]["question"]["criteria"] == ["low", "high"] and got[1]["target"] == pytest.approx({"0": 0.3, "1": 0.7})
    assert got[2]["_error"] == "column 'p': '{oops' is not JSON (a map, a list or a number) (row 2 of mixed.jsonl)"
    for row in got[:2]:
        assert parse_record({k: v for k, v in row.items() if k != "_where"})


def test_recipe_mistakes_name_the_source_and_the_option_or_column(tmp_path: Path) -> None:
    path = write_tables(tmp_path)["csv"]
    with pytest.raises(ValueError, match=r"datasets source '.*tickets.csv'.*column\(s\) \['text'\] named in fields"):
        convert(path, fields={"answer": "team"}, **CHOICE)
    with pytest.raises(ValueError, match=r"fields \['anwser'\] are not record fields"):
        convert(path, fields={"state": "body", "anwser": "team"}, **CHOICE)
    with pytest.raises(ValueError, match=r"option 'type'"):
        convert(path, fields={"state": "body", "answer": "team"}, instructions="x")
    with pytest.raises(ValueError, match=r"option 'criteria' is needed: the answer column 'team' is not a ClassLabel"):
        convert(path, fields={"state": "body", "answer": "team"}, type="choice", instructions="x")
    with pytest.raises(FileNotFoundError, match=r"nowhere/data.csv: no such file"):
        convert(tmp_path / "nowhere" / "data.csv", **CHOICE)
    with pytest.raises(TypeError, match="no_such_option"):
        ds_source.convert(str(path), no_such_option=1)  # type: ignore[call-arg]


def test_prepare_runs_a_recipe_with_the_datasets_source(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from mydecide.cli import app

    paths = write_tables(tmp_path / "data")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"""
sources:
  - kind: datasets
    path: {paths["parquet"]}
    options:
      fields: {{state: body, answer: team, id: ref}}
      type: choice
      instructions: Which team?
      criteria: {{billing: Money, engineering: Bugs}}
split: {{dev_fraction: 0.0, test_fraction: 0.0}}
augment: {{anonymize_options: 0, drop_distractors: 0, paraphrase_instructions: 0}}
out: {tmp_path / "out"}
""",
        encoding="utf-8",
    )
    result = CliRunner().invoke(app, ["prepare", str(recipe)])
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    train = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in train) == ["A-1", "A-2"]
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert sorted(r["where"] for r in rejects) == ["tickets.parquet:2", "tickets.parquet:3"]
    assert all(r["source"] == "datasets" for r in rejects), rejects
    manifest = json.loads((out / "manifest.json").read_text())
    assert json.dumps(manifest).count('"rejected": 2') >= 1


def test_the_recipe_examples_of_the_docs_page_are_valid_sources() -> None:
    import inspect
    import re

    import yaml

    from mydecide.config import SourceSpec

    page = Path(__file__).resolve().parents[2] / "docs" / "datasets-source.md"
    blocks = re.findall(r"```yaml\n(.*?)```", page.read_text(encoding="utf-8"), re.S)
    specs = [SourceSpec.model_validate(s) for block in blocks for s in yaml.safe_load(block)["sources"]]
    assert len(specs) == 4 and {s.kind for s in specs} == {"datasets"}
    accepted = set(inspect.signature(ds_source.convert).parameters)
    for spec in specs:
        assert set(spec.options) <= accepted, spec.options
        o = spec.options
        given = (o.get("type"), o.get("instructions"), o.get("criteria"), o.get("task"), "en")
        if "questions" in o:
            mapping = ds_source.question_mapping("docs", o.get("fields"), o["questions"], *given)
            assert [q.task for q in mapping.questions] == ["team", "urgency"]
        else:
            mapping = ds_source.check_mapping("docs", o.get("fields"), *given)
        assert mapping.columns["state"]


def test_cells_that_are_not_text_are_rejected_per_row(tmp_path: Path) -> None:
    """A bytes or NaN state, a map or list id: rejected with the reason, never their Python repr (issue 64)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "cells.parquet"
    table = {
        "body": pa.array([b"caf\xc3\xa9", b"ok"]),
        "score": pa.array([float("nan"), 1.0]),
        "ref": pa.array([{"k": "A-1"}, {"k": "A-2"}]),
        "team": pa.array(["billing", "billing"]),
    }
    pq.write_table(pa.table(table), path)
    errors = {
        column: convert(path, fields={"state": column, "answer": "team"}, **CHOICE)[0]["_error"]
        for column in ("body", "score")
    }
    errors["ref"] = convert(path, fields={"state": "team", "answer": "team", "id": "ref"}, **CHOICE)[0]["_error"]
    assert errors == {
        "body": "column 'body' holds bytes, not text (row 0 of cells.parquet)",
        "score": "column 'score' holds nan (NaN is a missing value), not text (row 0 of cells.parquet)",
        "ref": "column 'ref' holds a map, not text (row 0 of cells.parquet)",
    }
