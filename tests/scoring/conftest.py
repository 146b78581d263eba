"""What the score-form tests share: a learnable score task, and an adapter trained on it in a given form."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest

URGENCY = ["not urgent", "this week", "today", "within the hour"]


@pytest.fixture
def score_task(tmp_path: Path) -> Callable[..., Path]:
    """``make(seed)``: train.jsonl and dev.jsonl of a score task a tiny random model can learn (the level is mostly
    the low one, a prior to learn), in a folder of its own."""

    def make(seed: int = 0, n_train: int = 96, n_dev: int = 24) -> Path:
        from mydecide.records import parse_question

        question = parse_question({"type": "score", "instructions": "How urgent is it?", "criteria": URGENCY}, "q")
        rng = random.Random(seed)
        words = ["calm", "soon", "hurry", "panic"]
        rows = []
        for i in range(n_train + n_dev):
            level = 0 if rng.random() < 0.7 else rng.choice([1, 2, 3])
            rows.append(
                {
                    "id": f"s{seed}-{i}",
                    "task": "urgency",
                    "state": f"ticket {i}: {words[level]} {words[level]}",
                    "question": question.to_json(),
                    "answer": level,
                }
            )
        out = tmp_path / f"score-task-{seed}"
        out.mkdir(parents=True, exist_ok=True)
        for name, part in (("train", rows[:n_train]), ("dev", rows[n_train:])):
            (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
        return out

    return make


@pytest.fixture
def train_score_form(
    tiny_llama_dir: Path, tmp_path: Path, score_task: Callable[..., Path]
) -> Callable[..., tuple[Path, Path]]:
    """``train(form, objective, seed)``: (the task's data folder, the run) of 16 updates of recipes/train/smoke.yaml
    on the tiny Llama with ``prompt.score_form=form``."""

    def train_in(form: str, objective: str, seed: int = 0) -> tuple[Path, Path]:
        from mydecide.config import TrainRecipe
        from mydecide.recipe_loading import load_recipe
        from mydecide.training.loop import train

        data = score_task(seed)
        lr = "2e-2" if objective == "proper" else "2e-3"
        recipe = load_recipe(
            Path(__file__).resolve().parents[2] / "recipes" / "train" / "smoke.yaml",
            [
                f"model={tiny_llama_dir}",
                f"data={data}",
                f"out={tmp_path / f'run-{form}'}",
                f"prompt.score_form={form}",
                f"objective.kind={objective}",
                "optim.max_steps=16",
                f"optim.lr={lr}",
                "eval_every=8",
            ],
            model=TrainRecipe,
        )
        return data, train(recipe)

    return train_in
