"""Checkpoints through accelerator.save_state / load_state: what one holds, and a killed run that resumes retraces
the uninterrupted run's losses, learning rates and weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import recipe_for, write_task

# a linear decay, dropout and shuffled options: the scheduler, the RNGs and the data order all have to come back
ARGS = (
    "optim.max_steps=8",
    "save_every=3",
    "eval_every=100",
    "optim.schedule=linear",
    "lora.dropout=0.1",
)


def train_rows(run: Path) -> dict[int, dict[str, Any]]:
    """The last train row written for each update (a resumed run writes the updates after its checkpoint again)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["update"]: r for r in rows if r["kind"] == "train"}


def test_a_checkpoint_holds_accelerate_state_lora_weights_only_and_json_trainer_state(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    from safetensors import safe_open

    from mydecide.training import checkpoints, loop

    run = loop.train(recipe_for(tiny_llama_dir, write_task(tmp_path / "data", 32, 8), tmp_path / "run", *ARGS))
    names = [p.name for p in checkpoints.checkpoint_dirs(run)]
    assert names == ["update-000006", "update-000008"]  # keep_checkpoints: 2 by default; no .tmp left
    newest = run / "checkpoints" / "update-000008"
    assert {p.name for p in newest.iterdir()} == {
        "model.safetensors",
        "optimizer.bin",
        "scheduler.bin",
        "random_states_0.pkl",
        "trainer_state.json",
    }
    state = json.loads((newest / checkpoints.STATE_FILE).read_text())
    assert state["update"] == 8 and state["best"]["update"] == 8  # the last update is always evaluated
    assert len(state["best"]["dev_losses"]) == 8  # its dev terms, for the comparisons of a resumed run
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best"]["update"] == 8 and "dev_losses" not in summary["best"]
    dev = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"dev"' in line]
    assert dev and all(isinstance(row["kept"], bool) for row in dev) and dev[-1]["kept"]
    assert all("losses" not in row for row in dev)
    with safe_open(str(newest / "model.safetensors"), framework="pt") as weights:
        keys = list(weights.keys())
    assert keys and all(".lora_A." in k or ".lora_B." in k for k in keys)  # the frozen base is not copied
    # the adapter saved beside it holds the same LoRA tensors as the checkpoint
    from safetensors.torch import load_file

    adapter = load_file(run / "last" / "adapter_model.safetensors")
    assert len(adapter) == len(keys)


def test_a_killed_run_resumes_along_the_same_loss_and_learning_rate_trajectory(
    tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from safetensors.torch import load_file

    from mydecide.training import checkpoints, loop

    data = write_task(tmp_path / "data", 48, 8)
    straight = loop.train(recipe_for(tiny_llama_dir, data, tmp_path / "straight", *ARGS))

    real_save = checkpoints.save_checkpoint

    def save_then_die(accelerator: Any, run: Path, update: int, *args: Any) -> Path:
        saved = real_save(accelerator, run, update, *args)
        if update == 3:
            raise KeyboardInterrupt("simulated kill after the checkpoint of update 3")
        return saved

    monkeypatch.setattr(checkpoints, "save_checkpoint", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        loop.train(recipe_for(tiny_llama_dir, data, tmp_path / "killed", *ARGS))
    monkeypatch.undo()
    resumed = loop.train(recipe_for(tiny_llama_dir, data, tmp_path / "killed", *ARGS), resume=True)

    want, got = train_rows(straight), train_rows(resumed)
    assert sorted(got) == sorted(want) == list(range(1, 9))
    for update in range(4, 9):  # the updates trained after the resume
        assert got[update]["loss"] == pytest.approx(want[update]["loss"], rel=1e-5, abs=1e-7), update
        assert got[update]["lr"] == pytest.approx(want[update]["lr"], rel=1e-9)
    assert [want[u]["lr"] for u in (1, 4, 8)] == pytest.approx([5e-3 * (1 - u / 8) for u in (1, 4, 8)])
    a = load_file(straight / "last" / "adapter_model.safetensors")
    b = load_file(resumed / "last" / "adapter_model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)
