"""Two prepare runs into one --out: the second stops with one line naming the first, and the outputs stay whole
(issue 36, item 4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from prepare_builders import make, write_jsonl
from typer.testing import CliRunner

from mydecide.cli import app
from mydecide.io import directory_lock
from mydecide.manifest import sha256_file


def _recipe(tmp_path: Path, rows: int = 40) -> Path:
    source = write_jsonl(tmp_path / "records.jsonl", [make(i) for i in range(rows)])
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"sources": [{"kind": "jsonl", "path": str(source)}]}))
    return recipe


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_prepare_into_a_held_out_stops_with_one_line_naming_the_holder(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    out = tmp_path / "prepared"
    assert CliRunner().invoke(app, ["prepare", str(recipe), "--out", str(out), "--no-progress"]).exit_code == 0
    before = _files(tmp_path)
    with directory_lock(out, "prepare"):
        result = CliRunner().invoke(app, ["prepare", str(recipe), "--out", str(out), "--no-progress"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and f"pid {os.getpid()}" in lines[0] and str(out) in lines[0], lines
    assert _files(tmp_path) == before  # the lock file is gone again, and nothing else changed
    assert not list(tmp_path.glob(".prepared.*"))


def test_concurrent_prepares_leave_one_complete_output(tmp_path: Path) -> None:
    """Both runs start together; whichever order they end in, --out is one run's complete output (each file as its
    manifest records it) and every run either wrote it or said why not; no staging directory is left behind."""
    recipe = _recipe(tmp_path, rows=400)
    out = tmp_path / "prepared"
    command = [sys.executable, "-m", "mydecide.cli", "prepare", str(recipe), "--out", str(out), "--no-progress"]
    for _round in range(3):
        runs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        results = [(run.wait(timeout=300), run.stderr.read() if run.stderr else "") for run in runs]
        assert any(code == 0 for code, _ in results), results
        for code, stderr in results:
            assert code == 0 or ("in use by another process" in stderr and "Traceback" not in stderr), stderr
        manifest = json.loads((out / "manifest.json").read_text())
        for name, entry in manifest["outputs"].items():
            assert sha256_file(out / name) == entry["sha256"], name
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
