"""optim.ema_decay: the moving average of the trainable weights that dev metrics and saved adapters use."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.training.test_loop import recipe_for, write_task


def tiny_module():  # two trainable tensors and a frozen one
    import torch

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    module[1].bias.requires_grad_(False)
    return module


def test_the_average_follows_its_formula_and_is_swapped_in_and_out_exactly(tmp_path: Path) -> None:
    import torch

    from mydecide.training.averaging import WeightAverage, decay_at

    module = tiny_module()
    average = WeightAverage(module, 0.8)
    assert set(average.shadow) == {"0.weight", "0.bias", "1.weight"}  # the frozen bias is not averaged
    expected = {name: p.detach().clone() for name, p in module.named_parameters() if p.requires_grad}
    for update in range(1, 7):
        with torch.no_grad():
            for p in module.parameters():
                p.add_(torch.randn_like(p))
        average.update(update)
        d = decay_at(update, 0.8)
        for name, p in module.named_parameters():
            if name in expected:
                expected[name] = d * expected[name] + (1 - d) * p.detach()
    assert decay_at(1, 0.8) == pytest.approx(2 / 11) and decay_at(100, 0.8) == 0.8
    for name, tensor in expected.items():
        torch.testing.assert_close(average.shadow[name], tensor)

    trained = {name: p.detach().clone() for name, p in module.named_parameters()}
    with average.applied():
        for name, p in module.named_parameters():
            torch.testing.assert_close(p.detach(), expected.get(name, trained[name]))
    for name, p in module.named_parameters():
        assert torch.equal(p.detach(), trained[name])  # the trained weights are back, bit for bit

    average.save(tmp_path)
    again = WeightAverage(tiny_module(), 0.8)
    again.load(tmp_path)
    for name, tensor in expected.items():
        torch.testing.assert_close(again.shadow[name], tensor)
    with pytest.raises(ValueError, match=r"no ema\.safetensors"):
        again.load(tmp_path / "elsewhere")


def lora_name(name: str) -> str:
    """A trained parameter's name as PEFT saves it in adapter_model.safetensors."""
    return name.removeprefix("lm.").replace(".default.", ".")


def test_saved_adapters_are_the_average_and_a_resumed_run_continues_it(
    tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch
    from safetensors.torch import load_file

    from mydecide.training import loop

    data = write_task(tmp_path / "data", 48, 8)
    args = ("optim.max_steps=8", "save_every=4", "eval_every=4", "optim.ema_decay=0.5")
    straight = loop.train(recipe_for(tiny_llama_dir, data, tmp_path / "straight", *args))
    last = load_file(straight / "last" / "adapter_model.safetensors")
    checkpoint = straight / "checkpoints" / "update-000008"
    averaged = {lora_name(k): v for k, v in load_file(checkpoint / "ema.safetensors").items()}
    trained = {lora_name(k): v for k, v in load_file(checkpoint / "model.safetensors").items()}
    assert set(last) <= set(averaged)
    for key, value in last.items():
        torch.testing.assert_close(value, averaged[key])
    assert any(not torch.allclose(trained[k], averaged[k]) for k in last)  # the average is not the last weights

    real_write = loop.write_metrics

    def crash_after_update_6(run: Path, row: dict) -> None:
        real_write(run, row)
        if row["kind"] == "train" and row["update"] == 6:
            raise KeyboardInterrupt("simulated kill")

    monkeypatch.setattr(loop, "write_metrics", crash_after_update_6)
    with pytest.raises(KeyboardInterrupt):
        loop.train(recipe_for(tiny_llama_dir, data, tmp_path / "killed", *args))
    monkeypatch.setattr(loop, "write_metrics", real_write)
    resumed = loop.train(recipe_for(tiny_llama_dir, data, tmp_path / "killed", *args), resume=True)
    again = load_file(resumed / "last" / "adapter_model.safetensors")
    for key, value in last.items():
        torch.testing.assert_close(again[key], value, rtol=1e-5, atol=1e-6)

    # a checkpoint without its average cannot continue a run that keeps one: it is passed over as damaged, and the
    # run goes on from the one before
    (tmp_path / "killed" / "checkpoints" / "update-000008" / "ema.safetensors").unlink()
    capsys.readouterr()
    loop.train(recipe_for(tiny_llama_dir, data, tmp_path / "killed", *args), resume=True)
    err = capsys.readouterr().err
    assert "checkpoint update-000008 is damaged or unreadable (no ema.safetensors in it" in err
    assert "resumed from update-000004" in err
    final = load_file(tmp_path / "killed" / "last" / "adapter_model.safetensors")
    for key, value in last.items():
        torch.testing.assert_close(final[key], value, rtol=1e-5, atol=1e-6)
