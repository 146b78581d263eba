"""Experiment tracking: `report_to: tensorboard` writes the loss, learning rate, gradient norm, throughput, dev
metrics and collapse signals of every update to an event file (read back with TensorBoard's own reader), and
metrics.jsonl lines carry time, epoch, gradient norm and throughput. All offline."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from mydecide.config import TrainRecipe
from mydecide.recipe_loading import load_recipe
from mydecide.recipe_parsing import RecipeError

SMOKE = Path(__file__).resolve().parents[2] / "recipes" / "train" / "smoke.yaml"


def write_data(out: Path, n_train: int = 16, n_dev: int = 4) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "id": f"r{i}",
            "task": "route",
            "state": f"ticket {i}: {'outage' if i % 3 else 'invoice'}",
            "question": {"type": "choice", "instructions": "Which team?", "criteria": ["billing", "engineering"]},
            "answer": "engineering" if i % 3 else "billing",
        }
        for i in range(n_train + n_dev)
    ]
    (out / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:n_train]))
    (out / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[n_train:]))
    return out


def test_tensorboard_event_file_holds_loss_and_dev_metrics(tiny_llama_dir: Path, tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from mydecide.training.loop import train

    run = train(
        load_recipe(
            SMOKE,
            [
                f"model={tiny_llama_dir}",
                f"data={write_data(tmp_path / 'data')}",
                f"out={tmp_path / 'run'}",
                "optim.max_steps=4",
                "eval_every=2",
                "report_to=tensorboard",
            ],
            model=TrainRecipe,
        )
    )
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r["kind"] == "train"]
    dev_rows = [r for r in rows if r["kind"] == "dev"]
    assert [r["update"] for r in train_rows] == [1, 2, 3, 4]
    for r in train_rows:
        assert r["grad_norm"] > 0 and r["updates_per_s"] > 0 and r["questions_per_s"] > 0
        assert r["time"] > 1.7e9
    assert [r["epoch"] for r in train_rows] == [0.5, 1.0, 1.5, 2.0]  # 2 updates of 2 micro-batches per epoch

    events = EventAccumulator(str(run / "logs" / "mydecide"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for tag in (
        "train/loss",
        "train/lr",
        "train/grad_norm",
        "train/updates_per_s",
        "train/questions_per_s",
        "train/epoch",
        "dev/accuracy",
        "dev/log_loss",
        "dev/ece",
        "dev/flip_rate",
        "dev/top_letter_share",
        "dev/majority_accuracy",
        "dev/collapse_warnings",
    ):
        assert tag in tags, (tag, sorted(tags))
    loss = events.Scalars("train/loss")
    assert [e.step for e in loss] == [1, 2, 3, 4]
    assert [e.value for e in loss] == pytest.approx([r["loss"] for r in train_rows], rel=1e-5)
    dev_loss = events.Scalars("dev/log_loss")
    assert [e.step for e in dev_loss] == [r["update"] for r in dev_rows] == [0, 2, 4]
    assert [e.value for e in dev_loss] == pytest.approx([r["log_loss"] for r in dev_rows], rel=1e-5)


def test_without_report_to_no_tracker_runs(tiny_llama_dir: Path, tmp_path: Path) -> None:
    from mydecide.training.loop import train

    run = train(
        load_recipe(
            SMOKE,
            [
                f"model={tiny_llama_dir}",
                f"data={write_data(tmp_path / 'data')}",
                f"out={tmp_path / 'run'}",
                "optim.max_steps=1",
            ],
            model=TrainRecipe,
        )
    )
    assert not (run / "logs").exists()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [set(r) >= {"grad_norm", "epoch", "time", "updates_per_s"} for r in rows if r["kind"] == "train"] == [True]


def test_a_tracker_whose_package_is_missing_is_an_error_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mydecide.training.loop import train

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    recipe = load_recipe(
        SMOKE,
        [f"data={write_data(tmp_path / 'data')}", f"out={tmp_path / 'run'}", "report_to=[tensorboard, wandb]"],
        model=TrainRecipe,
    )
    with pytest.raises(ValueError, match=r"^report_to: wandb needs the wandb package, which is not installed"):
        train(recipe)
    assert not (tmp_path / "run").exists()


def test_report_to_takes_one_tracker_or_a_list() -> None:
    def report_to(value: str) -> list[str]:
        return load_recipe(SMOKE, [f"report_to={value}"], model=TrainRecipe).report_to

    assert load_recipe(SMOKE, [], model=TrainRecipe).report_to == ["none"]
    assert report_to("tensorboard") == ["tensorboard"]
    assert report_to("[tensorboard, mlflow, tensorboard]") == ["tensorboard", "mlflow"]
    with pytest.raises(RecipeError, match="none cannot be combined"):
        report_to("[none, wandb]")
    with pytest.raises(RecipeError, match=r"report_to\.0: Input should be 'none', 'tensorboard', 'wandb' or 'mlflow'"):
        report_to("neptune")


def test_a_dev_lines_per_task_metrics_reach_the_trackers_as_section_task_name() -> None:
    from mydecide.training.tracking import tracked

    row = {
        "kind": "dev",
        "update": 4,
        "log_loss": 0.7,
        "kept": True,
        "tasks": {
            "team": {"n": 6, "accuracy": 0.5, "log_loss": 0.9},
            "pii": {"n": 2, "accuracy": None, "log_loss": 0.2},
        },
    }
    assert tracked("dev", row) == {
        "dev/log_loss": 0.7,
        "dev/team/n": 6.0,
        "dev/team/accuracy": 0.5,
        "dev/team/log_loss": 0.9,
        "dev/pii/n": 2.0,
        "dev/pii/log_loss": 0.2,
    }
