"""The LoRA dropout training uses on the CPU (training/model.py ``lean_lora_dropout``): Bernoulli masks at the
recipe's rate, reproduced by seeding and by checkpointing's recomputation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import loss_and_grads, shared_state_records

from mydecide.modeling import load_model
from mydecide.training.batches import epoch_units
from mydecide.training.model import lean_lora_dropout, lora_targets


def peft_model(model_dir: Path, dropout: float):
    from peft import LoraConfig, get_peft_model

    from mydecide.training.model import build_module

    torch.manual_seed(0)
    base = load_model(str(model_dir), device="cpu")
    targets = lora_targets(base.lm, "all-linear")
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=targets, init_lora_weights=False)
    lm = get_peft_model(base.lm, config)
    module = build_module(lm, base.renderer.label_ids)
    module.train()
    return base, lm, module


def test_every_lora_dropout_is_replaced_and_drops_at_the_recipes_rate(tiny_llama_dir: Path) -> None:
    _, lm, _ = peft_model(tiny_llama_dir, 0.3)
    assert lean_lora_dropout(lm) == len(lm.targeted_module_names)
    dropout = next(m.lora_dropout["default"] for m in lm.modules() if hasattr(m, "lora_dropout"))
    assert not isinstance(dropout, torch.nn.Dropout)
    x = torch.ones(1000, 1000)
    torch.manual_seed(1)
    out = dropout(x)
    kept = (out != 0).double().mean().item()
    assert abs(kept - 0.7) < 5 * (0.7 * 0.3 / x.numel()) ** 0.5  # Bernoulli(0.7) per element, within 5 sigma
    assert torch.allclose(out[out != 0], torch.tensor(65536 / (65536 - round(0.3 * 65536))))  # kept: scaled up
    assert abs(out.mean().item() - 1.0) < 0.005  # the expectation is unchanged
    rows = out.reshape(-1, 4).ne(0).double()  # the four 16-bit lanes of each 64-bit draw are independent
    assert abs(rows.prod(dim=1).mean().item() - 0.7**4) < 0.005
    torch.manual_seed(1)
    assert torch.equal(dropout(x), out)  # seeded: the same mask
    assert not torch.equal(dropout(x), out)  # the next draw: another mask
    dropout.eval()
    assert dropout(x) is x


def test_no_dropout_is_left_alone(tiny_llama_dir: Path) -> None:
    _, lm, _ = peft_model(tiny_llama_dir, 0.0)
    assert lean_lora_dropout(lm) == 0


@pytest.mark.parametrize("model", ["tiny_llama_dir", "tiny_qwen_dir"])
def test_checkpointing_recomputes_the_same_masks(model: str, request: pytest.FixtureRequest) -> None:
    """Non-reentrant checkpointing restores the CPU generator before it recomputes a layer, so the gradients with it
    equal the gradients without it; another seed gives other masks, so other gradients."""
    base, lm, module = peft_model(request.getfixturevalue(model), 0.3)
    lean_lora_dropout(lm)
    units = epoch_units(base.renderer, shared_state_records(), seed=0, epoch=0, shuffle_options=False)
    pad_id = base.tokenizer.pad_token_id

    def grads(seed: int, checkpointing: bool) -> torch.Tensor:
        torch.manual_seed(seed)
        return loss_and_grads(lm, module, units, pad_id, None, checkpointing)[1]

    plain = grads(3, False)
    assert torch.allclose(grads(3, True), plain, rtol=1e-5, atol=1e-7)
    assert (grads(4, False) - plain).norm() > 1e-3 * plain.norm()


def test_lora_targets_that_name_no_adaptable_module_are_one_line(tiny_llama_dir: Path) -> None:
    """peft's own error for a missing target is a traceback deep in training set-up (issue 64)."""
    from mydecide.errors import UserError

    base = load_model(str(tiny_llama_dir), device="cpu")
    assert lora_targets(base.lm, ["q_proj", "v_proj"]) == ["q_proj", "v_proj"]
    leaves = "down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj"
    with pytest.raises(UserError) as err:
        lora_targets(base.lm, ["q_proj", "qkv"])
    assert (
        str(err.value)
        == f"lora.target_modules: ['qkv'] name no module of LlamaForCausalLM (its linear layers: {leaves})"
    )
    with pytest.raises(UserError) as err:
        lora_targets(base.lm, ["self_attn"])
    assert str(err.value).startswith("lora.target_modules: model.layers.0.self_attn is a LlamaAttention, which LoRA")
    with pytest.raises(UserError, match=r"lora.target_modules: '\(' is not a regular expression"):
        lora_targets(base.lm, "(")
