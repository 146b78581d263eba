"""Integration tests of `mydecide train` on tiny models: learning, LoRA targets, resume, multi-process."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import SMOKE, TWO_CPU_PROCESSES, recipe_for, write_task

from mydecide.config import TrainRecipe
from mydecide.recipe_loading import load_recipe


def dev_rows(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "dev"]


@pytest.mark.parametrize("objective", ["proper", "rlcd", "ce"])
def test_each_objective_lowers_dev_log_loss(objective: str, tiny_llama_dir: Path, tmp_path: Path) -> None:
    from mydecide.training.loop import train

    data = write_task(tmp_path / "data")
    # cross-entropy overshoots at proper's constant 2e-2 on this 2-layer random model, and where it lands then depends
    # on rounding (docs/shared-state.md, "Exactness"); the best dev adapter is the one train keeps
    lr = {"rlcd": "2e-3", "ce": "5e-3"}.get(objective, "2e-2")
    # options in a fixed order, so the prior is a letter: learnable in a few updates by a 2-layer random model
    run = train(
        recipe_for(
            tiny_llama_dir,
            data,
            tmp_path / "run",
            f"objective.kind={objective}",
            "optim.max_steps=32",  # proper sits on a plateau for its first 16 updates with the short wording's reads
            f"optim.lr={lr}",
            "eval_every=8",
            "shuffle_options=false",
        )
    )
    rows = dev_rows(run)
    assert min(row["log_loss"] for row in rows[1:]) < rows[0]["log_loss"] - 0.2, rows  # the adapter train keeps
    assert (run / "adapter" / "adapter_config.json").is_file() and (run / "last" / "adapter_config.json").is_file()
    assert (run / "adapter" / "mydecide_render.json").is_file()


def test_lora_weights_move_and_only_lora_is_saved(tiny_llama_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from mydecide.training.loop import train

    run = train(recipe_for(tiny_llama_dir, write_task(tmp_path / "data", 32, 8), tmp_path / "run", "optim.max_steps=3"))
    weights = load_file(run / "last" / "adapter_model.safetensors")
    lora_b = [v for k, v in weights.items() if "lora_B" in k]
    assert lora_b and all("lora_" in k for k in weights)
    assert max(float(v.abs().max()) for v in lora_b) > 0  # B starts at zero: any non-zero value was learned


@pytest.mark.parametrize("at_start", [True, False])
def test_eval_at_start_decides_the_update_0_dev_pass(tiny_llama_dir: Path, tmp_path: Path, at_start: bool) -> None:
    from mydecide.training.loop import train

    data = write_task(tmp_path / "data", 16, 8)
    overrides = ("optim.max_steps=2", "optim.grad_accum=1", "eval_every=100", f"eval_at_start={str(at_start).lower()}")
    run = train(recipe_for(tiny_llama_dir, data, tmp_path / "run", *overrides))
    assert [r["update"] for r in dev_rows(run)] == ([0, 2] if at_start else [2])
    assert (run / "adapter" / "adapter_model.safetensors").is_file()  # the last update's pass still picks one


def test_all_linear_targets_cover_gated_deltanet_projections(tiny_qwen_dir: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from mydecide.training.model import lora_targets

    lm = AutoModelForCausalLM.from_pretrained(tiny_qwen_dir)
    peft_model = get_peft_model(lm, LoraConfig(r=2, target_modules=lora_targets(lm, "all-linear")))
    names = {n.rsplit(".", 1)[-1] for n in peft_model.targeted_module_names}
    assert {"in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b", "out_proj"} <= names  # Gated DeltaNet
    assert {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"} <= names
    assert not any("lm_head" in n for n in peft_model.targeted_module_names)


def test_last_layers_adapts_only_the_top_of_the_decoder(tiny_llama_dir: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from mydecide.training.model import lora_targets

    lm = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    n = len(lm.get_decoder().layers)
    every = get_peft_model(lm, LoraConfig(r=2, target_modules=lora_targets(lm, "all-linear"))).targeted_module_names
    lm = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    top = get_peft_model(lm, LoraConfig(r=2, target_modules=lora_targets(lm, "all-linear", 1))).targeted_module_names
    assert top and {t.split(".layers.")[1].split(".")[0] for t in top} == {str(n - 1)}
    assert len(top) * n == len(every)  # the same linear layers, in one layer of n
    with pytest.raises(ValueError, match="decoder layers"):
        lora_targets(lm, "all-linear", n + 1)
    with pytest.raises(ValueError, match="all-linear"):
        lora_targets(lm, ["q_proj"], 1)


def test_hybrid_model_trains(tiny_qwen_dir: Path, tmp_path: Path) -> None:
    from mydecide.training.loop import train

    run = train(recipe_for(tiny_qwen_dir, write_task(tmp_path / "data", 32, 8), tmp_path / "run", "optim.max_steps=3"))
    assert (run / "last" / "adapter_model.safetensors").is_file()


def test_killed_run_resumes_to_the_same_weights(
    tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from safetensors.torch import load_file

    from mydecide.training import loop

    data = write_task(tmp_path / "data", 64, 8)
    # resumed at update 4 of epoch 0 (8 updates an epoch): epoch 1's shuffled options are planned again
    args = ("optim.max_steps=10", "save_every=4", "eval_every=100", "lora.dropout=0.1")
    straight = loop.train(recipe_for(tiny_llama_dir, data, tmp_path / "straight", *args))

    real_write = loop.write_metrics

    def crash_after_update_6(run: Path, row: dict) -> None:
        real_write(run, row)
        if row["kind"] == "train" and row["update"] == 6:
            raise KeyboardInterrupt("simulated kill")

    monkeypatch.setattr(loop, "write_metrics", crash_after_update_6)
    with pytest.raises(KeyboardInterrupt):
        loop.train(recipe_for(tiny_llama_dir, data, tmp_path / "killed", *args))
    monkeypatch.setattr(loop, "write_metrics", real_write)
    assert [p.name for p in sorted((tmp_path / "killed" / "checkpoints").glob("update-*"))] == ["update-000004"]
    resumed = loop.train(recipe_for(tiny_llama_dir, data, tmp_path / "killed", *args), resume=True)

    a = load_file(straight / "last" / "adapter_model.safetensors")
    b = load_file(resumed / "last" / "adapter_model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)
    assert any(float(v.abs().max()) > 0 for k, v in a.items() if "lora_B" in k)


def test_existing_run_needs_resume(tiny_llama_dir: Path, tmp_path: Path) -> None:
    from mydecide.training.loop import train

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("")
    with pytest.raises(FileExistsError, match="--resume"):
        train(recipe_for(tiny_llama_dir, write_task(tmp_path / "data", 16, 4), tmp_path / "run"))


@pytest.mark.slow  # two DDP processes: about a minute on two cores (make test-slow)
def test_accelerate_launch_two_cpu_processes(tiny_llama_dir: Path, tmp_path: Path) -> None:
    data = write_task(tmp_path / "data", 64, 8)
    out = tmp_path / "run"
    cmd = [
        *TWO_CPU_PROCESSES,
        "-m",
        "mydecide.cli",
        "train",
        str(SMOKE),
        "--model",
        str(tiny_llama_dir),
        "--data",
        str(data),
        "--out",
        str(out),
        "optim.max_steps=3",
    ]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "× 2 process(es)" in result.stderr
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    assert (out / "last" / "adapter_model.safetensors").is_file()


def test_tasks_keeps_only_the_named_tasks_and_names_a_missing_one(tmp_path: Path) -> None:
    from mydecide.record_files import load_records
    from mydecide.training.loop import select_tasks

    data = write_task(tmp_path / "data", 12, 4)
    other = {
        "id": "s0",
        "task": "spam",
        "state": "win money",
        "question": {"type": "noul", "instructions": "Spam?"},
        "answer": "yes",
    }
    for name in ("train", "dev"):
        with (data / f"{name}.jsonl").open("a") as f:
            f.write(json.dumps({**other, "id": f"{name}-s0"}) + "\n")
    train_records, dev_records = load_records(data / "train.jsonl"), load_records(data / "dev.jsonl")
    kept_train, kept_dev = select_tasks(train_records, dev_records, ["route"], data)
    assert (len(kept_train), len(kept_dev)) == (12, 4) and {r.task for r in kept_train + kept_dev} == {"route"}
    expected = r"\['routing'\] have no records in .*train.jsonl; its tasks are \['route', 'spam'\]"
    with pytest.raises(ValueError, match=expected):
        select_tasks(train_records, dev_records, ["route", "routing"], data)
    # a task with training records but none in dev: the best adapter could not be chosen
    no_dev = [r for r in dev_records if r.task != "spam"]
    with pytest.raises(ValueError, match=r"\['spam'\] have no records in .*dev.jsonl; train keeps the adapter that"):
        select_tasks(train_records, no_dev, ["spam"], data)


def test_task_weights_for_a_task_with_no_training_records_warn_and_bad_weights_are_refused(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from mydecide.config import TrainRecipe
    from mydecide.record_files import load_records
    from mydecide.training.loop import selected_records

    data = write_task(tmp_path / "data", 12, 4)
    train_records, dev_records = load_records(data / "train.jsonl"), load_records(data / "dev.jsonl")
    recipe = TrainRecipe(data=str(data), task_weights={"route": 2.5})
    kept_train, _, note, warnings = selected_records(recipe, train_records, dev_records, data)
    assert len(kept_train) == 12 and note == "task weights show {'route': 30} records of those tasks per epoch"
    assert warnings == []
    # a weight for a task the data lacks (a recipe tuned on other data): a warning, and every record trains
    other = TrainRecipe(data=str(data), task_weights={"spam": 2, "route": 1})
    kept_train, _, note, warnings = selected_records(other, train_records, dev_records, data)
    assert len(kept_train) == 12 and note == "task weights show {'route': 12} records of those tasks per epoch"
    assert warnings == [
        "task_weights: ['spam'] have no records to train on (unused); the training tasks are ['route'] "
        "(name them in tasks: to make a missing task an error)"
    ]
    # strictness is tasks: naming the tasks makes a missing one an error, whatever the weights
    with pytest.raises(ValueError, match=r"tasks: \['spam'\] have no records in .*train.jsonl; its tasks are"):
        selected_records(other.model_copy(update={"tasks": ["route", "spam"]}), train_records, dev_records, data)
    for bad in (0, -1, 101):
        with pytest.raises(ValidationError, match="task weights must be > 0 and ≤ 100"):
            TrainRecipe(task_weights={"route": bad})
    with pytest.raises(ValidationError, match="finite number"):  # every recipe float is finite
        TrainRecipe(task_weights={"route": float("nan")})


def test_adamw_keeps_its_decay_rates_and_beta_keys_are_gone() -> None:
    import torch

    from mydecide.recipe_parsing import RecipeError
    from mydecide.training.loop import make_optimiser

    default, _ = make_optimiser(torch.nn.Linear(3, 2), TrainRecipe(), total_updates=10)
    assert default.param_groups[0]["betas"] == (0.9, 0.999)
    with pytest.raises(RecipeError, match=r"optim\.beta2"):  # a lower beta2 lost on the demo (docs/LOG.md)
        load_recipe(None, ["optim.beta2=0.95"], model=TrainRecipe)
