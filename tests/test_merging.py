"""`mydecide merge` on a tiny Llama with a fresh LoRA adapter whose B matrices are non-zero (so merging matters)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from mydecide.cli import app
from mydecide.prompt import RenderConfig

RENDER = RenderConfig(system_prompt="You route support tickets. Answer with one letter.", max_state_tokens=200)


def save_random_adapter(lm: Any, out: Path, base: str, render: RenderConfig, targets: list[str], seed: int) -> Path:
    """``lm`` wrapped in a rank-4 LoRA on ``targets`` whose B matrices are random (a fresh adapter has B = 0, no
    effect; training would give it one), saved to ``out`` with its render config and the record of its base."""
    import torch
    from peft import LoraConfig, get_peft_model

    from mydecide.adapters import weights_fingerprint
    from mydecide.modeling import save_render_config
    from mydecide.training.model_card import record_base_model

    fingerprint = weights_fingerprint(lm)
    peft_model = get_peft_model(lm, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    peft_model.save_pretrained(out)
    save_render_config(out, render)
    record_base_model(out, base, fingerprint)
    return out


@pytest.fixture(scope="module")
def adapter_dir(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    return save_random_adapter(base, tmp_path_factory.mktemp("adapter"), str(tiny_llama_dir), RENDER, targets, seed=3)


def probabilities(model) -> list[np.ndarray]:
    from mydecide.merging import option_probabilities, sample_items

    return option_probabilities(model, sample_items())


def test_merge_writes_a_plain_verified_model_that_answers_like_base_plus_adapter(
    tiny_llama_dir: Path, adapter_dir: Path, tmp_path: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from mydecide.merging import REPORT_FILE
    from mydecide.modeling import RENDER_CONFIG_FILE, load_model, read_render_config

    out = tmp_path / "merged"
    result = CliRunner().invoke(
        app,
        ["merge", "--model", str(tiny_llama_dir), "--adapter", str(adapter_dir), "--out", str(out), "--device", "cpu"],
    )
    assert result.exit_code == 0, result.output
    assert "verified on 6 questions" in result.output

    # a plain transformers directory: no PEFT files or LoRA weights, the tokenizer and the render config
    assert not (out / "adapter_config.json").exists()
    assert (out / "tokenizer.json").is_file() and (out / "config.json").is_file()
    # as the adapter reads: it has no span head, so prompt.span.read's "auto" is saved as the letters it reads with
    letters = RENDER.model_copy(update={"span": RENDER.span.model_copy(update={"read": "letters"})})
    assert read_render_config(out / RENDER_CONFIG_FILE) == letters  # stamped, as save_render_config writes it
    plain = AutoModelForCausalLM.from_pretrained(out)
    assert plain.dtype == torch.float32
    assert not any("lora" in k or "base_model" in k for k in plain.state_dict())
    report = json.loads((out / REPORT_FILE).read_text())
    assert report["ok"] is True and report["max_abs_diff"] <= 1e-3 and report["n_questions"] == 6
    assert "git_commit" in report["provenance"]

    unmerged = probabilities(load_model(str(tiny_llama_dir), adapter_dir, device="cpu"))
    merged_model = load_model(str(out), device="cpu")
    assert merged_model.renderer.config == letters  # serving the merged dir renders as the adapter did
    merged = probabilities(merged_model)
    base = probabilities(load_model(str(tiny_llama_dir), device="cpu", render=RENDER))
    gap_merged = max(float(np.abs(a - b).max()) for a, b in zip(unmerged, merged, strict=True))
    gap_base = max(float(np.abs(a - b).max()) for a, b in zip(unmerged, base, strict=True))
    assert gap_merged <= 1e-3
    assert gap_base > 1e-2  # the adapter really changes the answers, so the check above means something


def test_a_merge_that_changes_the_answers_fails_and_leaves_out_unwritten(
    tiny_llama_dir: Path, adapter_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    import mydecide.merging as merging

    real = merging.save_plain

    def broken_save(lm, out, dtype):  # as if a merge forgot the LoRA scaling: double every merged weight
        with torch.no_grad():
            for module in lm.modules():
                if isinstance(module, torch.nn.Linear) and module is not lm.get_output_embeddings():
                    module.weight.mul_(2.0)
        real(lm, out, dtype)

    monkeypatch.setattr(merging, "save_plain", broken_save)
    out = tmp_path / "merged"
    result = CliRunner().invoke(
        app,
        ["merge", "--model", str(tiny_llama_dir), "--adapter", str(adapter_dir), "--out", str(out), "--device", "cpu"],
    )
    assert result.exit_code == 1, result.output
    assert "merged and unmerged probabilities disagree" in result.output
    assert not out.exists()
    report = json.loads((tmp_path / "merged.unverified" / merging.REPORT_FILE).read_text())
    assert report["ok"] is False and report["max_abs_diff"] > 1e-3


@pytest.mark.parametrize("error", ["oserror", "safetensors"])
def test_a_full_disk_during_merge_is_one_line_and_leaves_no_partial_copy(
    error: str, tiny_llama_dir: Path, adapter_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from safetensors import SafetensorError

    import mydecide.merging as merging

    def full(lm, out, dtype):
        (out / "model.safetensors").write_bytes(b"half")
        if error == "oserror":
            raise OSError(errno.ENOSPC, "No space left on device", str(out / "model.safetensors"))
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No" })')

    monkeypatch.setattr(merging, "save_plain", full)
    out = tmp_path / "merged"
    command = ["merge", "--model", str(tiny_llama_dir), "--adapter", str(adapter_dir), "--out", str(out)]
    result = CliRunner().invoke(app, [*command, "--device", "cpu"])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    partial = tmp_path / f".merged.partial-{os.getpid()}" / "model.safetensors"
    named = partial if error == "oserror" else out
    assert errors == [f"error: {named}: No space left on device"] and "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no partial copy, no lock file


def test_merge_refuses_a_non_empty_out_and_a_missing_adapter(
    tiny_llama_dir: Path, adapter_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    result = CliRunner().invoke(
        app, ["merge", "--model", str(tiny_llama_dir), "--adapter", str(adapter_dir), "--out", str(tmp_path / "taken")]
    )
    assert result.exit_code == 2 and "holds file but no merge_report.json of an earlier merge" in result.output
    result = CliRunner().invoke(app, ["merge", "--adapter", str(tmp_path), "--out", str(tmp_path / "m")])
    assert result.exit_code == 2 and "not a LoRA adapter directory" in result.output


def test_max_probability_gap_names_the_worst_item() -> None:
    from mydecide.merging import max_probability_gap

    a = [np.array([0.5, 0.5]), np.array([0.2, 0.3, 0.5]), np.array([0.9])]
    b = [np.array([0.5, 0.5]), np.array([0.2, 0.32, 0.48]), np.array([0.89])]
    gap, worst = max_probability_gap(a, b)
    assert gap == pytest.approx(0.02) and worst == 1


def test_merge_reads_a_recipe_with_overrides_and_the_options_win(
    tiny_llama_dir: Path, adapter_dir: Path, tmp_path: Path
) -> None:
    from mydecide.merging import REPORT_FILE

    recipe = tmp_path / "merge.yaml"
    recipe.write_text(
        f"model: {tiny_llama_dir}\nadapter: {adapter_dir}\nout: {tmp_path / 'from_recipe'}\ndevice: cpu\ncheck_n: 3\n"
    )
    out = tmp_path / "from_option"
    result = CliRunner().invoke(app, ["merge", str(recipe), "tolerance=0.002", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "from_recipe").exists()  # --out wins over the recipe's out
    report = json.loads((out / REPORT_FILE).read_text())
    assert report["tolerance"] == 0.002  # the override reached the check

    result = CliRunner().invoke(app, ["merge", str(recipe), "dtype=float8"])
    assert result.exit_code == 2
    assert "dtype" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(app, ["merge", "--adapter", str(adapter_dir)])
    assert result.exit_code == 2 and "missing --out" in result.output
