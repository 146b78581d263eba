"""Resume after an interrupted or damaged checkpoint, safe loading, and refusing a changed recipe (issue 19, items
2, 3 and 5)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_loop import recipe_for, write_task

from mydecide.training.checkpoints import CHECKPOINT

ARGS = ("optim.max_steps=10", "save_every=4", "eval_every=100")
PICKLED = "optimizer.bin"  # a file of a checkpoint that torch unpickles (accelerator.save_state writes it)
_STRAIGHT: dict[str, Any] = {}


def last_weights(run: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(run / "last" / "adapter_model.safetensors")


def straight_weights(model: Path, data: Path, tmp: Path) -> dict[str, Any]:
    """The last adapter of an uninterrupted run (computed once for the module)."""
    if "weights" not in _STRAIGHT:
        from mydecide.training import loop

        _STRAIGHT["weights"] = last_weights(loop.train(recipe_for(model, data, tmp / "straight", *ARGS)))
    return _STRAIGHT["weights"]


def crash_after(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    from mydecide.training import loop

    real_write = loop.write_metrics

    def write_then_crash(run: Path, row: dict) -> None:
        real_write(run, row)
        if row["kind"] == "train" and row["update"] == n:
            raise KeyboardInterrupt("simulated kill")

    monkeypatch.setattr(loop, "write_metrics", write_then_crash)


class RunsCode:
    """Unpickling this calls open(marker, "w"): what a checkpoint that carries code could do instead."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("fault", ["killed while writing", "truncated", "carries code", "legacy tmp name"])
def test_resume_falls_back_past_a_bad_newest_checkpoint(
    fault: str,
    tiny_llama_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import torch

    from mydecide.training import loop

    data = write_task(tmp_path.parent / "resume-data", 64, 8)
    expected = straight_weights(tiny_llama_dir, data, tmp_path.parent)
    run = tmp_path / "killed"
    marker = tmp_path / "code-ran"
    if fault == "killed while writing":  # the optimizer state of update 8 never finishes
        real_save = torch.save

        def save(obj: Any, path: Any, *args: Any, **kwargs: Any) -> None:
            if Path(path).name == PICKLED and Path(path).parent.name == ".update-000008.tmp":
                Path(path).write_bytes(b"PK\x03\x04half")
                raise KeyboardInterrupt("simulated kill during checkpoint writing")
            real_save(obj, path, *args, **kwargs)

        monkeypatch.setattr(torch, "save", save)
    else:
        crash_after(monkeypatch, 9)
    with pytest.raises(KeyboardInterrupt):
        loop.train(recipe_for(tiny_llama_dir, data, run, *ARGS))
    monkeypatch.undo()
    checkpoints = run / "checkpoints"
    newest = checkpoints / "update-000008"
    if fault == "truncated":
        state = newest / PICKLED
        state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    elif fault == "carries code":
        torch.save({"update": 8, "x": RunsCode(marker)}, newest / PICKLED)
    elif fault == "legacy tmp name":  # what an older version left when killed while writing: it sorts last
        shutil.copytree(newest, checkpoints / "update-000009.tmp")
        (checkpoints / "update-000009.tmp" / PICKLED).write_bytes(b"PK\x03\x04half")
        shutil.rmtree(newest)
    assert not marker.exists()
    capsys.readouterr()
    resumed = loop.train(recipe_for(tiny_llama_dir, data, run, *ARGS), resume=True)
    err = capsys.readouterr().err
    assert not marker.exists()  # the pickled call never ran
    assert "resumed from update-000004" in err, err
    if fault in ("truncated", "carries code"):
        assert "update-000008" in err and "skipped" in err, err
    got = last_weights(resumed)
    assert got.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-5, atol=1e-6)
    names = sorted(p.name for p in checkpoints.iterdir() if not p.name.endswith(".tmp"))
    assert names[-1] == "update-000010" and all(CHECKPOINT.fullmatch(n) for n in names)


def test_a_changed_recipe_or_data_is_refused_on_resume(
    tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mydecide.training import loop

    data = write_task(tmp_path / "data", 32, 8)
    run = tmp_path / "run"
    crash_after(monkeypatch, 5)
    with pytest.raises(KeyboardInterrupt):
        loop.train(recipe_for(tiny_llama_dir, data, run, *ARGS))
    monkeypatch.undo()
    saved = (run / "recipe.yaml").read_text()

    def resume(*overrides: str, data_dir: Path = data, allow: tuple[str, ...] = ()) -> Path:
        return loop.train(recipe_for(tiny_llama_dir, data_dir, run, *ARGS, *overrides), resume=True, allow_change=allow)

    with pytest.raises(ValueError, match=r"lora\.r: 4 → 8; optim\.lr: 0\.005 → 0\.001; s"):
        resume("optim.lr=1e-3", "lora.r=8")
    with pytest.raises(ValueError, match=r"objective\.kind: proper → ce"):
        resume("objective.kind=ce")
    other = write_task(tmp_path / "other", 32, 8)
    rows = (other / "train.jsonl").read_text().splitlines()
    (other / "train.jsonl").write_text("\n".join(rows[1:]) + "\n")
    with pytest.raises(ValueError, match=r"train\.jsonl"):
        resume(data_dir=other)
    with pytest.raises(ValueError, match=r"optim\.max_steps: 10 → 12.*--allow-change optim\.max_steps"):
        resume("optim.max_steps=12")
    with pytest.raises(ValueError, match=r"optim\.lr cannot change"):
        resume("optim.lr=1e-3", allow=("optim.lr",))
    assert (run / "recipe.yaml").read_text() == saved  # a refused resume records nothing
    done = resume("optim.max_steps=12", allow=("optim.max_steps",))
    assert json.loads((done / "summary.json").read_text())["updates"] == 12
    assert "max_steps: 12" in (run / "recipe.yaml").read_text()


def test_train_flags_are_paths_not_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from mydecide.cli import app
    from mydecide.training import loop

    seen: dict[str, Any] = {}

    def fake_train(recipe: Any, *, resume: bool = False, allow_change: Any = ()) -> Path:
        seen.update(recipe=recipe, resume=resume, allow_change=tuple(allow_change))
        return Path(recipe.out)

    monkeypatch.setattr(loop, "train", fake_train)
    smoke = Path(__file__).resolve().parents[2] / "recipes" / "train" / "smoke.yaml"
    result = CliRunner().invoke(
        app,
        [
            "train",
            str(smoke),
            "--out",
            "runs/exp #2",
            "--data",
            "data: [x]",
            "--model",
            "models/a: b #c",
            "--resume",
            "--allow-change",
            "optim.max_steps",
        ],
    )
    assert result.exit_code == 0, result.output
    recipe = seen["recipe"]
    assert (recipe.out, recipe.data, recipe.model) == ("runs/exp #2", "data: [x]", "models/a: b #c")
    assert seen["resume"] and seen["allow_change"] == ("optim.max_steps",)


def test_a_checkpoint_that_cannot_be_written_is_one_line(
    tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from typer.testing import CliRunner

    from mydecide.cli import app

    real_save = torch.save

    def full_disk(obj: Any, path: Any, *args: Any, **kwargs: Any) -> None:
        if Path(path).name == PICKLED:  # what torch says when the disk is full or ulimit -f is hit
            raise RuntimeError(
                "[enforce fail at inline_container.cc:664] . PytorchStreamWriter failed writing "
                "file data/3: file write failed"
            )
        real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_disk)
    smoke = Path(__file__).resolve().parents[2] / "recipes" / "train" / "smoke.yaml"
    run = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        [
            "train",
            str(smoke),
            "--model",
            str(tiny_llama_dir),
            "--data",
            str(write_task(tmp_path / "data", 16, 4)),
            "--out",
            str(run),
            "optim.max_steps=2",
            "save_every=1",
            "eval_every=100",
        ],
    )
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "could not write the checkpoint" in errors[0] and "Traceback" not in result.output
    assert list((run / "checkpoints").iterdir()) == []  # nothing half-written is left to resume from
