"""Packed shared-state batches: a state read once per batch gives the loss and LoRA gradients of scoring each
question alone, with gradient checkpointing on and off, on a Llama and on a Qwen3.5 hybrid (Gated DeltaNet)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import ANSWERS, QUESTIONS, STATES, loss_and_grads, shared_state_records

from mydecide.modeling import load_model
from mydecide.prompt import RenderConfig
from mydecide.records import parse_record
from mydecide.scoring.packed import CHUNK, CONV_HISTORY, batch_packing, pack, packing_mode
from mydecide.training.batches import epoch_units, plan_batches


def lora_module(model_dir: Path, render: RenderConfig | None = None):
    from peft import LoraConfig, get_peft_model

    from mydecide.training.model import build_module, lora_targets

    torch.manual_seed(0)
    base = load_model(str(model_dir), render=render, device="cpu")
    config = LoraConfig(r=4, lora_alpha=8, target_modules=lora_targets(base.lm, "all-linear"), init_lora_weights=False)
    lm = get_peft_model(base.lm, config)  # random A and B: every LoRA weight gets a gradient
    module = build_module(lm, base.renderer.label_ids)
    module.train()
    return base, lm, module


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("form", ["letters", "per_option"])
def test_packed_batches_equal_each_question_scored_alone(tiny_model_dir: Path, form: str) -> None:
    base, lm, module = lora_module(tiny_model_dir, RenderConfig(option_form=form))
    mode = packing_mode(lm)
    assert mode == ("hybrid" if "qwen3_5" in tiny_model_dir.name else "attention")
    units = epoch_units(base.renderer, shared_state_records(), seed=0, epoch=0, shuffle_options=True)
    pad_id = base.tokenizer.pad_token_id
    loss, grads = loss_and_grads(lm, module, units, pad_id, None, checkpointing=False)
    assert grads.count_nonzero() == grads.numel()
    # Gated DeltaNet's chunked rule (transformers' reference kernel) computes in float32 whatever the model's dtype,
    # in 64-token chunks counted from each sequence's start, and a packed continuation starts a chunk of its own: the
    # sums run in another order. Score levels read per level (the longest prefixes here) then differ by 2e-5 in the
    # gradient, and by as much with the whole model in float64 (the loss by 6e-8: float32's rounding, not a lost path)
    grad_tolerance = 1e-4 if mode == "hybrid" else 1e-5
    for checkpointing in (False, True):
        packed_loss, packed_grads = loss_and_grads(lm, module, units, pad_id, mode, checkpointing)
        assert relative(packed_loss, loss) <= 1e-5, (checkpointing, packed_loss, loss)
        assert relative(packed_grads, grads) <= grad_tolerance, (checkpointing, relative(packed_grads, grads))


def test_checkpointing_recomputes_the_packed_forward(tiny_model_dir: Path) -> None:
    """The packed batch is one forward call, so non-reentrant checkpointing runs every layer again in backward."""
    base, lm, module = lora_module(tiny_model_dir)
    units = epoch_units(base.renderer, shared_state_records()[:8], seed=0, epoch=0, shuffle_options=False)
    mlp = lm.get_base_model().get_decoder().layers[0].mlp
    calls = []
    original = mlp.forward
    mlp.forward = lambda x: (calls.append(x.shape), original(x))[1]  # forward hooks do not fire on recomputation
    try:
        for checkpointing, expected in ((False, 1), (True, 2)):
            calls.clear()
            loss_and_grads(lm, module, units, base.tokenizer.pad_token_id, packing_mode(lm), checkpointing)
            assert len(calls) == expected  # with checkpointing: the forward, then its recomputation in backward
    finally:
        del mlp.forward


def test_pack_lays_out_each_state_once_and_questions_apart(tiny_llama_dir: Path) -> None:
    base = load_model(
        str(tiny_llama_dir), render=RenderConfig(option_form="letters", score_form="letters"), device="cpu"
    )
    units = epoch_units(base.renderer, shared_state_records(), seed=0, epoch=0, shuffle_options=False)
    prompts = [p for u in units for p in u.prompts]
    batch = pack(prompts, base.tokenizer.pad_token_id, segments=True)
    assert batch.input_ids.shape[0] == len(STATES)  # one row per state
    assert batch.n_tokens == sum(map(len, {p.prefix for p in prompts})) + sum(len(p.suffix) for p in prompts)
    for i, p in enumerate(prompts):
        r, c = int(batch.rows[i]), int(batch.cols[i])
        start = c - len(p.suffix) + 1
        assert batch.input_ids[r, start : c + 1].tolist() == list(p.suffix)
        assert batch.position_ids[r, start : c + 1].tolist() == list(range(len(p.prefix), len(p)))
        seen = batch.allowed[r, 0, c].nonzero().flatten().tolist()  # the answer slot sees its prefix and suffix only
        assert batch.input_ids[r, seen].tolist() == list(p.prefix) + list(p.suffix)
        segments = batch.segments
        assert segments is not None
        flat = batch.input_ids.flatten()
        head = len(p.prefix) // CHUNK * CHUNK  # the Gated DeltaNet layers run the whole chunks once per state
        head_index = segments.head[int(segments.group[i])]
        assert flat[head_index[head_index >= 0]].tolist() == list(p.prefix[:head])
        row = segments.rows[i]
        history = row[:CONV_HISTORY]
        assert flat[history[history >= 0]].tolist() == list(p.prefix[max(0, head - CONV_HISTORY) : head])
        own = row[CONV_HISTORY:]
        assert flat[own[own >= 0]].tolist() == list(p.prefix[head:]) + list(p.suffix)
    real = (batch.input_ids != base.tokenizer.pad_token_id).flatten()
    slots = batch.segments.scatter[real]
    assert len(set(slots.tolist())) == int(real.sum())  # every real position has its own output
    assert (batch.segments.scatter[~real] == batch.segments.scatter.max()).all()  # padding reads the zero row


def test_packing_mode_refuses_what_a_block_mask_cannot_drive(tiny_llama_dir: Path) -> None:
    base = load_model(str(tiny_llama_dir), device="cpu")
    assert packing_mode(base.lm) == "attention"
    base.lm.config._attn_implementation = "flash_attention_2"
    assert packing_mode(base.lm) is None


def test_a_batch_is_packed_where_it_shares_a_state_or_the_cache_cannot_serve(tiny_llama_dir: Path) -> None:
    base = load_model(str(tiny_llama_dir), device="cpu")
    units = epoch_units(base.renderer, shared_state_records(), seed=0, epoch=0, shuffle_options=False)
    by_state: dict[tuple[int, ...], list] = {}
    for unit in units:
        by_state.setdefault(unit.state_ids, []).append(unit)
    one_each = [group[0] for group in by_state.values()]  # three states, one question each
    shared = list(by_state.values())[1][:2] + one_each[:1]  # two questions on one state
    assert batch_packing(shared, "attention", cache_fails=False) == "attention"
    assert batch_packing(one_each, "attention", cache_fails=False) is None  # the KV cache computes less there
    assert batch_packing(one_each, "attention", cache_fails=True) == "attention"  # checkpointing or recurrent layers
    assert batch_packing(shared, None, cache_fails=False) is None


@pytest.mark.parametrize("epoch", [0, 1, 2])
def test_the_planner_fills_every_batch_and_keeps_a_states_questions_adjacent(tiny_llama_dir: Path, epoch: int) -> None:
    """30 questions in batches of 4 make ⌈30 / 4⌉ = 8 updates in every epoch (whole states only would make 10
    batches of 3 here, and a number that changes with the order); a state is split only where a batch fills up."""
    base = load_model(str(tiny_llama_dir), device="cpu")  # per option: a choice's prefix holds its question too
    many = []  # 10 states of 3 questions
    for i in range(10):
        for j in range(3):
            question, answer = QUESTIONS[j], ANSWERS[j]
            many += parse_record(
                {
                    "id": f"{i}-{j}",
                    "task": "t",
                    "state": f"ticket {i} " + "word " * i,
                    "question": question,
                    "answer": answer,
                }
            )
    units = epoch_units(base.renderer, many, seed=0, epoch=epoch, shuffle_options=True)
    batches = plan_batches(units, batch_size=4, seed=0, epoch=epoch)
    assert sorted(id(u) for b in batches for u in b) == sorted(id(u) for u in units)
    assert sorted(len(b) for b in batches) == [2] + [4] * 7
    where: dict[tuple[int, ...], set[int]] = {}
    for j, batch in enumerate(batches):
        for unit in batch:
            where.setdefault(unit.state_ids, set()).add(j)
    assert len(where) == 10
    assert all(len(batches_of_state) <= 2 for batches_of_state in where.values())
    split = sum(len(b) == 2 for b in where.values())
    assert split <= len(batches) - 1  # at most one state cut at each batch boundary
    for batch in batches:  # inside a batch, a state's questions come in one run (one prefix row each)
        runs = [s for k, s in enumerate(u.state_ids for u in batch) if k == 0 or s != batch[k - 1].state_ids]
        assert len(runs) == len(set(runs))


@pytest.mark.parametrize("checkpointing", [False, True])
def test_training_a_hybrid_shares_states_with_and_without_checkpointing(
    tiny_qwen_dir: Path, tmp_path: Path, checkpointing: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """The loop packs states on Qwen3.5 (it used to score every question alone there) and the LoRA weights learn."""
    import json

    from safetensors.torch import load_file

    from mydecide.config import TrainRecipe
    from mydecide.recipe_loading import load_recipe
    from mydecide.training.loop import train

    data = tmp_path / "data"
    data.mkdir()
    rows = [
        {"id": f"{i}-{j}", "task": f"t{j}", "state": state, "question": QUESTIONS[j], "answer": ANSWERS[j]}
        for i, state in enumerate(STATES)
        for j in range(3)
    ]
    for name in ("train", "dev"):
        (data / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    recipe = load_recipe(
        Path(__file__).resolve().parents[2] / "recipes" / "train" / "smoke.yaml",
        [
            f"model={tiny_qwen_dir}",
            f"data={data}",
            f"out={tmp_path / 'run'}",
            "optim.max_steps=2",
            f"gradient_checkpointing={str(checkpointing).lower()}",
        ],
        model=TrainRecipe,
    )
    run = train(recipe)
    assert "state sharing: packed (hybrid)" in capsys.readouterr().err
    lora_b = [v for k, v in load_file(run / "last" / "adapter_model.safetensors").items() if "lora_B" in k]
    assert max(float(v.abs().max()) for v in lora_b) > 0  # B starts at zero: any non-zero value was learned
