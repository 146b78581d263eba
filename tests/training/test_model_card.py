"""Adapters travel: adapter_config.json names the base model by the name the recipe used (an alias, a hub id),
not by the cache directory it was loaded from, so PEFT loads the adapter after the cache moved; and README.md is a
model card with the training data, the dev metrics and the recipe."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mydecide.config import TrainRecipe
from mydecide.recipe_loading import load_recipe

SMOKE = Path(__file__).resolve().parents[2] / "recipes" / "train" / "smoke.yaml"


def write_data(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "id": f"r{i}",
            "task": "route" if i % 2 else "urgent",
            "state": f"ticket {i}: outage {i % 3}",
            "question": {"type": "choice", "instructions": "Which team?", "criteria": ["billing", "engineering"]}
            if i % 2
            else {"type": "noul", "instructions": "Is it urgent?"},
            "answer": "engineering" if i % 2 else bool(i % 3),
        }
        for i in range(20)
    ]
    (out / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:16]))
    (out / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[16:]))
    return out


def test_the_adapter_names_its_base_portably_and_loads_after_the_cache_moved(
    tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from peft import PeftModel, get_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from mydecide.modeling import DEFAULT_MODEL, load_model, resolve_model_path
    from mydecide.training.loop import train

    # the alias smollm2-135m resolves to <MYDECIDE_CACHE>/smollm2-135m-bf16: put the tiny model there
    first = tmp_path / "cache-here"
    shutil.copytree(tiny_llama_dir, first / "smollm2-135m-bf16")
    monkeypatch.setenv("MYDECIDE_CACHE", str(first))
    run = train(
        load_recipe(
            SMOKE,
            [f"data={write_data(tmp_path / 'data')}", f"out={tmp_path / 'run'}", "optim.max_steps=2", "eval_every=1"],
            model=TrainRecipe,
        )
    )
    for adapter in (run / "adapter", run / "last"):
        config = json.loads((adapter / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == DEFAULT_MODEL
        assert str(first) not in (adapter / "adapter_config.json").read_text()

    moved = tmp_path / "cache-elsewhere"
    first.rename(moved)
    monkeypatch.setenv("MYDECIDE_CACHE", str(moved))
    adapter = run / "last"  # trained for 2 updates ("adapter", best on dev, may be the untrained update 0)
    name = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    path, _ = resolve_model_path(name)
    assert path == str(moved / "smollm2-135m-bf16")
    lm = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path), str(adapter))
    saved = load_file(str(adapter / "adapter_model.safetensors"))
    loaded = get_peft_model_state_dict(lm)
    assert set(saved) == set(loaded) and any(float(v.abs().max()) > 0 for k, v in saved.items() if "lora_B" in k)
    for key, value in saved.items():
        torch.testing.assert_close(loaded[key], value)
    assert load_model(name, adapter).name == DEFAULT_MODEL  # and mydecide's own loader takes the same name


def test_the_model_card_holds_the_data_the_metrics_and_the_recipe(tiny_llama_dir: Path, tmp_path: Path) -> None:
    from mydecide.training.loop import train

    run = train(
        load_recipe(
            SMOKE,
            [
                f"model={tiny_llama_dir}",
                f"data={write_data(tmp_path / 'data')}",
                f"out={tmp_path / 'run'}",
                "optim.max_steps=2",
                "eval_every=1",
                "lora.r=3",
            ],
            model=TrainRecipe,
        )
    )
    card = (run / "adapter" / "README.md").read_text()
    from huggingface_hub import ModelCard

    assert ModelCard.load(run / "adapter" / "README.md").data.to_dict() == {
        "base_model": str(tiny_llama_dir.resolve()),
        "library_name": "peft",
        "tags": ["mydecide", "lora", "decision-model"],
    }
    assert "| route | choice | 8 | 2 |" in card and "| urgent | noul | 8 | 2 |" in card
    assert "| **all** | | 16 | 4 |" in card
    dev = [
        json.loads(line)
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["kind"] == "dev"
    ]
    best = min(dev, key=lambda r: r["log_loss"])
    assert f"saved at\nupdate {best['update']}." in card
    last_card = (run / "last" / "README.md").read_text()
    assert "(last)" in last_card and "saved at\nupdate 2." in last_card
    for row in dev:  # the card of each adapter shows the dev evaluations up to its update
        line = f"| {row['update']} | {row['epoch']:.4f} | {row['n']} | {row['accuracy']:.4f} |"
        assert line in last_card
        assert (line in card) == (row["update"] <= best["update"])
    assert "lora:\n  r: 3\n" in card and "objective:\n  kind: proper" in card
