"""Inputs that used to be silent or crashing, through the real `mydecide prepare` command line: each bad row is a
row reject naming ``file:line``, each file-level fault one error line naming the file, and prepare goes on with
the rest (the hardening issue's remaining cases)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml
from prepare_builders import make, sentence
from typer.testing import CliRunner

from mydecide.cli import app

GOOD = 12


def good_rows(n: int = GOOD, prefix: str = "r") -> list[str]:
    return [json.dumps(make(i, state=sentence(i + 100 * len(prefix), 30), id=f"{prefix}{i}")) for i in range(n)]


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
