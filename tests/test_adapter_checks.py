"""Adapters are checked before they are used (issue 36, item 7): the base they are loaded on is the one they were
trained on (a weights fingerprint saved beside them), and a damaged adapter file is one line naming the file, in
every command that takes --adapter."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mydecide.cli import app

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "recipes" / "train" / "smoke.yaml"
VERBS = ("calibrate", "evaluate", "predict", "merge", "serve")


def records(n: int, start: int = 0) -> str:
    rows = [
        {
            "id": f"r{i}",
            "task": "route",
            "state": f"ticket {i}: the invoice was charged {'twice' if i % 2 else 'once'}",
            "question": {"type": "noul", "instructions": "Was it charged twice?"},
            "answer": i % 2 == 1,
        }
        for i in range(start, start + n)
    ]
    return "".join(json.dumps(r) + "\n" for r in rows)


@pytest.fixture(scope="module")
def other_base(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama's architecture and tokenizer with other random weights (another seed): the same shapes."""
    import torch
    from transformers import AutoConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("other-llama")
    for f in tiny_llama_dir.iterdir():
        if "token" in f.name or f.name.endswith(("vocab.json", "merges.txt")):
            shutil.copy(f, out / f.name)
    torch.manual_seed(1)
    LlamaForCausalLM(AutoConfig.from_pretrained(tiny_llama_dir)).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def trained(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run trained for two updates on the tiny Llama; its adapter is RUN/adapter."""
    from mydecide.config import TrainRecipe
    from mydecide.recipe_loading import load_recipe
    from mydecide.training.loop import train

    root = tmp_path_factory.mktemp("adapter-run")
    (root / "data").mkdir()
    (root / "data" / "train.jsonl").write_text(records(16))
    (root / "data" / "dev.jsonl").write_text(records(4, start=100))
    overrides = [f"model={tiny_llama_dir}", f"data={root / 'data'}", f"out={root / 'run'}", "optim.max_steps=2"]
    return train(load_recipe(SMOKE, [*overrides, "eval_every=100"], model=TrainRecipe))


def command(verb: str, model: Path, adapter: Path, where: Path) -> list[str]:
    (where / "dev.jsonl").write_text(records(4, start=200))
    request = {"state": "the invoice was charged twice", "questions": {"q": {"type": "noul", "instructions": "ok?"}}}
    (where / "request.json").write_text(json.dumps(request))
    tail = {
        "calibrate": ["--data", str(where / "dev.jsonl"), "--out", str(where / "t.json")],
        "evaluate": ["--data", str(where / "dev.jsonl"), "--out", str(where / "eval"), "--permutations", "0"],
        "predict": [],
        "merge": ["--out", str(where / "merged")],
        "serve": ["--port", "0"],
    }[verb]
    head = [verb, str(where / "request.json")] if verb == "predict" else [verb]
    return [*head, "--model", str(model), "--adapter", str(adapter), *tail]


def run_cli(args: list[str], where: Path) -> tuple[int, str]:
    """exit code, output; serve in its own process (uvicorn's logging and exit, as a user sees them)."""
    if args[0] == "serve":
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        result = subprocess.run(
            [sys.executable, "-m", "mydecide.cli", *args], capture_output=True, text=True, timeout=120, env=env
        )
        return result.returncode, result.stdout + result.stderr
    outcome = CliRunner().invoke(app, args)
    return outcome.exit_code, outcome.output


def one_error_line(output: str) -> str:
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in output, output
    return errors[0]


# ---------------------------------------------------------------------------------------------- the base model


def test_the_fingerprint_tells_two_bases_of_the_same_shapes_apart_and_not_two_dtypes(
    tiny_llama_dir: Path, other_base: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from mydecide.adapters import weights_fingerprint

    def fingerprint(path: Path, dtype: Any) -> str:
        return weights_fingerprint(AutoModelForCausalLM.from_pretrained(path, dtype=dtype))

    same = fingerprint(tiny_llama_dir, torch.float32)
    assert fingerprint(tiny_llama_dir, torch.float32) == same  # deterministic
    assert fingerprint(tiny_llama_dir, torch.bfloat16) == same  # a base read in another dtype is the same base
    assert fingerprint(other_base, torch.float32) != same


def test_training_saves_the_base_name_and_fingerprint_beside_each_adapter(trained: Path, tiny_llama_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    from mydecide.adapters import BASE_FILE, weights_fingerprint

    expected = weights_fingerprint(AutoModelForCausalLM.from_pretrained(tiny_llama_dir))
    for name in ("adapter", "last"):
        record = json.loads((trained / name / BASE_FILE).read_text())
        assert record["model"] == str(tiny_llama_dir.resolve())
        assert record["weights_fingerprint"] == expected and "sha256" in record["fingerprint"]


def test_load_model_refuses_another_base_of_the_same_shapes(
    trained: Path, tiny_llama_dir: Path, other_base: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mydecide.modeling import load_model

    adapter = trained / "adapter"
    load_model(str(tiny_llama_dir), adapter, device="cpu")  # its own base
    with pytest.raises(ValueError, match="the two bases' weights differ") as refused:
        load_model(str(other_base), adapter, device="cpu")
    message = str(refused.value)
    assert f"trained on {tiny_llama_dir.resolve()}" in message and f"not on {other_base}" in message
    assert "--allow-other-base" in message
    capsys.readouterr()
    loaded = load_model(str(other_base), adapter, device="cpu", allow_other_base=True)
    assert hasattr(loaded.lm, "peft_config") and "loading it anyway" in capsys.readouterr().err


def test_a_command_on_an_adapter_without_its_base_record_refuses_it_in_one_line(
    trained: Path, tiny_llama_dir: Path, tmp_path: Path
) -> None:
    from mydecide.adapters import BASE_FILE

    legacy = shutil.copytree(trained / "adapter", tmp_path / "legacy")  # as versions before the record saved it
    (legacy / BASE_FILE).unlink()
    for extra in ([], ["--allow-other-base"]):
        code, output = run_cli([*command("predict", tiny_llama_dir, legacy, tmp_path), *extra], tmp_path)
        assert code == 2
        assert one_error_line(output) == (
            f"error: no {legacy / BASE_FILE}, so the base {legacy} was trained on cannot be checked against "
            f"{tiny_llama_dir}; retrain the adapter with this version of mydecide"
        )


@pytest.mark.parametrize("verb", VERBS)
def test_every_command_refuses_another_base_in_one_line_and_takes_the_override(
    verb: str, trained: Path, other_base: Path, tmp_path: Path
) -> None:
    args = command(verb, other_base, trained / "adapter", tmp_path)
    code, output = run_cli(args, tmp_path)
    line = one_error_line(output)
    assert code == 2 and "the two bases' weights differ" in line and str(other_base) in line, output
    assert "--allow-other-base" in line
    if verb == "serve":  # with the override it would serve: the flag is the one the others take
        return
    code, output = run_cli([*args, "--allow-other-base"], tmp_path)
    assert code == 0, output


def test_the_override_is_a_recipe_key_too() -> None:
    from mydecide.config import CalibrateRecipe, EvalRecipe, MergeRecipe, ServeRecipe

    for recipe in (CalibrateRecipe, EvalRecipe, MergeRecipe, ServeRecipe):
        assert recipe.model_validate({"allow_other_base": True}).allow_other_base


# ---------------------------------------------------------------------------------------- damaged adapter files


def damage(adapter: Path, how: str) -> Path:
    """The file that ``how`` damages in ``adapter``."""
    if how == "truncated weights":
        weights = adapter / "adapter_model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        return weights
    config = adapter / "adapter_config.json"
    if how == "wrong r":
        data = json.loads(config.read_text())
        config.write_text(json.dumps({**data, "r": data["r"] * 2}))
    elif how == "r not a number":
        config.write_text(json.dumps({**json.loads(config.read_text()), "r": "four"}))
    else:  # broken JSON: cut short
        config.write_text(config.read_text()[:50])
    return config


@pytest.mark.parametrize("how", ["truncated weights", "wrong r", "r not a number", "broken config"])
@pytest.mark.parametrize("verb", VERBS)
def test_a_damaged_adapter_is_one_line_naming_the_file(
    verb: str, how: str, trained: Path, tiny_llama_dir: Path, tmp_path: Path
) -> None:
    adapter = shutil.copytree(trained / "adapter", tmp_path / "adapter")
    damaged = damage(adapter, how)
    code, output = run_cli(command(verb, tiny_llama_dir, adapter, tmp_path), tmp_path)
    line = one_error_line(output)
    assert code == 2 and line.startswith(f"error: {damaged}:"), output
    if how == "wrong r":
        assert "r=8, but" in line and "rank-4 LoRA weights" in line
    assert not (tmp_path / "merged").exists() and not (tmp_path / "t.json").exists()


def test_a_load_that_peft_refuses_past_the_checks_names_the_adapter(
    trained: Path, tiny_llama_dir: Path, tmp_path: Path
) -> None:
    from mydecide.modeling import load_model

    adapter = shutil.copytree(trained / "adapter", tmp_path / "adapter")
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "lora_dropout": "lots"}))
    with pytest.raises(ValueError, match=f"^{adapter}: the adapter cannot be loaded on"):
        load_model(str(tiny_llama_dir), adapter, device="cpu")
