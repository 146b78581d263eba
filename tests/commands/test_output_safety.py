"""Outputs that cannot replace what their command did not write, and the lock on run and output directories
(issue 36, items 2 and 4): evaluate's --out, train noticing a changed data recipe, and ``io.directory_lock``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mydecide.cli import app
from mydecide.errors import UserError
from mydecide.io import DirectoryBusy, directory_lock


def _noul_rows(path: Path, n: int = 4, prefix: str = "state") -> Path:
    rows = [
        {
            "task": "t",
            "state": f"{prefix} {i}",
            "question": {"type": "noul", "instructions": "Is it on?"},
            "answer": i % 2 == 0,
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _files(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------------------- the lock itself


def test_a_second_holder_is_refused_with_the_first_ones_pid_and_the_lock_file_goes_with_the_holder(
    tmp_path: Path,
) -> None:
    target = tmp_path / "run"
    with directory_lock(target, "train"):
        lock = tmp_path / ".run.lock"
        assert lock.read_text() == f"mydecide train, pid {os.getpid()}"
        busy = f"{target}: in use by another process \\(mydecide train, pid"
        with pytest.raises(DirectoryBusy, match=busy), directory_lock(target, "evaluate"):
            pass
        probe = "import sys; from mydecide.io import directory_lock\nwith directory_lock(sys.argv[1], 'x'): pass"
        other = subprocess.run([sys.executable, "-c", probe, str(target)], capture_output=True, text=True)
        assert other.returncode != 0 and f"pid {os.getpid()}" in other.stderr
    assert not lock.exists()
    with directory_lock(target, "evaluate"):  # free again
        pass


def test_a_lock_file_whose_holder_was_killed_is_taken_over(tmp_path: Path) -> None:
    target = tmp_path / "out"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from mydecide.io import directory_lock\n"
            "with directory_lock(sys.argv[1], 'prepare'):\n print('held', flush=True); time.sleep(600)",
            str(target),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    with pytest.raises(DirectoryBusy, match=f"pid {holder.pid}"), directory_lock(target, "prepare"):
        pass
    holder.kill()  # kill -9: the file stays, the kernel drops the lock
    holder.wait()
    assert (tmp_path / ".out.lock").exists()
    with directory_lock(target, "prepare"):
        assert (tmp_path / ".out.lock").read_text() == f"mydecide prepare, pid {os.getpid()}"


def test_a_symlink_where_the_lock_file_goes_is_refused_and_its_target_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "run"
    elsewhere = tmp_path / "precious.txt"
    elsewhere.write_text("keep me")
    (tmp_path / ".run.lock").symlink_to(elsewhere)
    with pytest.raises(UserError) as refused, directory_lock(target, "train"):
        pass
    assert str(refused.value) == (
        f"{tmp_path / '.run.lock'} is a symbolic link; the lock file of {target} must be a plain file: remove it"
    )
    assert elsewhere.read_text() == "keep me" and not target.exists()


def test_an_atomic_write_never_replaces_or_follows_a_link(tmp_path: Path) -> None:
    from mydecide.io import atomic_write_text

    elsewhere = tmp_path / "precious.txt"
    elsewhere.write_text("keep me")
    (tmp_path / "out.json").symlink_to(elsewhere)
    with pytest.raises(UserError, match=r"out\.json: is a symbolic link; an output is written as a plain file"):
        atomic_write_text(tmp_path / "out.json", "{}")
    assert (tmp_path / "out.json").is_symlink() and elsewhere.read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "precious.txt"]  # no temporary file left


def test_resuming_a_hard_linked_copy_never_appends_to_the_original(tmp_path: Path) -> None:
    """A run copied with ``cp -al`` shares metrics.jsonl's inode; unshare gives the copy its own before appending."""
    from mydecide.io import unshare

    original, copy = tmp_path / "run" / "metrics.jsonl", tmp_path / "copy" / "metrics.jsonl"
    original.parent.mkdir()
    copy.parent.mkdir()
    original.write_text('{"update": 1}\n')
    os.link(original, copy)
    unshare(copy)
    with open(copy, "a") as handle:
        handle.write('{"update": 2}\n')
    assert original.read_text() == '{"update": 1}\n' and copy.read_text() == '{"update": 1}\n{"update": 2}\n'
    assert original.stat().st_nlink == 1


# ----------------------------------------------------------------------------------------------- evaluate --out


@pytest.mark.parametrize(
    "case",
    [
        "a prepare output",
        "an adapter",
        "your own files",
        "an unstamped report",
        "holds the data",
        "the working directory",
        "a file",
    ],
)
def test_evaluate_refuses_an_out_it_did_not_write_before_loading_any_model(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    dev = _noul_rows(data / "dev.jsonl")
    _noul_rows(data / "train.jsonl", prefix="train")
    (data / "recipe.yaml").write_text("sources: []\n")
    (data / "manifest.json").write_text('{"conservation": {}}')
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "recipe.yaml").write_text("my: notes\n")
    unstamped = tmp_path / "old-eval"  # a report.json without evaluate's format, as versions before it wrote
    unstamped.mkdir()
    (unstamped / "report.json").write_text('{"thresholds": {}, "baselines": {}, "provenance": {}}')
    (tmp_path / "report.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    out, message = {
        "a prepare output": (data, "holds --data"),
        "an adapter": (adapter, "no report.json of an earlier evaluate"),
        "your own files": (mine, "holds recipe.yaml but no report.json of an earlier evaluate"),
        "an unstamped report": (unstamped, "holds report.json but no report.json of an earlier evaluate"),
        "holds the data": (tmp_path, "is the working directory or above it"),
        "the working directory": (Path("."), "is the working directory or above it"),
        "a file": (tmp_path / "report.json", "exists and is not a directory"),
    }[case]
    before = _files(tmp_path)
    args = ["evaluate", "--model", str(tmp_path / "no-model"), "--data", str(dev), "-q"]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0] and f"--out {out}" in lines[0], lines
    assert _files(tmp_path) == before


def test_evaluate_replaces_its_own_report_whole_and_refuses_one_with_a_foreign_file(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    dev = _noul_rows(tmp_path / "dev.jsonl")
    out = tmp_path / "eval"
    args = ["evaluate", "--model", str(tiny_llama_dir), "--data", str(dev), "--no-base", "-q", "--out", str(out)]
    assert CliRunner().invoke(app, args).exit_code == 0
    written = sorted(p.name for p in out.iterdir())
    assert written == ["predictions.jsonl", "recipe.yaml", "reliability.png", "report.json", "report.md"]
    assert json.loads((out / "report.json").read_text())["format"] == "mydecide.report/1"
    (out / "report.md").unlink()  # a partial earlier report is still evaluate's: a re-run completes it
    assert CliRunner().invoke(app, [*args, "--permutations", "1"]).exit_code == 0
    assert sorted(p.name for p in out.iterdir()) == written
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging or lock file left
    (out / "notes.txt").write_text("mine")
    before = _files(tmp_path)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "holds notes.txt, which evaluate did not write" in result.output
    assert _files(tmp_path) == before
    with directory_lock(out, "evaluate"):
        (out / "notes.txt").unlink()
        result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and f"pid {os.getpid()}" in result.output, result.output


# ---------------------------------------------------------------------------------------- train reads the data


def test_train_refuses_a_data_directory_whose_recipe_no_longer_matches_its_manifest(tmp_path: Path) -> None:
    from mydecide.manifest import write_manifest
    from mydecide.training.loop import prepared_data

    data = tmp_path / "data"
    data.mkdir()
    _noul_rows(data / "train.jsonl")
    _noul_rows(data / "dev.jsonl")
    (data / "recipe.yaml").write_text("sources: []\n")
    write_manifest(data, {"conservation": {}}, ["train.jsonl", "dev.jsonl", "recipe.yaml"])
    assert prepared_data(str(data)) == data
    (data / "recipe.yaml").write_text('{"format": "mydecide.report/1"}\n')  # what evaluate --out DATA once wrote
    with pytest.raises(ValueError, match=r"recipe\.yaml: does not match the sha256 that .*manifest\.json records"):
        prepared_data(str(data))
