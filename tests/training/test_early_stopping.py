"""early_stopping.patience: training stops after that many dev evaluations without a new lowest dev log loss, keeps
the adapter best on dev, says why in its last line, and a resumed run counts on from its checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import crash_after, recipe_for, write_task

from mydecide.training.dev import DevLoss, KeptAdapter

# the dev log loss each update's adapter gets (scripted: a tiny random model's is not a plot to rely on)
DEV_LOSS = {0: 1.0, 1: 0.8, 2: 0.9, 3: 0.85, 4: 0.95, 5: 0.97}
ARGS = ("optim.max_steps=10", "eval_every=1", "save_every=100", "best_margin=0")


def scripted_dev(monkeypatch: pytest.MonkeyPatch) -> None:
    """dev_metrics answers DEV_LOSS of the update the loop last wrote a training line for (0 before any)."""
    from mydecide.training import loop

    at = {"update": 0}
    real_write = loop.write_metrics

    def write(run: Path, row: dict) -> None:
        real_write(run, row)
        if row["kind"] == "train":
            at["update"] = row["update"]

    def dev_metrics(*args: object) -> dict:
        loss = DEV_LOSS.get(at["update"], 0.99)
        figures = {"n": 4, "accuracy": 0.5, "majority_accuracy": 0.25, "log_loss": loss, "flip_rate": 0.0}
        return {**figures, "top_letter": "-", "top_letter_share": 0.0, "warnings": [], "losses": [loss], "tasks": {}}

    monkeypatch.setattr(loop, "write_metrics", write)
    monkeypatch.setattr(loop, "dev_metrics", dev_metrics)


def train_updates(run: Path) -> list[int]:
    return [r["update"] for r in map(json.loads, (run / "metrics.jsonl").open()) if r["kind"] == "train"]


def last_line(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_patience_stops_training_keeps_the_best_adapter_and_says_why(
    tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from mydecide.training.checkpoints import STATE_FILE
    from mydecide.training.loop import train

    scripted_dev(monkeypatch)
    data, out = write_task(tmp_path / "data", 16, 4), tmp_path / "run"
    run = train(recipe_for(tiny_llama_dir, data, out, *ARGS, "early_stopping.patience=2"))
    assert train_updates(run) == [1, 2, 3]  # update 1 set the lowest; 2 and 3 did not beat it
    reason = (
        "stopped early at update 3 of 10: 2 dev evaluation(s) without a new lowest dev log loss "
        "(early_stopping.patience 2; the lowest: 0.8000 at update 1)"
    )
    kept = f"best on dev: update 1 (dev log loss 0.8000) → {run / 'adapter'}; last → {run / 'last'}"
    assert last_line(capsys) == f"[train] done: {reason}; {kept}"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped_early"] == reason and summary["updates"] == 3 and summary["best"]["update"] == 1
    assert (run / "adapter" / "adapter_config.json").is_file() and (run / "last" / "adapter_config.json").is_file()
    state = json.loads((run / "checkpoints" / "update-000003" / STATE_FILE).read_text())
    assert state["format"] == 2 and state["best"]["since_lowest"] == 2  # what a resume needs to count on

    # resumed as it was, it stops again at once; with more patience it counts on from 2
    train(recipe_for(tiny_llama_dir, data, out, *ARGS, "early_stopping.patience=2"), resume=True)
    assert train_updates(run) == [1, 2, 3] and reason in last_line(capsys)
    more = recipe_for(tiny_llama_dir, data, out, *ARGS, "early_stopping.patience=4")
    train(more, resume=True, allow_change=["early_stopping.patience"])
    assert train_updates(run) == [1, 2, 3, 4, 5]
    assert "stopped early at update 5 of 10: 4 dev evaluation(s)" in last_line(capsys)


def test_a_killed_run_resumed_stops_where_an_uninterrupted_one_does(
    tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from mydecide.training.loop import train

    scripted_dev(monkeypatch)
    data = write_task(tmp_path / "data", 16, 4)
    recipe = recipe_for(tiny_llama_dir, data, tmp_path / "run", *ARGS, "save_every=2", "early_stopping.patience=3")
    with monkeypatch.context() as killed:
        crash_after(killed, 3)  # the checkpoint of update 2 counts one evaluation since the lowest (update 1)
        with pytest.raises(KeyboardInterrupt):
            train(recipe)
    run = train(recipe, resume=True)
    assert train_updates(run) == [1, 2, 3, 4]  # 2, 3, 4 without a new lowest: as if never killed
    assert "stopped early at update 4 of 10: 3 dev evaluation(s)" in last_line(capsys)


def test_the_count_since_the_lowest_and_the_stop_reason() -> None:
    best = KeptAdapter()
    assert best.stop_reason(None, 0, 10) is None and best.stop_reason(1, 0, 10) is None
    best = best.evaluated(1.0).after({"log_loss": 1.0, "accuracy": 0.5, "majority_accuracy": 0.4}, [1.0], 0)
    assert best.since_lowest == 0 and best.lowest == DevLoss(1.0, 0, (1.0,))
    best = best.evaluated(float("nan")).evaluated(1.0)  # neither a NaN nor a tie is a new lowest
    assert best.since_lowest == 2 and best.stop_reason(3, 4, 10) is None
    assert best.stop_reason(2, 4, 10) == (
        "stopped early at update 4 of 10: 2 dev evaluation(s) without a new lowest dev log loss "
        "(early_stopping.patience 2; the lowest: 1.0000 at update 0)"
    )
    kept = best.evaluated(0.9).after({"log_loss": 0.9, "accuracy": 0.6, "majority_accuracy": 0.4}, [0.9], 6)
    assert kept.since_lowest == 0 and KeptAdapter.from_json(kept.to_json()) == kept
    assert KeptAdapter.from_json(best.to_json()).since_lowest == 2


def test_train_says_how_many_updates_and_epochs_and_which_key_decided(
    tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mydecide.training.loop import train

    data = write_task(tmp_path / "data", 16, 4)  # 16 records: 4 micro-batches of 4, 2 per update
    train(recipe_for(tiny_llama_dir, data, tmp_path / "run", "eval_at_start=false"))  # smoke: epochs 1
    assert (
        "[train] 16 train / 4 dev records; 2 updates = 1.0 epochs (optim.epochs 1; optim.max_steps unset) of 4 "
        "micro-batches of 4 per process × 1 process(es), 2 per update" in capsys.readouterr().err.splitlines()
    )
