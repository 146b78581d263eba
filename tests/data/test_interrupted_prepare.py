"""A prepare re-run interrupted at any file-system step leaves the old complete outputs or the new complete ones,
and every reader refuses a directory whose files do not match its manifest (issue 19, items 1 and 6)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prepare_builders import CHOICE, make, sentence, write_jsonl

from mydecide.config import DataRecipe
from mydecide.data.prepare import prepare
from mydecide.record_files import load_records

HERE = Path(__file__).resolve().parent
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def recipe_with_seed(source: Path, seed: int) -> DataRecipe:
    return DataRecipe.model_validate(
        {
            "sources": [{"kind": "jsonl", "path": str(source)}],
            "split": {"dev_fraction": 0.3, "test_fraction": 0.1, "seed": seed},
        }
    )


def snapshot(out: Path) -> dict[str, Any] | None:
    """The directory's files, with the manifest's record of them in place of the manifest (it holds timings)."""
    if not out.exists():
        return None
    files: dict[str, Any] = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    if "manifest.json" in files:
        files["manifest.json"] = json.loads(files["manifest.json"])["outputs"]
    return files


@pytest.fixture
def source(tmp_path: Path) -> Path:
    rows = [make(i, state=sentence(i, 30), question=CHOICE) for i in range(60)]
    (tmp_path / "src").mkdir()
    return write_jsonl(tmp_path / "src" / "records.jsonl", rows)


# Audit events that change the file system; an armed hook interrupts the n-th one under the watched directory.
_ARMED: dict[str, Any] = {"root": None, "countdown": 0, "fired": False}


def _changes_files(event: str, args: tuple[Any, ...]) -> bool:
    if event == "open":
        path, mode, flags = args
        return isinstance(path, str) and (
            (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool((flags or 0) & WRITE_FLAGS)
        )
    return event in (
        "os.rename",
        "os.remove",
        "os.rmdir",
        "os.mkdir",
        "shutil.rmtree",
        "os.chmod",
        "ctypes.call_function",
    )


def _hook(event: str, args: tuple[Any, ...]) -> None:
    root = _ARMED["root"]
    if root is None or _ARMED["fired"] or not _changes_files(event, args):
        return
    if event != "ctypes.call_function" and root not in str(args[0] if args else ""):
        return
    _ARMED["countdown"] -= 1
    if _ARMED["countdown"] == 0:
        _ARMED["fired"] = True
        raise KeyboardInterrupt(f"simulated Ctrl-C at {event} {args[:2]}")


sys.addaudithook(_hook)


def test_ctrl_c_at_every_step_of_a_rerun_leaves_old_or_new(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs" / "p"
    prepare(recipe_with_seed(source, 13), out)
    old = snapshot(out)
    prepare(recipe_with_seed(source, 7), tmp_path / "fresh")
    new = snapshot(tmp_path / "fresh")
    assert old is not None and new is not None and old != new
    step = 0
    while step < 200:
        step += 1
        _ARMED.update(root=str(tmp_path / "runs"), countdown=step, fired=False)
        try:
            prepare(recipe_with_seed(source, 7), out)
        except KeyboardInterrupt:
            pass
        finally:
            fired, _ARMED["root"] = _ARMED["fired"], None
        now = snapshot(out)
        assert now is not None
        if now == old:
            assert fired
        else:
            assert now == new, step
        for name in ("train.jsonl", "dev.jsonl", "test.jsonl"):
            load_records(out / name)  # every reader's manifest check passes
        left = sorted(p.name for p in (tmp_path / "runs").iterdir())  # an interrupted clean-up leaves hidden dirs
        assert left[-1] == "p" and all(name.startswith(".p.staging-") or name == ".p.lock" for name in left[:-1]), step
        if not fired:
            break
        prepare(recipe_with_seed(source, 13), out)  # back to the old outputs for the next step
        assert snapshot(out) == old
        assert [p.name for p in (tmp_path / "runs").iterdir()] == ["p"]  # and what was left is gone
    assert step > 3  # the hook saw the writes


KILL_SCRIPT = """
import os, sys
sys.path.insert(0, {here!r})
from mydecide.config import DataRecipe
from mydecide.data.prepare import prepare
root, countdown = {root!r}, [{step}]
def hook(event, args):
    if event in ("os.rename", "os.remove", "os.rmdir", "os.mkdir", "shutil.rmtree") or (
            event == "open" and isinstance(args[0], str) and args[2] & {flags}):
        if root in str(args[0]):
            countdown[0] -= 1
            if countdown[0] == 0:
                os._exit(9)
    elif event == "ctypes.call_function":
        countdown[0] -= 1
        if countdown[0] == 0:
            os._exit(9)
sys.addaudithook(hook)
prepare(DataRecipe.model_validate({recipe!r}), {out!r})
"""


def test_kill_9_during_a_rerun_leaves_old_or_new_and_the_next_run_cleans_up(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs" / "p"
    first = recipe_with_seed(source, 13)
    prepare(first, out)
    old = snapshot(out)
    second = recipe_with_seed(source, 7).model_dump(mode="json")
    outcomes = []
    for step in (1, 4, 9, 14, 17, 20, 23):
        script = KILL_SCRIPT.format(
            here=str(HERE), root=str(tmp_path / "runs"), step=step, flags=WRITE_FLAGS, recipe=second, out=str(out)
        )
        code = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert code.returncode in (0, 9), code.stderr
        now = snapshot(out)
        assert now is not None
        if now != old:
            for name in ("train.jsonl", "dev.jsonl", "test.jsonl"):
                load_records(out / name)
        outcomes.append(now == old)
        prepare(first, out)  # also removes what the killed run left beside the directory
        assert snapshot(out) == old
        assert [p.name for p in (tmp_path / "runs").iterdir()] == ["p"]
    assert True in outcomes


def test_readers_refuse_a_mixed_directory(source: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    prepare(recipe_with_seed(source, 13), a)
    prepare(recipe_with_seed(source, 7), b)
    (a / "dev.jsonl").write_bytes((b / "dev.jsonl").read_bytes())  # what a file-by-file re-run left behind
    load_records(a / "train.jsonl")
    with pytest.raises(ValueError, match=r"dev\.jsonl.*manifest\.json"):
        load_records(a / "dev.jsonl")


def test_train_refuses_a_mixed_directory_in_one_line(source: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from mydecide.cli import app

    a, b = tmp_path / "a", tmp_path / "b"
    prepare(recipe_with_seed(source, 13), a)
    prepare(recipe_with_seed(source, 7), b)
    (a / "train.jsonl").write_bytes((b / "train.jsonl").read_bytes())
    recipe = HERE.parents[1] / "recipes" / "train" / "smoke.yaml"
    result = CliRunner().invoke(app, ["train", str(recipe), "--data", str(a), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert "train.jsonl" in result.output and "manifest" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_prepare_keeps_files_it_did_not_write(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match=r"holds notes\.txt but no manifest\.json of an earlier prepare"):
        prepare(recipe_with_seed(source, 13), out)
    assert (out / "notes.txt").read_text() == "keep me"
    (out / "notes.txt").unlink()
    prepare(recipe_with_seed(source, 13), out)
    manifest = json.loads((out / "manifest.json").read_text())  # an output a newer version wrote is its own
    manifest["outputs"]["extra.jsonl"] = {"rows": 0, "sha256": ""}
    (out / "manifest.json").write_text(json.dumps(manifest))
    (out / "extra.jsonl").write_text("")
    prepare(recipe_with_seed(source, 13), out)
    assert not (out / "extra.jsonl").exists()
    (out / "notes.txt").write_text("keep me")  # beside prepare's own outputs: still not replaced
    with pytest.raises(ValueError, match=r"holds notes\.txt, which this command did not write"):
        prepare(recipe_with_seed(source, 13), out)
    assert (out / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize(
    ("planted", "named"),
    [("test/mine.txt", "test"), ("train/NOTES.md", "train/NOTES.md"), (".draft.tmp", ".draft.tmp")],
)
def test_prepare_refuses_what_its_manifest_does_not_list_at_any_depth(
    planted: str, named: str, source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's file inside a prepare output, in a folder prepare uses for a split (test/, train/) or hidden like
    an interrupted write's leftover, is refused before any source row is read, and stays (issue 64)."""
    import mydecide.data.prepare as prepare_module

    recipe = DataRecipe.model_validate(
        {
            "sources": [{"kind": "jsonl", "path": str(source)}],
            "split": {"dev_fraction": 0.3, "test_fraction": 0.0},
            "output": {"rows_per_file": 20},
        }
    )
    out = tmp_path / "out"
    prepare(recipe, out)
    (out / planted).parent.mkdir(exist_ok=True)
    (out / planted).write_text("keep me")
    monkeypatch.setattr(prepare_module, "convert_and_validate", lambda *a, **k: pytest.fail("read a source"))
    with pytest.raises(ValueError, match=f"holds {re.escape(named)}, which this command did not write"):
        prepare(recipe, out)
    assert (out / planted).read_text() == "keep me"


def files_of(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_prepare_never_replaces_a_users_own_split_files(source: Path, tmp_path: Path, monkeypatch) -> None:
    """A directory of the user's own train.jsonl / dev.jsonl (prepare's names, but no manifest of prepare's) is
    refused before any work, byte for byte unchanged; so are a source inside --out and --out at the working
    directory or above it."""
    import mydecide.data.prepare as prepare_module
    from mydecide.data.inputs import convert_and_validate

    converted: list[object] = []
    real = convert_and_validate
    monkeypatch.setattr(prepare_module, "convert_and_validate", lambda *a, **k: converted.append(a) or real(*a, **k))
    mine = tmp_path / "mydata"
    mine.mkdir()
    (mine / "train.jsonl").write_bytes(source.read_bytes())
    (mine / "dev.jsonl").write_text("")
    before = files_of(tmp_path)
    with pytest.raises(ValueError, match=r"mydata: holds dev\.jsonl, train\.jsonl but no manifest\.json"):
        prepare(recipe_with_seed(source, 13), mine)
    inside = recipe_with_seed(mine / "train.jsonl", 13)
    with pytest.raises(ValueError, match=r"sources\[0\]: .*mydata/train\.jsonl is inside --out"):
        prepare(inside, mine)
    monkeypatch.chdir(mine)
    for out in (Path("."), tmp_path):
        with pytest.raises(ValueError, match="is the working directory or above it"):
            prepare(recipe_with_seed(source, 13), out)
    assert files_of(tmp_path) == before and (mine / "train.jsonl").read_bytes() == source.read_bytes()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "manifest.json").write_text("{not json")
    before = files_of(tmp_path)
    with pytest.raises(ValueError, match=r"broken/manifest\.json: unreadable, so prepare cannot tell"):
        prepare(recipe_with_seed(source, 13), tmp_path / "broken")
    assert files_of(tmp_path) == before and not converted  # refused before reading a single source row


@pytest.mark.parametrize("case", ["under a file", "full disk"])
def test_os_errors_are_one_line(case: str, source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    import yaml
    from typer.testing import CliRunner

    from mydecide.cli import app

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"sources": [{"kind": "jsonl", "path": str(source)}]}))
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "p" if case == "under a file" else tmp_path / "p"
    if case == "full disk":
        import mydecide.io

        def full(path: Any, text: str) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

        monkeypatch.setattr(mydecide.io, "atomic_write_text", full)
    result = CliRunner().invoke(app, ["prepare", str(recipe), "--out", str(out), "--no-progress"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert (
        ("Not a directory" in lines[0] or "not a directory" in lines[0])
        if case == "under a file"
        else "No space left" in lines[0]
    )
    assert json.dumps(lines)  # printable


@pytest.mark.parametrize("verb", ["calibrate", "evaluate"])
def test_calibrate_and_evaluate_refuse_a_mixed_directory_in_one_line(verb: str, source: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from mydecide.cli import app

    a, b = tmp_path / "a", tmp_path / "b"
    prepare(recipe_with_seed(source, 13), a)
    prepare(recipe_with_seed(source, 7), b)
    (a / "dev.jsonl").write_bytes((b / "dev.jsonl").read_bytes())
    result = CliRunner().invoke(app, [verb, "--data", str(a / "dev.jsonl"), "--out", str(tmp_path / "o"), "-q"])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "dev.jsonl" in errors[0] and "manifest.json" in errors[0], result.output
    assert "Traceback" not in result.output
