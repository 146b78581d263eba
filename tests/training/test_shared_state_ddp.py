"""Packed shared-state batches under DDP: two real CPU processes (`accelerate launch`, gloo) train a tiny Qwen3.5
hybrid with gradient checkpointing on, each state's questions on one process, to the losses of one process that
accumulates the same micro-batches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import DDP_ARGS, launch, train_rows

from mydecide.config import TrainRecipe
from mydecide.recipe_loading import load_recipe

pytestmark = pytest.mark.slow  # a two-process run and a one-process run: about 2 minutes on two cores

QUESTIONS = [
    {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "b", "engineering": "e", "support": "s"}},
    {"type": "noul", "instructions": "Is it down?"},
    {"type": "score", "instructions": "How urgent?", "criteria": ["low", "medium", "high"]},
]


def write_states(out: Path, n_states: int = 16) -> Path:
    """States of 3 questions (batches of 4 hold one state each), some longer than a 64-token chunk."""
    out.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "id": f"{i}-{j}",
            "task": f"t{j}",
            "state": f"ticket {i}: " + "the invoice was charged twice " * (1 + 5 * (i % 4)),
            "question": question,
            "answer": ["billing", i % 2 == 0, i % 3][j],
        }
        for i in range(n_states)
        for j, question in enumerate(QUESTIONS)
    ]
    for name in ("train", "dev"):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def test_two_processes_train_packed_states_like_one(tiny_qwen_dir: Path, tmp_path: Path) -> None:
    from mydecide.training.loop import train

    data = write_states(tmp_path / "data")
    settings = ["optim.max_steps=3", "lora.dropout=0", "gradient_checkpointing=true"]  # after launch's DDP_ARGS
    result = launch(tmp_path, tiny_qwen_dir, data, tmp_path / "two", *settings, "optim.grad_accum=2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "× 2 process(es)" in result.stderr and "state sharing: packed (hybrid)" in result.stderr
    smoke = Path(__file__).resolve().parents[2] / "recipes" / "train" / "smoke.yaml"
    one = train(
        load_recipe(
            smoke,
            [
                f"model={tiny_qwen_dir}",
                f"data={data}",
                f"out={tmp_path / 'one'}",
                *DDP_ARGS,
                *settings,
                "optim.grad_accum=4",
            ],
            model=TrainRecipe,
        )
    )
    two_rows, one_rows = train_rows(tmp_path / "two"), train_rows(one)
    for update in (1, 2, 3):  # rank r takes micro-batches r, r + 2, …: together the one process's four
        assert two_rows[update]["loss"] == pytest.approx(one_rows[update]["loss"], rel=1e-5), update
