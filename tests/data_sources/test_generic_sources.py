"""The generic sources: jsonl (pass-through), csv and parquet (column layouts mapped by recipe options)."""

from __future__ import annotations

from pathlib import Path

import pytest

from data_sources import csv as csv_source
from data_sources import jsonl, parquet

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data_sources" / "generic"
TEAMS = {"billing": "Money", "engineering": "Bugs"}


def test_jsonl_passes_objects_through_with_where_and_reports_bad_lines() -> None:
    rows = list(jsonl.convert(str(FIXTURES / "records.jsonl")))
    assert [r["_where"] for r in rows] == [f"records.jsonl:{n}" for n in (1, 3, 4, 5, 6)]  # line 2 is blank
    assert rows[0]["answer"] == "engineering" and rows[0]["id"] == "t-1"
    assert rows[1]["questions"]["sev"]["criteria"] == ["low", "high"]  # wire format: left for the validator
    assert rows[1]["expected"] == {"down": False, "sev": 0}
    assert rows[2]["_error"].startswith("invalid JSON (Expecting ',' delimiter")  # the wording of records.py
    assert rows[2]["raw"] == '{"task": "broken", "state": "missing a closing brace"'
    assert rows[3] == {
        "_where": "records.jsonl:5",
        "_error": "line is a JSON list, not an object",
        "raw": ["a", "list", "not", "an", "object"],
    }
    assert rows[4]["target"] == {"billing": 0.9, "engineering": 0.1}


def test_jsonl_reads_gzipped_files(tmp_path: Path) -> None:
    import gzip

    target = tmp_path / "r.jsonl.gz"
    target.write_bytes(gzip.compress(b'{"task": "t", "state": "s"}\n'))
    assert list(jsonl.convert(str(target))) == [{"task": "t", "state": "s", "_where": "r.jsonl.gz:1"}]


def test_jsonl_needs_a_path() -> None:
    with pytest.raises(ValueError, match="needs a path"):
        jsonl.convert(None)


def test_csv_maps_columns_to_choice_records_and_reports_bad_rows() -> None:
    rows = list(
        csv_source.convert(
            str(FIXTURES / "tickets.csv"),
            type="choice",
            instructions="Which team?",
            criteria=TEAMS,
            state_column="body",
            answer_column="team",
            id_column="ticket_id",
            task="tickets",
        )
    )
    assert rows[0] == {
        "id": "A-1",
        "task": "tickets",
        "lang": "en",
        "state": "Checkout returns HTTP 500\nfor every customer",
        "question": {"type": "choice", "instructions": "Which team?", "criteria": TEAMS},
        "answer": "engineering",
        "_where": "tickets.csv:2",
    }
    assert rows[1]["_where"] == "tickets.csv:4"  # the quoted field of row 1 spans lines 2-3
    assert rows[2]["_where"] == "tickets.csv:5"
    assert rows[2]["_error"] == "column 'team': 'design' is not one of the options ['billing', 'engineering']"
    assert rows[2]["raw"]["ticket_id"] == "A-3"
    assert rows[3]["_error"] == "column 'body' is empty"
    assert [r.get("answer") for r in rows] == ["engineering", "billing", None, None, "billing"]


def test_csv_noul_and_default_ids_and_task() -> None:
    rows = list(
        csv_source.convert(
            str(FIXTURES / "tickets.csv"),
            type="noul",
            instructions="Is it urgent?",
            state_column="body",
            answer_column="urgent",
        )
    )
    assert [r.get("answer") for r in rows] == [True, False, False, None, None]
    assert rows[0]["id"] == "tickets-tickets-2" and rows[0]["task"] == "tickets"
    assert "criteria" not in rows[0]["question"]
    assert rows[4]["_error"] == "column 'urgent': 'maybe' is not a yes/no value (true/false, yes/no, 1/0)"


def test_csv_state_from_several_columns_is_an_object(tmp_path: Path) -> None:
    table = tmp_path / "pairs.tsv"
    table.write_text("premise\thypothesis\tlevel\nIt rains\tIt is wet\thigh\nSun\tRain\t7\n", encoding="utf-8")
    rows = list(
        csv_source.convert(
            str(table),
            type="score",
            instructions="How likely?",
            criteria=["low", "medium", "high"],
            state_column=["premise", "hypothesis"],
            answer_column="level",
        )
    )
    assert rows[0]["state"] == {"premise": "It rains", "hypothesis": "It is wet"}
    assert rows[0]["answer"] == 2  # a level given by its text
    assert rows[1]["_error"] == "column 'level': level 7 is outside 0..2"


def test_csv_set_answers(tmp_path: Path) -> None:
    table = tmp_path / "tags.csv"
    table.write_text('text,tags\nhello,"a;b"\nbye,"[""c""]"\nodd,z\n', encoding="utf-8")
    rows = list(
        csv_source.convert(
            str(table),
            type="set",
            instructions="Which tags apply?",
            criteria={"a": "A", "b": "B", "c": "C"},
            answer_column="tags",
        )
    )
    assert [r.get("answer") for r in rows] == [["a", "b"], ["c"], None]
    assert rows[2]["_error"] == "column 'tags': label(s) ['z'] are not among ['a', 'b', 'c']"


def test_csv_recipe_errors_name_the_option_or_column() -> None:
    path = str(FIXTURES / "tickets.csv")
    with pytest.raises(ValueError, match="'type'"):
        csv_source.convert(path, type="ranking", instructions="x", state_column="body")
    with pytest.raises(ValueError, match="'criteria'"):
        csv_source.convert(path, type="choice", instructions="x", state_column="body")
    with pytest.raises(ValueError, match=r"tickets.csv: column\(s\) \['text'\]"):
        csv_source.convert(path, type="noul", instructions="x", answer_column="urgent")
    with pytest.raises(ValueError, match="option 'instructions' must be a non-empty string"):
        csv_source.convert(path, type="noul")
    with pytest.raises(ValueError, match=r"option 'type' \(choice, noul, score or set\) or 'questions' is needed"):
        csv_source.convert(path, instructions="x")


def test_parquet_maps_columns_with_zero_based_row_index(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    target = tmp_path / "train.parquet"
    pq.write_table(pa.table({"text": ["good", "bad", None, "meh"], "label": [1, 0, 1, 5]}), target)
    rows = list(
        parquet.convert(
            str(target), type="choice", instructions="Good?", criteria={"0": "bad", "1": "good"}, task="polarity"
        )
    )
    assert rows[0] == {
        "id": "polarity-train-0",
        "task": "polarity",
        "lang": "en",
        "state": "good",
        "question": {"type": "choice", "instructions": "Good?", "criteria": {"0": "bad", "1": "good"}},
        "answer": "1",
        "_where": "train.parquet:0",
    }
    assert rows[1]["answer"] == "0"
    assert rows[2] == {
        "_where": "train.parquet:2",
        "_error": "column 'text' is empty",
        "raw": {"text": None, "label": 1},
    }
    assert rows[3]["_error"] == "column 'label': '5' is not one of the options ['0', '1']"
    assert list(
        parquet.convert(str(target), limit=1, type="choice", instructions="Good?", criteria={"0": "bad", "1": "good"})
    ) == [{**rows[0], "id": "train-train-0", "task": "train"}]


def test_parquet_rejects_a_file_that_is_not_parquet(tmp_path: Path) -> None:
    bogus = tmp_path / "x.parquet"
    bogus.write_text("not parquet", encoding="utf-8")
    with pytest.raises(ValueError, match=r"x.parquet: unreadable Parquet"):
        parquet.convert(str(bogus), type="noul", instructions="x")


def test_parquet_damaged_inside_is_one_error_naming_the_file(tmp_path: Path) -> None:
    """Pages that no longer decompress (a damaged copy) fail in one line naming the file, not a pyarrow traceback."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    target = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": [f"row {i} " * 20 for i in range(2000)], "label": [1] * 2000}), target)
    data = bytearray(target.read_bytes())
    data[200:2000] = b"\xff" * 1800
    target.write_bytes(bytes(data))
    with pytest.raises(ValueError) as err:
        list(parquet.convert(str(target), type="noul", instructions="x", state_column="text", answer_column="label"))
    assert str(err.value) == f"{target}: unreadable Parquet file after row 0 (Corrupt snappy compressed data.)"


def test_cells_that_are_not_text_are_rejected_per_row_with_a_reason(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    target = tmp_path / "cells.parquet"
    columns = {
        "bytes": pa.array([b"caf\xc3\xa9"]),
        "map": pa.array([{"msg": "hi"}]),
        "list": pa.array([["a", "b"]]),
        "nan": pa.array([float("nan")]),
        "number": pa.array([3.0]),
        "label": pa.array([1]),
    }
    pq.write_table(pa.table(columns), target)
    reasons = {}
    for column in ("bytes", "map", "list", "nan", "number"):
        options = {"type": "noul", "instructions": "x", "state_column": column, "answer_column": "label"}
        row = next(iter(parquet.convert(str(target), **options)))
        reasons[column] = row.get("_error", row.get("state"))
    assert reasons == {
        "bytes": "column 'bytes' holds bytes, not text",
        "map": "column 'map' holds a map, not text",
        "list": "column 'list' holds a list, not text",
        "nan": "column 'nan' holds nan (NaN is a missing value), not text",
        "number": "3",
    }


def test_a_csv_header_that_names_a_column_twice_is_an_error(tmp_path: Path) -> None:
    target = tmp_path / "dup.csv"
    target.write_text("text,label,text\nhello,1,world\n", encoding="utf-8")
    with pytest.raises(ValueError) as err:
        list(csv_source.convert(str(target), type="noul", instructions="x", state_column="text", answer_column="label"))
    assert str(err.value) == f"{target}:1: the header names column(s) ['text'] more than once; rename them"


def _noul(path: Path) -> list[dict]:
    return list(csv_source.convert(str(path), type="noul", instructions="x", state_column="text", answer_column="ok"))


def test_a_csv_header_after_a_byte_order_mark_names_its_columns(tmp_path: Path) -> None:
    """A BOM before the first column name made ``text`` unknown ("it has ['\\ufefftext', 'ok']"; issue 64)."""
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbftext,ok\nhello,yes\n")
    assert [(r["state"], r["answer"]) for r in _noul(path)] == [("hello", True)]


def test_a_csv_in_another_encoding_is_named_as_such(tmp_path: Path) -> None:
    header = tmp_path / "header.csv"
    header.write_bytes("text,ok,remarque\nhello,yes,été\n".encode("latin-1").replace(b"remarque", b"r\xe9sum\xe9"))
    with pytest.raises(ValueError) as err:
        _noul(header)
    assert str(err.value) == (
        f"{header}:1: the header has invalid UTF-8 (byte 0xe9 at character 2): convert the file from its encoding "
        "(Latin-1? Windows-1252?), e.g. with iconv"
    )
    utf16 = tmp_path / "utf16.csv"
    utf16.write_bytes("text,ok\nhello,yes\n".encode("utf-16"))
    with pytest.raises(ValueError) as err:
        _noul(utf16)
    assert str(err.value) == f"{utf16}: is UTF-16 text (it starts with a UTF-16 byte-order mark); save it as UTF-8"
