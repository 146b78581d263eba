"""Resume after an interrupted or damaged checkpoint, safe loading, and refusing a changed recipe (issue 19, items
2, 3 and 5)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import crash_after, recipe_for, write_task

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


class RunsCode:
    """Unpickling this calls open(marker, "w"): what a checkpoint that carries code could do instead."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


@pytest.mark.parametrize(
    "fault", ["killed while writing", "truncated", "carries code", "legacy tmp name", "trainer state cut short"]
)
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
    elif fault == "trainer state cut short":  # the guard passes over it too, to the checkpoint resume loads
        state = newest / "trainer_state.json"
        state.write_bytes(state.read_bytes()[:40])
    elif fault == "legacy tmp name":  # what an older version left when killed while writing: it sorts last
        shutil.copytree(newest, checkpoints / "update-000009.tmp")
        (checkpoints / "update-000009.tmp" / PICKLED).write_bytes(b"PK\x03\x04half")
        shutil.rmtree(newest)
    assert not marker.exists()
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    lost = sum(row["update"] > 4 for row in logged)  # train 5..8 or 5..9, and dev at the epoch's end (8)
    assert lost >= 5
    capsys.readouterr()
    resumed = loop.train(recipe_for(tiny_llama_dir, data, run, *ARGS), resume=True)
    err = capsys.readouterr().err
    assert not marker.exists()  # the pickled call never ran
    assert "resumed from update-000004" in err, err
    if fault in ("truncated", "carries code", "trainer state cut short"):
        assert "update-000008" in err and "skipped" in err, err
    got = last_weights(resumed)
    assert got.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-5, atol=1e-6)
    names = sorted(p.name for p in checkpoints.iterdir() if not p.name.endswith(".tmp"))
    assert names[-1] == "update-000010" and all(CHECKPOINT.fullmatch(n) for n in names)
    # the updates after 4 that the killed run logged are trained again, and logged once
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    keys = [(row["kind"], row["update"]) for row in rows]
    assert len(keys) == len(set(keys)), keys
    assert [u for kind, u in keys if kind == "train"] == list(range(1, 11))
    assert f"metrics.jsonl: {lost} line(s) of updates after 4 dropped; they are trained again" in err, err


def test_resuming_forgets_the_metrics_of_later_updates_and_names_a_later_best_adapter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mydecide.training.checkpoints import forget_updates_after
    from mydecide.training.dev import DevLoss

    run = tmp_path / "run"
    (run / "adapter").mkdir(parents=True)

    def line(kind: str, update: int, **more: Any) -> str:
        return json.dumps({"kind": kind, "update": update, **more})

    kept = [
        line("dev", 0, log_loss=0.9, kept=True),
        *(line("train", u, loss=1.0) for u in range(1, 5)),
        line("dev", 4, log_loss=0.8, kept=True),
    ]
    later = [line("train", 5), line("dev", 6, log_loss=0.7, kept=True), line("dev", 8, log_loss=0.9, kept=False)]
    (run / "metrics.jsonl").write_text("\n".join([*kept, *later]) + '\n{"kind": "train", "upd')  # killed mid-line
    best = DevLoss(0.8, 4)
    forget_updates_after(run, 4, best)
    assert (run / "metrics.jsonl").read_text() == "".join(f"{row}\n" for row in kept)
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"[train] {run / 'metrics.jsonl'}: 4 line(s) of updates after 4 dropped; they are trained again",
        f"[train] WARNING: {run / 'adapter'} is the best adapter of update 6, after update 4 that this run resumes "
        "from; it stays until a dev evaluation replaces update 4's (the best up to update 4, dev log loss 0.8000)",
    ]
    # each dev row says whether it was kept (best_margin): the last kept one is RUN/adapter, whatever its loss
    flagged = [line("dev", 6, log_loss=0.7, kept=True), line("dev", 8, log_loss=0.75, kept=True)]
    (run / "metrics.jsonl").write_text("\n".join([*kept, *flagged, line("dev", 10, log_loss=0.9, kept=False)]) + "\n")
    forget_updates_after(run, 4, best)
    assert f"{run / 'adapter'} is the best adapter of update 8, after update 4" in capsys.readouterr().err
    (run / "metrics.jsonl").write_text("\n".join([*kept, line("dev", 6, log_loss=0.7, kept=False)]) + "\n")
    forget_updates_after(run, 4, best)
    assert "WARNING" not in capsys.readouterr().err
    # nothing after the checkpoint: the file is left as it is, and so is an adapter no later dev row beat
    forget_updates_after(run, 4, best)
    (run / "metrics.jsonl").write_text("\n".join([*kept, line("dev", 6, log_loss=0.85, kept=False)]) + "\n")
    forget_updates_after(run, 4, best)
    assert capsys.readouterr().err.splitlines() == [
        f"[train] {run / 'metrics.jsonl'}: 1 line(s) of updates after 4 dropped; they are trained again"
    ]


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


# ------------------------------------------------------------- the guard travels with the checkpoint (issue 36, item 3)

_KILLED: dict[str, Path] = {}


def killed_run(model: Path, data: Path, where: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run killed after update 5 (its one checkpoint: update 4), made once per module; each test gets a copy."""
    from mydecide.training import loop

    if "run" not in _KILLED:
        crash_after(monkeypatch, 5)
        with pytest.raises(KeyboardInterrupt):
            loop.train(recipe_for(model, data, where / "killed-once", *ARGS))
        monkeypatch.undo()
        _KILLED["run"] = where / "killed-once"
    copy = where / f"killed-{len(list(where.glob('killed-*')))}"
    shutil.copytree(_KILLED["run"], copy)
    return copy


def cli_train(model: Path, data: Path, run: Path, *extra: str) -> tuple[int, str]:
    from typer.testing import CliRunner

    from mydecide.cli import app

    smoke = Path(__file__).resolve().parents[2] / "recipes" / "train" / "smoke.yaml"
    args = ["train", str(smoke), "--model", str(model), "--data", str(data), "--out", str(run), *ARGS, *extra]
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.output


def one_error_line(output: str) -> str:
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in output, output
    return errors[0]


@pytest.mark.parametrize(
    "lost", ["recipe.yaml removed", "provenance removed", "recipe.yaml broken", "recipe.yaml a list"]
)
def test_resume_checks_the_checkpoint_whatever_became_of_recipe_yaml(
    lost: str, tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import yaml

    from mydecide.training import loop

    data = write_task(tmp_path.parent / "guard-data", 32, 8)
    run = killed_run(tiny_llama_dir, data, tmp_path.parent, monkeypatch)
    saved = run / "recipe.yaml"
    if lost == "recipe.yaml removed":
        saved.unlink()
    elif lost == "provenance removed":
        tree = yaml.safe_load(saved.read_text())
        del tree["_provenance"]
        saved.write_text(yaml.safe_dump(tree))
    elif lost == "recipe.yaml broken":
        saved.write_text("model: [unclosed\n  lora: {r: 4\n")
    else:
        saved.write_text("- model\n- lora\n")
    before = sorted(str(p.relative_to(run)) for p in run.rglob("*"))

    def resume(*overrides: str, data_dir: Path = data) -> Path:
        return loop.train(recipe_for(tiny_llama_dir, data_dir, run, *ARGS, *overrides), resume=True)

    with pytest.raises(ValueError, match=r"checkpoint update-000004 was trained with: optim\.lr: 0\.005 → 0\.001"):
        resume("optim.lr=1e-3")
    with pytest.raises(ValueError, match=r"lora\.dropout: 0\.0 → 0\.2"):
        resume("lora.dropout=0.2")
    other = write_task(tmp_path / "other", 32, 8)
    rows = (other / "train.jsonl").read_text().splitlines()
    (other / "train.jsonl").write_text("\n".join(rows[1:]) + "\n")
    with pytest.raises(ValueError, match=r"data train\.jsonl \(sha256\)"):
        resume(data_dir=other)
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*")) == before  # a refused resume writes nothing
    if lost == "recipe.yaml broken":  # on the command line: one line, no YAML traceback
        code, output = cli_train(tiny_llama_dir, data, run, "--resume", "optim.lr=1e-3")
        assert code == 2 and "optim.lr: 0.005 → 0.001" in one_error_line(output)
    code, output = cli_train(tiny_llama_dir, data, run, "--resume")  # the same recipe resumes, saying what it lost
    assert code == 0, output
    problem = {
        "recipe.yaml removed": "is missing",
        "recipe.yaml broken": "is unreadable (not valid YAML (line 2: ",
        "recipe.yaml a list": "is unreadable (a recipe must be a YAML mapping)",
    }.get(lost)
    warnings = [line for line in output.splitlines() if "recipe.yaml" in line and "WARNING" in line]
    if problem is None:  # readable, if without its data hashes: nothing to say
        assert warnings == [], output
    else:
        assert len(warnings) == 1 and warnings[0].startswith(f"[train] WARNING: {saved} {problem}"), output
        assert warnings[0].endswith(
            "; resuming against the recipe checkpoint update-000004 was trained with (every checkpoint carries it), "
            f"and writing {saved} again"
        ), output
    assert json.loads((run / "summary.json").read_text())["updates"] == 10
    assert "_provenance" in yaml.safe_load(saved.read_text())  # the resumed run wrote its recipe.yaml again


def test_a_checkpoint_carries_the_recipe_and_data_hashes(
    tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mydecide.io import sha256_file
    from mydecide.training.checkpoints import STATE_FILE

    data = write_task(tmp_path.parent / "guard-data", 32, 8)
    run = killed_run(tiny_llama_dir, data, tmp_path.parent, monkeypatch)
    state = json.loads((run / "checkpoints" / "update-000004" / STATE_FILE).read_text())
    assert state["recipe"]["optim"]["lr"] == 5e-3 and state["recipe"]["lora"]["dropout"] == 0.0
    assert state["data_sha256"] == {name: sha256_file(data / name) for name in ("train.jsonl", "dev.jsonl")}


@pytest.mark.parametrize("where", ["no such directory", "mistyped name", "empty directory", "no checkpoint yet"])
def test_resume_without_a_checkpoint_is_an_error_and_creates_nothing(
    where: str, tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_task(tmp_path / "data", 16, 4)
    run = tmp_path / "runs" / "exp1"
    if where == "mistyped name":
        killed = killed_run(
            tiny_llama_dir, write_task(tmp_path.parent / "guard-data", 32, 8), tmp_path.parent, monkeypatch
        )
        shutil.copytree(killed, run)
        run = run.with_name("exp_1")
    elif where == "empty directory":
        run.mkdir(parents=True)
    elif where == "no checkpoint yet":  # killed before its first checkpoint
        (run / "checkpoints").mkdir(parents=True)
        (run / "metrics.jsonl").write_text('{"kind": "train", "update": 1}\n')
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    code, output = cli_train(tiny_llama_dir, data, run, "--resume")
    line = one_error_line(output)
    assert code == 2 and str(run) in line, output
    assert ("no checkpoint to resume from" if run.exists() else "no such run directory") in line
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("saved", ["no format stamp", "format 2"])
def test_a_checkpoint_another_version_saved_is_refused_in_one_line(
    saved: str, tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mydecide.training.checkpoints import STATE_FILE

    data = write_task(tmp_path.parent / "guard-data", 32, 8)
    run = killed_run(tiny_llama_dir, data, tmp_path.parent, monkeypatch)
    trainer_state = run / "checkpoints" / "update-000004" / STATE_FILE
    state = json.loads(trainer_state.read_text())
    assert state["format"] == 1
    if saved == "no format stamp":  # what versions before the stamp wrote
        old = {"update": state["update"], "best": state["best"]}
    else:
        old = {**state, "format": 2}
    trainer_state.write_text(json.dumps(old))
    code, output = cli_train(tiny_llama_dir, data, run, "--resume")
    assert code == 2
    assert one_error_line(output) == (
        f"error: {trainer_state}: saved by another version of mydecide ({saved}; this version reads format 1); "
        "start a new run with another --out"
    )


def test_unreadable_trainer_states_are_passed_over_and_named(tmp_path: Path) -> None:
    from mydecide.config import TrainRecipe
    from mydecide.training.checkpoints import STATE_FILE, check_resumable

    recipe = TrainRecipe(out=str(tmp_path / "run"), data="d")
    older, newer = (tmp_path / "run" / "checkpoints" / f"update-00000{n}" for n in (4, 8))
    for folder in (older, newer):
        folder.mkdir(parents=True)
    trained = {"recipe": recipe.model_dump(mode="json"), "data_sha256": {"train.jsonl": "a" * 64}}
    (older / STATE_FILE).write_text(json.dumps({"format": 1, "update": 4, "best": {}, **trained}))
    (newer / STATE_FILE).write_text('{"update": 8, "be')  # cut short
    check_resumable(tmp_path / "run", recipe, {"train.jsonl": "a" * 64}, ())  # the older one vouches
    with pytest.raises(ValueError, match=r"from what checkpoint update-000004 was trained with: lora\.r: 32 → 8"):
        check_resumable(
            tmp_path / "run",
            recipe.model_copy(update={"lora": recipe.lora.model_copy(update={"r": 8})}),
            {"train.jsonl": "a" * 64},
            (),
        )
    (older / STATE_FILE).write_bytes(b"\xff\xfe not text")
    named = [re.escape(str(folder / STATE_FILE)) for folder in (newer, older)]
    with pytest.raises(ValueError, match=f"no checkpoint could be read: {named[0]} .*; {named[1]}"):
        check_resumable(tmp_path / "run", recipe, {"train.jsonl": "a" * 64}, ())


def test_a_second_train_on_a_held_run_stops_with_one_line_and_the_run_is_unchanged(
    tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 36, item 4: two `train --resume` on one run logged updates twice; the second now stops at the lock."""
    import os

    from mydecide.io import directory_lock

    data = write_task(tmp_path.parent / "guard-data", 32, 8)
    run = killed_run(tiny_llama_dir, data, tmp_path.parent, monkeypatch)
    before = {str(p): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
    with directory_lock(run, "train"):  # what the first `train --resume` holds while it runs
        code, output = cli_train(tiny_llama_dir, data, run, "--resume")
    assert code == 2
    line = one_error_line(output)
    assert str(run) in line and f"pid {os.getpid()}" in line, line
    assert {str(p): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()} == before
    assert not (run.parent / f".{run.name}.lock").exists()
    code, output = cli_train(tiny_llama_dir, data, run, "--resume")  # the lock released: it resumes
    assert code == 0, output
