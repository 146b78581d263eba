"""Inputs that used to be silent or crashing, through the real `mydecide prepare` command line: each bad row is a
row reject naming ``file:line``, each file-level fault one error line naming the file, and prepare goes on with
the rest (the hardening issue's remaining cases)."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from prepare_builders import make, sentence
from typer.testing import CliRunner

import mydecide.jsonl as jsonl
from mydecide.cli import app

GOOD = 12


def good_rows(n: int = GOOD, prefix: str = "r", start: int = 0) -> list[str]:
    """``n`` valid, distinct rows with ids ``prefix0``, ``prefix1``, … (states from ``start`` on)."""
    return [json.dumps(make(i, state=sentence(start + i, 30), id=f"{prefix}{i}")) for i in range(n)]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


class Prepared:
    """What one `mydecide prepare` run left: its exit code, its stderr lines, and (on success) its outputs."""

    def __init__(self, result: Any, out: Path):
        self.exit_code = result.exit_code
        self.output = result.output
        self.errors = result.stderr.strip().splitlines()
        self.manifest = json.loads((out / "manifest.json").read_text()) if (out / "manifest.json").exists() else {}
        rejects = out / "rejects.jsonl"
        self.rejects = [json.loads(line) for line in rejects.read_text().splitlines()] if rejects.exists() else []
        self.ids = {
            name: [json.loads(line)["id"] for line in (out / f"{name}.jsonl").read_text().splitlines()]
            for name in ("train", "dev")
            if (out / f"{name}.jsonl").exists()
        }


def prepare_cli(tmp_path: Path, sources: list[str | Path], *args: str, **recipe: Any) -> Prepared:
    """`mydecide prepare` on JSONL ``sources`` (dev_fraction 0.2 unless ``recipe`` says otherwise)."""
    data: dict[str, Any] = {"sources": [{"kind": "jsonl", "path": str(path)} for path in sources]}
    data["split"] = {"dev_fraction": 0.2, **recipe.pop("split", {})}
    data.update(recipe)
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["prepare", str(recipe_file), "--out", str(out), "--no-progress", *args])
    assert "Traceback" not in result.output, result.output
    return Prepared(result, out)


def one_error_line(run: Prepared) -> str:
    assert run.exit_code == 2, run.output
    errors = [line for line in run.errors if line.startswith("error:")]
    assert len(errors) == 1 and errors == run.errors[-1:], run.errors
    return errors[0]


# ----------------------------------------------------------------------------------- 1. an integer too long to read


def test_a_5000_digit_integer_id_is_a_row_reject_and_prepare_goes_on(tmp_path: Path) -> None:
    lines = good_rows()
    lines.insert(3, json.dumps(make(99, state=sentence(99, 30))).replace('"id": "r99"', '"id": ' + "7" * 5000))
    run = prepare_cli(tmp_path, [write_lines(tmp_path / "rows.jsonl", lines)])
    assert run.exit_code == 0, run.output
    assert run.manifest["conservation"]["kept"] == GOOD and run.manifest["conservation"]["rejected"] == 1
    [reject] = run.rejects
    assert reject["where"] == "rows.jsonl:4"
    assert (
        reject["reason"] == f"invalid JSON (an integer of 5000 digits; at most {sys.get_int_max_str_digits()} are read)"
    )


# ------------------------------------------------------------------------------------ 2. a line without a bound


class CountedReads:
    """Counts what every bounded reader reads: the characters, and the longest piece held at once."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.chars = self.longest = 0
        readline = jsonl.BoundedText.readline

        def counted(handle: jsonl.BoundedText, size: int = -1) -> str:
            assert size > 0, "a bounded reader asks for a bounded read"
            piece = readline(handle, size)
            self.chars += len(piece)
            self.longest = max(self.longest, len(piece))
            return piece

        monkeypatch.setattr(jsonl.BoundedText, "readline", counted)


def test_a_too_long_line_is_a_row_reject_with_its_length_and_prepare_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = good_rows()
    long_row = json.dumps(make(99, state="x" * (jsonl.MAX_LINE_CHARS + 5000)))
    lines.insert(6, long_row)
    reads = CountedReads(monkeypatch)
    run = prepare_cli(tmp_path, [write_lines(tmp_path / "rows.jsonl", lines)])
    assert run.exit_code == 0, run.output
    c = run.manifest["conservation"]
    assert c["kept"] == GOOD and c["rejected"] == 1
    [reject] = run.rejects
    assert reject["where"] == "rows.jsonl:7"
    assert reject["reason"] == (
        f"line of {len(long_row)} characters; at most {jsonl.MAX_LINE_CHARS} are read (mydecide.jsonl.MAX_LINE_CHARS)"
    )
    assert reject["raw"] == long_row[: jsonl.RAW_HEAD_CHARS] + "…"
    assert reads.longest == jsonl.MAX_LINE_CHARS + 1  # the long line was never held whole
    assert run.ids["train"] + run.ids["dev"]  # the rows after it were read


def test_a_too_long_line_in_a_csv_source_is_one_error_naming_file_and_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jsonl, "MAX_LINE_CHARS", 1000)
    rows = ["text,label", *(f"{sentence(i, 20)},pos" for i in range(5)), "y" * 5000 + ",neg", "last row,pos"]
    source = tmp_path / "rows.csv"
    source.write_text("\n".join(rows) + "\n")
    data = {
        "sources": [
            {
                "kind": "csv",
                "path": str(source),
                "options": {"type": "choice", "instructions": "Which?", "criteria": ["pos", "neg"], "task": "t"},
            }
        ]
    }
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(app, ["prepare", str(tmp_path / "r.yaml"), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.strip() == (
        f"error: sources[0] (kind csv): {source}:7: line of 5004 characters; at most 1000 are read "
        "(mydecide.jsonl.MAX_LINE_CHARS)"
    )


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero (Linux)")
def test_dev_zero_as_a_source_is_given_up_with_one_line_after_a_bounded_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = CountedReads(monkeypatch)
    run = prepare_cli(tmp_path, ["/dev/zero"])
    assert one_error_line(run) == (
        f"error: sources[0] (kind jsonl): /dev/zero:1: no end of line in the first {jsonl.MAX_SKIP_CHARS} characters "
        "of this line (mydecide.jsonl.MAX_SKIP_CHARS); the file is given up: is it a text file?"
    )
    # the work is bounded: one line's worth of characters read, never more than one bounded piece held
    assert jsonl.MAX_SKIP_CHARS < reads.chars <= jsonl.MAX_SKIP_CHARS + jsonl.SKIP_CHUNK_CHARS
    assert reads.longest == jsonl.MAX_LINE_CHARS + 1
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------------- 4. ids that are not ids


def test_an_id_that_is_not_a_string_or_an_integer_is_a_row_reject_naming_the_key(tmp_path: Path) -> None:
    bad_ids: list[Any] = [True, 1.5, None, "", ["x"], {"n": 1}]
    lines = good_rows()
    for n, bad in enumerate(bad_ids):
        lines.insert(2 * n + 1, json.dumps(make(50 + n, state=sentence(50 + n, 30), id=bad)))
    run = prepare_cli(tmp_path, [write_lines(tmp_path / "rows.jsonl", lines)])
    assert run.exit_code == 0, run.output
    assert run.manifest["conservation"]["kept"] == GOOD
    assert [r["where"] for r in run.rejects] == [f"rows.jsonl:{2 * n + 2}" for n in range(len(bad_ids))]
    assert all(r["reason"].startswith("id must ") for r in run.rejects), run.rejects
    assert run.rejects[0]["reason"] == "id must be a string or an integer, not a boolean (true)"
    assert "True" not in run.ids["train"] + run.ids["dev"]


# ------------------------------------------------------------------- 6. golds and levels that cannot be told apart


def test_a_whitespace_span_and_repeated_score_levels_are_row_rejects_naming_the_question(tmp_path: Path) -> None:
    state = "Call Anna Berg at noon."
    span = {"type": "span", "instructions": "Which words are a name?", "criteria": ["PERSON"]}
    levels = {"type": "score", "instructions": "How urgent is it?", "criteria": ["1", "1", "2"]}
    spaced = {**levels, "criteria": ["low", " low ", "high"]}
    lines = good_rows()
    lines[2:2] = [
        json.dumps(
            {
                "id": "s",
                "task": "names",
                "state": state,
                "question": span,
                "answer": [{"label": "PERSON", "start": 4, "end": 5}],
            }
        ),
        json.dumps({**make(60, state=sentence(60, 30), question=levels), "answer": 0}),
        json.dumps(
            {
                "id": "w",
                "task": "triage",
                "state": sentence(61, 30),
                "questions": {"urgency": spaced},
                "expected": {"urgency": 2},
            }
        ),
    ]
    run = prepare_cli(tmp_path, [write_lines(tmp_path / "rows.jsonl", lines)])
    assert run.exit_code == 0, run.output
    assert [(r["where"], r["reason"]) for r in run.rejects] == [
        ("rows.jsonl:3", "span answer[0]: offsets 4..5 hold only whitespace (' '), no word to mark"),
        (
            "rows.jsonl:4",
            "question: score levels 0 and 1 are the same text ('1', '1'); each level must read differently",
        ),
        (
            "rows.jsonl:5",
            "question 'urgency': question: score levels 0 and 1 are the same text ('low', ' low '); each level must "
            "read differently",
        ),
    ]
    assert run.manifest["conservation"]["kept"] == GOOD


# --------------------------------------------------------------------------------------------- 3. duplicate ids


def row_with_id(rid: Any, seed: int) -> str:
    return json.dumps({**make(seed, state=sentence(seed, 30)), "id": rid})


def test_a_repeated_id_keeps_the_first_and_rejects_the_later_ones_naming_both_lines(tmp_path: Path) -> None:
    a = write_lines(tmp_path / "a.jsonl", [*good_rows(6, "a"), row_with_id(7, 70), row_with_id("a1", 71)])
    b = write_lines(tmp_path / "b.jsonl", [row_with_id("7", 72), *good_rows(6, "b", start=20), row_with_id(7, 73)])
    run = prepare_cli(tmp_path, [a, b])
    assert run.exit_code == 0, run.output
    duplicates = [r for r in run.rejects if r["step"] == "duplicate_ids"]
    assert [(r["where"], r["reason"], r["matched"]) for r in duplicates] == [
        ("a.jsonl:8", "duplicate id", {"id": "a1", "source": "jsonl#0", "where": "a.jsonl:2"}),  # within a file
        ("b.jsonl:1", "duplicate id", {"id": "7", "source": "jsonl#0", "where": "a.jsonl:7"}),  # "7" meets 7
        ("b.jsonl:8", "duplicate id", {"id": "7", "source": "jsonl#0", "where": "a.jsonl:7"}),  # across sources
    ]
    step = next(s for s in run.manifest["steps"] if s["step"] == "duplicate_ids")
    assert step["removed"] == 3 and step["reasons"] == {"duplicate id": 3}
    kept = run.ids["train"] + run.ids["dev"]
    assert len(kept) == len(set(kept)) == 13 and kept.count("7") == 1
    c = run.manifest["conservation"]
    assert c["input"] == c["kept"] + c["rejected"] + c["removed"] and c["removed"] == 3


def test_an_exact_copy_is_counted_once_as_an_exact_duplicate_not_as_a_duplicate_id(tmp_path: Path) -> None:
    lines = good_rows(8)
    source = write_lines(tmp_path / "rows.jsonl", [*lines, lines[2], lines[5]])  # the file's rows 3 and 6 again
    run = prepare_cli(tmp_path, [source])
    assert run.exit_code == 0, run.output
    assert [(r["step"], r["where"], r["matched"]["where"]) for r in run.rejects] == [
        ("exact_dedup", "rows.jsonl:9", "rows.jsonl:3"),
        ("exact_dedup", "rows.jsonl:10", "rows.jsonl:6"),
    ]
    assert run.manifest["conservation"]["removed"] == 2
    # with exact dedup off the copies keep their id, so the id rule removes them, still once each
    run = prepare_cli(tmp_path, [source], "dedup.exact=false", "dedup.near.enabled=false")
    assert run.exit_code == 0, run.output
    assert [(r["step"], r["where"], r["matched"]["where"]) for r in run.rejects] == [
        ("duplicate_ids", "rows.jsonl:9", "rows.jsonl:3"),
        ("duplicate_ids", "rows.jsonl:10", "rows.jsonl:6"),
    ]


# ----------------------------------------------------------------------------------- 5. splits the recipe emptied


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "sources=[{kind: jsonl, path: rows.jsonl, limit: true}]",
            "sources.0.limit: Input should be a valid integer, not true",
        ),
        ("cap_per_task=0", "cap_per_task: a cap is a whole number of rows, at least 1, not 0"),
        (
            f"sources=[{{kind: jsonl, path: rows.jsonl, limit: {10**30}}}]",
            f"sources.0.limit: a limit is at most {sys.maxsize} rows; leave it out to read every row",
        ),
    ],
)
def test_a_nonsense_recipe_value_is_one_line_naming_the_key_before_any_row_is_read(
    override: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    reads = CountedReads(monkeypatch)
    run = prepare_cli(tmp_path, [write_lines(tmp_path / "rows.jsonl", good_rows())], override)
    assert one_error_line(run) == f"error: command-line override {override}: {message}"
    assert reads.chars == 0


def test_dev_fraction_0_is_an_empty_dev_split_that_is_said(tmp_path: Path) -> None:
    run = prepare_cli(tmp_path, [write_lines(tmp_path / "rows.jsonl", good_rows())], "split.dev_fraction=0")
    assert run.exit_code == 0, run.output
    assert run.ids["dev"] == [] and len(run.ids["train"]) == GOOD
    assert f"train {GOOD}, dev 0 (split.dev_fraction is 0), heldout 0 (no split.heldout_tasks);" in run.output
    warning = [line for line in run.errors if "warning" in line]
    assert warning == [
        f"[mydecide] warning: no dev split (split.dev_fraction is 0): `mydecide train` refuses {tmp_path / 'out'}, "
        "since it keeps the adapter that is best on dev; set split.dev_fraction > 0 to train on it"
    ]


@pytest.mark.parametrize(
    ("args", "cause"),
    [
        (
            ["split.heldout_tasks=[tickets]"],
            "train would be empty: every task left is held out (split.heldout_tasks: ['tickets'])",
        ),
        (["sources=[{kind: jsonl, path: rows.jsonl, limit: 0}]"], "train would be empty: no row is left to split"),
        (
            ["split.dev_fraction=0.99"],
            f"train would be empty: the {GOOD} rows of trained tasks all went to dev or test (split.dev_fraction 0.99, "
            "split.test_fraction 0.0); add rows or lower the fractions",
        ),
        (
            ["split.dev_fraction=0.001"],
            f"dev would be empty: split.dev_fraction 0.001 of the {GOOD} rows of trained tasks gave none; add rows, "
            "raise it, or set split.dev_fraction: 0 to prepare without dev",
        ),
        (
            ["split.test_fraction=0.001"],
            f"test would be empty: split.test_fraction 0.001 of the {GOOD} rows of trained tasks gave none; add rows, "
            "raise it, or set split.test_fraction: 0 to prepare without test",
        ),
    ],
)
def test_a_split_the_recipe_asked_for_that_comes_out_empty_is_an_error_naming_the_cause(
    args: list[str], cause: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    run = prepare_cli(tmp_path, [write_lines(tmp_path / "rows.jsonl", good_rows())], *args, split={"dev_fraction": 0.3})
    assert one_error_line(run) == f"error: split: {cause}"
    assert not (tmp_path / "out").exists()  # nothing written


def test_a_source_in_latin1_or_gzipped_under_a_text_name_is_one_line_naming_the_cause(tmp_path: Path) -> None:
    """Both were "all N rows were rejected, the first: …: invalid UTF-8 (byte 0x…)", which does not say why
    (issue 64: errors that name the real cause)."""
    text = "".join(line + "\n" for line in good_rows(4)).replace("ticket", "tické")
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(text.encode("latin-1"))
    first = next(i for i, c in enumerate(text.splitlines()[0]) if c == "é") + 1
    assert one_error_line(prepare_cli(tmp_path, [latin])) == (
        f"error: sources[0] (kind jsonl, {latin}): all 4 rows were rejected, the first: latin.jsonl:1: invalid UTF-8 "
        f"(byte 0xe9 at character {first}); the file is not UTF-8: convert it from its encoding (Latin-1? "
        "Windows-1252?), e.g. with iconv"
    )
    packed = tmp_path / "packed.jsonl"
    packed.write_bytes(gzip.compress(text.encode()))
    assert one_error_line(prepare_cli(tmp_path, [packed])) == (
        f"error: sources[0] (kind jsonl): {packed}: looks like gzip data, not text: name it packed.jsonl.gz (read "
        "compressed) or decompress it"
    )
