"""One JSONL reader and one strict-JSON rule: prepare's converters, the record reader (evaluate, calibrate,
train), decontamination and the server refuse the same line, and say which file and line."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import sys
from pathlib import Path

import pytest

import mydecide.jsonl as jsonl
from data_sources._files import iter_jsonl as converter_rows
from mydecide.data.decontaminate import read_eval_jsonl
from mydecide.jsonl import StrictJSONError, iter_jsonl, loads_strict, open_text, write_jsonl
from mydecide.record_files import load_records, read_records
from mydecide.records import RecordError
from mydecide.serving.request import RequestError, decode_body

GOOD = {"task": "t", "state": "The server is down.", "question": {"type": "noul", "instructions": "Urgent?"}}
DUPLICATE = (
    '{"task": "t", "state": "a", "state": "b", "question": {"type": "noul", "instructions": "Ok?"}, "answer": true}'
)
REASON = "invalid JSON (duplicate key 'state')"


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "mixed.jsonl"
    path.write_text(json.dumps({**GOOD, "answer": True}) + "\n\n" + DUPLICATE + "\n", encoding="utf-8")
    return path


def test_every_reader_refuses_a_repeated_key_on_the_same_line(tmp_path: Path) -> None:
    path = _file(tmp_path)
    lines = list(iter_jsonl(path))
    assert [(where, error) for where, _, error in lines] == [("mixed.jsonl:1", None), ("mixed.jsonl:3", REASON)]
    assert [(where, error) for where, _, error in converter_rows(path)] == [(w, e) for w, _, e in lines]
    records, rejects = read_records(path)
    assert len(records) == 1 and [(r.where, r.reason) for r in rejects] == [("mixed.jsonl:3", REASON)]
    with pytest.raises(RecordError, match=r"^mixed\.jsonl:3: invalid JSON \(duplicate key 'state'\)$"):
        load_records(path)
    items, problems = read_eval_jsonl(path)
    assert len(items) == 1 and problems == [f"mixed.jsonl:3: {REASON}"]
    with pytest.raises(RequestError, match="duplicate key 'state'"):
        decode_body(DUPLICATE.encode())


def test_the_reader_takes_compressed_files_and_skips_blank_lines(tmp_path: Path) -> None:
    plain = _file(tmp_path)
    packed = tmp_path / "mixed.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert [(w.replace(".gz", ""), o, e) for w, o, e in iter_jsonl(packed)] == list(iter_jsonl(plain))


def test_written_lines_read_back_the_same(tmp_path: Path) -> None:
    rows = [{**GOOD, "answer": False, "id": str(i), "meta": {"note": "naïve ✓"}} for i in range(3)]
    assert write_jsonl(tmp_path / "out.jsonl", rows) == 3
    assert [obj for _, obj, _ in iter_jsonl(tmp_path / "out.jsonl")] == rows
    assert [r.id for r in load_records(tmp_path / "out.jsonl")] == ["0", "1", "2"]


def test_an_integer_too_long_to_convert_is_a_row_error_for_every_reader(tmp_path: Path) -> None:
    reason = f"invalid JSON (an integer of 5000 digits; at most {sys.get_int_max_str_digits()} are read)"
    path = tmp_path / "big.jsonl"
    huge = json.dumps({**GOOD, "answer": True, "id": 7}).replace(": 7", ": -" + "9" * 5000)
    path.write_text(json.dumps({**GOOD, "answer": True}) + "\n" + huge + "\n", encoding="utf-8")
    assert [(where, error) for where, _, error in iter_jsonl(path)] == [("big.jsonl:1", None), ("big.jsonl:2", reason)]
    assert [(where, error) for where, _, error in converter_rows(path)] == [
        ("big.jsonl:1", None),
        ("big.jsonl:2", reason),
    ]
    records, rejects = read_records(path)
    assert len(records) == 1 and [(r.where, r.reason) for r in rejects] == [("big.jsonl:2", reason)]
    with pytest.raises(StrictJSONError, match="an integer of 4301 digits"):
        loads_strict("1" * 4301)
    assert loads_strict("1" * 4300) == int("1" * 4300)  # the longest Python converts is still read


def test_lines_are_read_in_bounded_pieces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonl, "MAX_LINE_CHARS", 40)
    monkeypatch.setattr(jsonl, "SKIP_CHUNK_CHARS", 16)
    row = '{"a": 1}'
    path = tmp_path / "long.jsonl"
    path.write_text(f"{row}\n{'x' * 100}\r\n{row}\n\n{'y' * 41}", encoding="utf-8", newline="")
    lines = list(iter_jsonl(path))
    assert [(where, error) for where, _, error in lines] == [
        ("long.jsonl:1", None),
        ("long.jsonl:2", "line of 100 characters; at most 40 are read (mydecide.jsonl.MAX_LINE_CHARS)"),
        ("long.jsonl:3", None),
        ("long.jsonl:5", "line of 41 characters; at most 40 are read (mydecide.jsonl.MAX_LINE_CHARS)"),
    ]
    assert lines[1][1] == "x" * 41 + "…"  # the start of the line (its first bounded piece) as its raw content
    packed = tmp_path / "long.jsonl.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert [(w, e) for w, _, e in iter_jsonl(packed)] == [(w.replace(".jsonl", ".jsonl.gz"), e) for w, _, e in lines]
    with open_text(path) as handle, pytest.raises(ValueError, match=r"long\.jsonl:2: line of 100 characters"):
        list(handle)  # every other reader: a too-long line is an error naming the file and line
    monkeypatch.setattr(jsonl, "MAX_SKIP_CHARS", 64)
    with pytest.raises(ValueError, match=r"long\.jsonl:2: no end of line in the first 64 characters"):
        list(iter_jsonl(path))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_named_pipe_is_read_once_as_it_is_written_and_the_wait_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A source may be a pipe (``<(zcat rows.jsonl.gz)``): its rows are read as its writer writes them, and the
    wait for the writer is one line on stderr, so a reader that waits is never silent."""
    import threading

    pipe = tmp_path / "rows.jsonl"
    os.mkfifo(pipe)
    rows = [{"id": i, "text": f"row {i}"} for i in range(3)]

    def write() -> None:
        with open(pipe, "w") as handle:  # blocks until the reader opens the pipe
            handle.write("".join(json.dumps(row) + "\n" for row in rows))

    writer = threading.Thread(target=write)
    writer.start()
    try:
        read = [obj for _, obj, _ in iter_jsonl(pipe)]
    finally:
        writer.join(timeout=10)
    assert read == rows
    assert capsys.readouterr().err == f"[mydecide] {pipe} is a named pipe: waiting for its writer (Ctrl-C stops)\n"


def test_a_utf8_byte_order_mark_is_skipped(tmp_path: Path) -> None:
    """Excel's "CSV UTF-8" and some editors start a file with a BOM: it is no part of the first line."""
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({**GOOD, "answer": True}).encode() + b"\n")
    assert [(where, error) for where, _, error in iter_jsonl(path)] == [("bom.jsonl:1", None)]


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        (
            "rows.jsonl",
            gzip.compress(b"{}\n"),
            "looks like gzip data, not text: name it rows.jsonl.gz (read compressed) or decompress it",
        ),
        (
            "rows.csv",
            bz2.compress(b"a,b\n"),
            "looks like bzip2 data, not text: name it rows.csv.bz2 (read compressed) or decompress it",
        ),
        ("rows.jsonl", lzma.compress(b"{}\n"), "looks like xz data, not text: decompress it first"),
        ("rows.jsonl", b"PK\x03\x04\x14\x00\x00\x00", "looks like a zip archive, not text: decompress it first"),
        (
            "rows.jsonl.gz",
            gzip.compress(gzip.compress(b"{}\n")),
            "looks like gzip data, not text (compressed twice?): decompress it first",
        ),
        (
            "rows.jsonl",
            "{}\n".encode("utf-16"),
            "is UTF-16 text (it starts with a UTF-16 byte-order mark); save it as UTF-8",
        ),
        (
            "rows.jsonl",
            "{}\n".encode("utf-32"),
            "is UTF-32 text (it starts with a UTF-32 byte-order mark); save it as UTF-8",
        ),
        (
            "rows.jsonl",
            "{}\n".encode("utf-16-le"),
            "looks like UTF-16 text (every other byte is zero); save it as UTF-8",
        ),
    ],
)
def test_data_that_is_not_utf8_text_is_named_for_what_it_is(tmp_path: Path, name: str, data: bytes, message: str):
    """Compressed data under a text name, or UTF-16 / UTF-32 text, was read as lines of UTF-8 that all failed
    ("invalid UTF-8 (byte 0x8b …)"); now one error says what the file is and what to do (issue 64)."""
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(ValueError) as err:
        open_text(path).close()
    assert str(err.value) == f"{path}: {message}"
