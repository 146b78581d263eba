"""Row-level faults stay row-level in prepare, file-level faults are one clear error, and nothing non-standard is
written or silently kept (issue 19, items 7 and 8)."""

from __future__ import annotations

import bz2
import gzip
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from prepare_builders import make, sentence

from mydecide.config import DataRecipe
from mydecide.data.prepare import prepare
from mydecide.recipe_loading import load_recipe
from mydecide.recipe_parsing import RecipeError
from mydecide.record_files import read_records

GOOD = 12


def good_lines() -> list[bytes]:
    return [json.dumps(make(i, state=sentence(i, 30))).encode() for i in range(GOOD)]


def run(source: Path, tmp_path: Path, kind: str = "jsonl", **options: Any) -> tuple[dict[str, Any], list[dict]]:
    recipe = DataRecipe.model_validate(
        {"sources": [{"kind": kind, "path": str(source), "options": options}], "split": {"dev_fraction": 0.2}}
    )
    out = tmp_path / "out"
    manifest = prepare(recipe, out)
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text(encoding="utf-8").splitlines()]
    for name in ("train.jsonl", "dev.jsonl", "rejects.jsonl"):  # every output is standard JSON, UTF-8
        for line in (out / name).read_bytes().decode("utf-8").splitlines():
            json.loads(line, parse_constant=no_constant)
    return manifest, rejects


def no_constant(name: str) -> None:
    raise AssertionError(f"an output holds {name}, which is not JSON")


def deep(n: int) -> str:
    return '{"a": ' * n + "1" + "}" * n


BAD_LINES = {
    "invalid UTF-8": b'{"id": "u", "task": "t", "state": "caf\xe9 \xff", "question": {"type": "noul", '
    b'"instructions": "Ok?"}, "answer": true}',
    "lone surrogate": b'{"id": "s", "task": "t", "state": "x \\ud800 y", "question": {"type": "noul", '
    b'"instructions": "Ok?"}, "answer": true}',
    "nested 5000 deep": b'{"id": "d", "task": "t", "state": ' + deep(5000).encode() + b', "question": '
    b'{"type": "noul", "instructions": "Ok?"}, "answer": true}',
    "nested 200 deep": b'{"id": "d2", "task": "t", "state": ' + deep(200).encode() + b', "question": '
    b'{"type": "noul", "instructions": "Ok?"}, "answer": true}',
    "NaN": b'{"id": "n", "task": "t", "state": {"x": NaN}, "question": {"type": "noul", "instructions": "Ok?"}, '
    b'"answer": true}',
    "Infinity": b'{"id": "i", "task": "t", "state": "s", "question": {"type": "score", "instructions": "How?", '
    b'"criteria": ["a", "b"]}, "target": [Infinity, 0]}',
    "duplicate key": b'{"id": "k", "task": "t", "state": "s", "question": {"type": "noul", "instructions": "Ok?"}, '
    b'"answer": true, "answer": false}',
    "wrong types": b'{"id": "w", "task": "t", "state": "s", "questions": {"q": {"type": "noul", '
    b'"instructions": "Ok?"}}, "expected": {"q": true}, "meta": [1, 2]}',
    "id of a wrong type": b'{"id": ["x"], "task": "t", "state": "s", "questions": {"q": {"type": "noul", '
    b'"instructions": "Ok?"}}, "expected": {"q": true}}',
}


@pytest.mark.parametrize("fault", list(BAD_LINES))
def test_a_bad_row_is_rejected_with_its_line_and_rule(fault: str, tmp_path: Path) -> None:
    lines = good_lines()
    lines.insert(5, BAD_LINES[fault])
    source = tmp_path / "rows.jsonl"
    source.write_bytes(b"\n".join(lines) + b"\n")
    manifest, rejects = run(source, tmp_path)
    assert manifest["conservation"]["kept"] == GOOD and manifest["conservation"]["rejected"] == 1
    assert [r["where"] for r in rejects] == ["rows.jsonl:6"], rejects
    assert rejects[0]["reason"]


@pytest.mark.parametrize("suffix", [".gz", ".bz2"])
def test_a_truncated_compressed_file_is_one_error_naming_it(suffix: str, tmp_path: Path) -> None:
    data = b"\n".join(good_lines() * 20) + b"\n"
    packed = gzip.compress(data) if suffix == ".gz" else bz2.compress(data)
    source = tmp_path / f"rows.jsonl{suffix}"
    source.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(RecipeError, match=rf"rows\.jsonl\{suffix}.*(corrupt|truncated)"):
        run(source, tmp_path)


def test_duplicate_keys_are_refused_by_every_reader(tmp_path: Path) -> None:
    from data_sources._files import iter_jsonl

    path = tmp_path / "dup.jsonl"
    path.write_text('{"a": 1, "a": 2}\n{"b": {"c": 1, "c": 1}}\n{"ok": 1}\n')
    rows = list(iter_jsonl(path))
    assert [error is not None for _, _, error in rows] == [True, True, False]
    assert "duplicate key 'a'" in str(rows[0][2]) and "duplicate key 'c'" in str(rows[1][2])
    _, rejects = read_records(path)
    assert [r.reason for r in rejects][:2] == ["invalid JSON (duplicate key 'a')", "invalid JSON (duplicate key 'c')"]


def test_duplicate_keys_in_a_recipe_name_the_line(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("sources: [{kind: jsonl, path: a.jsonl}]\nsplit:\n  seed: 1\n  seed: 2\n")
    with pytest.raises(RecipeError, match=r"r\.yaml: duplicate key 'seed' \(line 4\)"):
        load_recipe(recipe, model=DataRecipe)
    with pytest.raises(RecipeError, match="duplicate key 'x'"):
        load_recipe(None, ["split={x: 1, x: 2}"], model=DataRecipe)


def test_an_unterminated_csv_quote_does_not_swallow_rows(tmp_path: Path) -> None:
    rows = ["text,label"] + [f"{sentence(i, 20)},pos" for i in range(10)]
    rows[3] = f'"{sentence(3, 20)},pos'  # the quote never closes on its line
    rows[6] = f'{sentence(6, 20)} "quoted",neg'  # a quote inside a field is text
    source = tmp_path / "rows.csv"
    source.write_text("\n".join(rows) + "\n")
    manifest, rejects = run(
        source, tmp_path, kind="csv", type="choice", instructions="Which?", criteria=["pos", "neg"], task="t"
    )
    c = manifest["conservation"]
    assert rejects and rejects[0]["where"] == "rows.csv:4" and "quote" in rejects[0]["reason"], rejects
    assert c["kept"] + c["rejected"] == c["input"] and c["kept"] >= 2


def test_an_empty_or_all_invalid_source_is_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(RecipeError, match=r"sources\[0\].*empty\.jsonl.*no rows"):
        run(empty, tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\n{oops\n')
    with pytest.raises(RecipeError, match=r"sources\[0\].*all 2 rows.*rejected.*bad\.jsonl:1"):
        run(bad, tmp_path)


def test_prepare_cli_exits_non_zero_on_an_all_invalid_source(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from mydecide.cli import app

    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'\xff\xfe\n{"x": NaN}\n')
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"sources": [{"kind": "jsonl", "path": str(bad)}]}))
    result = CliRunner().invoke(app, ["prepare", str(recipe), "--out", str(tmp_path / "o"), "--no-progress"])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert [line for line in result.output.splitlines() if line.startswith("error:")]
