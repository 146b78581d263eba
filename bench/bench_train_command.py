"""Whole training commands, timed end to end: `mydecide train` against our model of the seed article's train.py.

Each command runs in its own process and is timed from launch to exit (Python start-up, imports, model load, data,
training, saving), on the same generated data: ``--states`` states (40 by default) with three questions each
(choice among 3, yes / no, 4-level score; 120 records), one epoch, batch 4, smollm2-135m in fp32 on the CPU.

* ``seed_model``: our own model of the seed article's ``train.py`` (that script is not part of this repository; this
  is a re-implementation of what it does, written for this benchmark): LoRA r=32 on every linear layer, the proper
  objective, AdamW lr 1e-4 with a 3% warm-up and a cosine schedule, clipping 1.0, gradient checkpointing always on
  (non-reentrant), one prompt per question (left-padded rows of 4 questions in random order), the answer read as
  the letter logits at the last position, no dev check, the adapter saved at the end. The prompts are rendered by
  our renderer in the letters form, so both sides compute the same tokens per prompt; the LM head is applied to the
  last position only (``logits_to_keep=1``), which makes this baseline faster than a loop that computes the
  vocabulary logits at every position, never slower.
* ``mydecide_seed_settings``: ``mydecide train`` at the same settings (proper, r=32, batch 4, letters, checkpointing
  on, fp32), with its dev check (``dev_limit`` questions, at the start and the end).
* ``mydecide_demo_settings``: ``mydecide train recipes/train/demo.yaml`` (per-option choice, no system prompt,
  states cut at 96 tokens, cross-entropy, r=16, checkpointing off) for one epoch of the same data.

The dev check's cost is read from the run's metrics.jsonl and printed on its own line, with each command's time
without it. Writes bench/results/train_command.json.

    .venv/bin/python bench/bench_train_command.py [--states 40] [--dev 4] [--rounds 1]
    .venv/bin/python bench/bench_train_command.py --seed-model DATA_DIR OUT_DIR   # the baseline alone
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import RESULTS, ROOT
from bench_train import make_rows

BATCH = 4


# ------------------------------------------------------------------------------------- the seed article's loop


def seed_model(data_dir: Path, out_dir: Path, seed: int = 13) -> None:
    """Our model of the seed's train.py (see the module docstring): per-question prompts, checkpointing on."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, get_cosine_schedule_with_warmup

    from mydecide.jsonl import iter_jsonl
    from mydecide.modeling import resolve_model_path
    from mydecide.records import parse_record
    from mydecide.scoring.render import RenderConfig, Renderer
    from mydecide.training.objectives import proper_loss

    torch.manual_seed(seed)
    path, extra = resolve_model_path("smollm2-135m")
    tokenizer = AutoTokenizer.from_pretrained(path, **extra)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **extra)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    config = LoraConfig(r=32, lora_alpha=64, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM")
    model = get_peft_model(model, config)
    model.train()
    renderer = Renderer(tokenizer, RenderConfig(option_form="letters", score_form="letters"))

    records = [r for _, obj, _ in iter_jsonl(data_dir / "train.jsonl") for r in parse_record(obj)]
    random.Random(seed).shuffle(records)
    examples = []
    for record in records:
        prompt = renderer.render(record.state, record.question)
        examples.append((list(prompt.prefix) + list(prompt.suffix), record.target, record.question.type == "score"))

    label_ids = torch.tensor(renderer.label_ids)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
    steps = (len(examples) + BATCH - 1) // BATCH
    schedule = get_cosine_schedule_with_warmup(optimizer, max(1, round(0.03 * steps)), steps)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    for start in range(0, len(examples), BATCH):
        batch = examples[start : start + BATCH]
        width, k_max = max(len(ids) for ids, *_ in batch), max(len(target) for _, target, _ in batch)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids, *_ in batch])
        attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids, *_ in batch])
        last = model(input_ids=input_ids, attention_mask=attention, logits_to_keep=1).logits[:, -1, :]
        logits = last[:, label_ids[:k_max]]
        mask = torch.tensor([[j < len(target) for j in range(k_max)] for _, target, _ in batch])
        targets = torch.tensor([list(target) + [0.0] * (k_max - len(target)) for _, target, _ in batch])
        is_score = torch.tensor([score for *_, score in batch])
        loss = proper_loss(logits, targets, mask, is_score, progress=0.0)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
    model.save_pretrained(out_dir / "adapter")


# -------------------------------------------------------------------------------------------------- the bench


def write_data(folder: Path, states: int, dev: int) -> None:
    rows = make_rows(states + dev, seed=0)
    train, held = rows[: 3 * states], rows[3 * states :]
    folder.mkdir(parents=True, exist_ok=True)
    for name, part in (("train.jsonl", train), ("dev.jsonl", held)):
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in part))


def timed(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command[:3])} … failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    return seconds


def dev_seconds(run: Path) -> tuple[float, int]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    dev = [row for row in rows if row.get("kind") == "dev"]
    return sum(row["seconds"] for row in dev), len(dev)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", type=int, default=40, help="train states; three questions each")
    parser.add_argument("--dev", type=int, default=4, help="dev questions scored by the dev check (dev_limit)")
    parser.add_argument("--rounds", type=int, default=1, help="runs per command, alternating; the fastest is kept")
    parser.add_argument("--seed-model", nargs=2, type=Path, metavar=("DATA_DIR", "OUT_DIR"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RESULTS / "train_command.json")
    args = parser.parse_args()
    if args.seed_model:
        seed_model(*args.seed_model)
        return

    from mydecide.io import atomic_write_text

    env = dict(os.environ)
    mydecide = str(Path(sys.executable).parent / "mydecide")
    with tempfile.TemporaryDirectory(prefix="bench-train-command-") as tmp:
        data, runs = Path(tmp) / "data", Path(tmp) / "runs"
        write_data(data, args.states, args.dev)
        defaults = Path(tmp) / "defaults.yaml"  # the library's defaults, changed below only where the seed differs
        defaults.write_text("model: smollm2-135m\n")
        common = [f"dev_limit={args.dev}", "optim.max_steps=null", "optim.epochs=1", "save_every=100000"]
        common += [
            "eval_every=100000",
            "eval_at_start=false",
            "optim.batch_size=4",
            "optim.grad_accum=1",
            "precision=fp32",
        ]
        commands = {
            "seed_model": lambda out: [sys.executable, __file__, "--seed-model", str(data), str(out)],
            "mydecide_seed_settings": lambda out: [
                mydecide,
                "train",
                str(defaults),
                "--data",
                str(data),
                "--out",
                str(out),
                *common,
                "objective.kind=proper",
                "lora.r=32",
                "lora.alpha=64",
                "gradient_checkpointing=true",
                "prompt.option_form=letters",
                "optim.lr=1e-4",
                "optim.warmup_ratio=0.03",
                "optim.schedule=cosine",
            ],
            "mydecide_demo_settings": lambda out: [
                mydecide,
                "train",
                "recipes/train/demo.yaml",
                "--data",
                str(data),
                "--out",
                str(out),
                *common,
            ],
        }
        results: dict[str, dict[str, float]] = {}
        for round_ in range(args.rounds):
            for name, command in commands.items():
                out = runs / f"{name}-{round_}"
                seconds = timed(command(out), env)
                dev, checks = dev_seconds(out) if name != "seed_model" else (0.0, 0)
                row = {"seconds": seconds, "dev_check_seconds": dev, "dev_checks": checks, "without_dev": seconds - dev}
                print(f"  {name:24s} {seconds:7.1f} s (dev check {dev:.1f} s)", file=sys.stderr, flush=True)
                if name not in results or seconds < results[name]["seconds"]:
                    results[name] = row

    seed = results["seed_model"]["seconds"]
    summary = {
        "benchmark": "train_command",
        "model": "smollm2-135m",
        "device": "cpu",
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "train_records": 3 * args.states,
        "dev_limit": args.dev,
        "rounds": args.rounds,
        **results,
        "speedup_seed_settings": seed / results["mydecide_seed_settings"]["seconds"],
        "speedup_demo_settings": seed / results["mydecide_demo_settings"]["seconds"],
        "speedup_seed_settings_without_dev": seed / results["mydecide_seed_settings"]["without_dev"],
        "target_seed_settings": 2.0,
        "target_demo_settings": 2.5,
    }
    print(f"{'command':24s} {'seconds':>8s} {'dev check':>10s} {'x seed':>7s}")
    for name, row in results.items():
        print(f"{name:24s} {row['seconds']:8.1f} {row['dev_check_seconds']:10.1f} {seed / row['seconds']:7.2f}")
    dev = results["mydecide_seed_settings"]["dev_check_seconds"]
    print(f"dev check inside mydecide train (seed settings): {dev:.1f} s")
    print(f"mydecide train / seed train.py, checkpointing on in both: {summary['speedup_seed_settings']:.2f}x")
    print(f"mydecide train (demo settings) / seed train.py:           {summary['speedup_demo_settings']:.2f}x")
    atomic_write_text(args.out, json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
