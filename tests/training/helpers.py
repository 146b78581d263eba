"""What the training tests share: the smoke recipe on a tiny model, a learnable task, two CPU processes under
`accelerate launch`, a run killed at an update, and the packed shared-state batches' reference loss."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mydecide.config import TrainRecipe
from mydecide.recipe_loading import load_recipe
from mydecide.records import parse_record
from mydecide.scoring.packed import PackedBatch
from mydecide.training.batches import make_batch
from mydecide.training.objectives import proper_loss

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "recipes" / "train" / "smoke.yaml"

# `accelerate launch` as two real CPU processes (DDP over gloo, with CUDA_VISIBLE_DEVICES="" in the environment)
TWO_CPU_PROCESSES = [
    str(Path(sys.executable).parent / "accelerate"),
    "launch",
    "--multi_gpu",
    "--num_processes",
    "2",
    "--num_machines",
    "1",
    "--mixed_precision",
    "no",
    "--dynamo_backend",
    "no",
    "--main_process_port",
    "0",
]
KEYWORDS = {"billing": "invoice", "engineering": "outage", "support": "password"}


def write_task(out: Path, n_train: int = 96, n_dev: int = 24) -> Path:
    """A learnable task for a tiny random model: the team is "engineering" 80% of the time (a prior to learn)."""
    rng = random.Random(0)
    rows = []
    for i in range(n_train + n_dev):
        team = "engineering" if rng.random() < 0.8 else rng.choice(["billing", "support"])
        state = f"ticket {i}: {KEYWORDS[team]} {KEYWORDS[team]}"
        rows.append(
            {
                "id": f"c{i}",
                "task": "route",
                "state": state,
                "question": {
                    "type": "choice",
                    "instructions": "Which team?",
                    "criteria": {"billing": "money", "engineering": "bugs", "support": "help"},
                },
                "answer": team,
            }
        )
    out.mkdir(parents=True, exist_ok=True)
    for name, part in (("train", rows[:n_train]), ("dev", rows[n_train:])):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    return out


def recipe_for(model_dir: Path, data: Path, out: Path, *overrides: str) -> TrainRecipe:
    return load_recipe(SMOKE, [f"model={model_dir}", f"data={data}", f"out={out}", *overrides], model=TrainRecipe)


def crash_after(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    from mydecide.training import loop

    real_write = loop.write_metrics

    def write_then_crash(run: Path, row: dict) -> None:
        real_write(run, row)
        if row["kind"] == "train" and row["update"] == n:
            raise KeyboardInterrupt("simulated kill")

    monkeypatch.setattr(loop, "write_metrics", write_then_crash)


def choice_row(i: int, rng: random.Random) -> dict:
    team = "engineering" if rng.random() < 0.8 else "billing"
    return {
        "id": f"c{i}",
        "task": "route",
        "state": f"ticket {i}: {'outage' if team == 'engineering' else 'invoice'}",
        "question": {"type": "choice", "instructions": "Which team?", "criteria": ["billing", "engineering"]},
        "answer": team,
    }


QUESTIONS = [
    {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "b", "engineering": "e", "support": "s"}},
    {"type": "noul", "instructions": "Is it down?"},
    {"type": "score", "instructions": "How urgent?", "criteria": ["low", "medium", "high"]},
    {"type": "set", "instructions": "Which apply?", "criteria": {"refund": "", "outage": ""}},
]
ANSWERS = ["billing", True, 1, ["refund"]]
# states of 1, ~40 and ~150 tokens: the Gated DeltaNet layers' 64-token chunks fall inside prefixes and questions
STATES = ["x", "The checkout page returns an error " * 3, "invoice charged twice, refund asked " * 12]


def shared_state_records() -> list:
    """Every question type on three states of 1, ~40 and ~150 tokens."""
    out = []
    for i, state in enumerate(STATES):
        for j, (question, answer) in enumerate(zip(QUESTIONS, ANSWERS, strict=True)):
            out += parse_record(
                {"id": f"{i}-{j}", "task": f"t{j}", "state": state, "question": question, "answer": answer}
            )
    return out


def loss_and_grads(lm, module, units, pad_id: int, packing: str | None, checkpointing: bool):
    """Packed (``packing``) or one forward per unit, each prompt alone in its row; the loop's objective."""
    import torch

    from mydecide.training.model import set_checkpointing

    set_checkpointing(lm, checkpointing)
    module.zero_grad()
    whole = make_batch(units, pad_id, shared_prefix=packing is not None, packing=packing)
    if packing is not None:
        assert isinstance(whole.batch, PackedBatch)
        assert whole.batch.input_ids.shape[0] == len({u.state_ids for u in units})  # each state once, per option too
        logits = whole.logits(module(whole.batch))
    else:
        rows = []
        for unit in units:
            alone = make_batch([unit], pad_id, shared_prefix=False)
            assert alone.batch.input_ids is not None and alone.batch.input_ids.shape[0] == len(unit.prompts)
            rows.append(alone.logits(module(alone.batch)))
        width = max(r.shape[1] for r in rows)
        logits = torch.cat([torch.nn.functional.pad(r, (0, width - r.shape[1]), value=float("-inf")) for r in rows])
    loss = proper_loss(logits, whole.targets, whole.mask, whole.is_score, progress=0.0)
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in lm.parameters() if p.requires_grad])
    return loss.detach(), grads


# ----------------------------------------------------------------------------------- two processes (the slow tier)

DDP_ARGS = ["optim.max_steps=6", "save_every=3", "eval_every=100", "optim.schedule=linear", "lora.dropout=0.1"]


def launch(tmp_path: Path, model: Path, data: Path, out: Path, *extra: str, script: Path | None = None) -> Any:
    program = [str(script)] if script else ["-m", "mydecide.cli"]
    cmd = [
        *TWO_CPU_PROCESSES,
        *program,
        "train",
        str(SMOKE),
        "--model",
        str(model),
        "--data",
        str(data),
        "--out",
        str(out),
        *DDP_ARGS,
        *extra,
    ]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env)


def train_rows(run: Path) -> dict[int, dict[str, Any]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["update"]: r for r in rows if r["kind"] == "train"}
