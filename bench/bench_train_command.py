"""Whole training commands, timed end to end: `mydecide train` against the seed article's own train.py.

Each command runs in its own process and is timed from launch to exit (Python start-up, imports, model load, data,
training, saving), on the same generated data: ``--states`` states (40 by default) with three questions each
(choice among 3, yes / no, 4-level score; 120 records), one epoch, batch 4, no accumulation, smollm2-135m (the
packaged GGUF converted once to a Hugging Face directory) in fp32 on the CPU. Commands take turns when
``--rounds`` > 1 (the fastest run of each is kept).

* ``seed_train_py``: the seed article's ``train.py``, run as its README prescribes for a fair CPU comparison::

      python train.py --base MODEL --train train.jsonl --out OUT --epochs 1 --batch-size 4 --grad-accum 1
                      --lora-r 32 --lr 1e-4 --mixed-precision no

  from a temporary copy outside the repository whose ``decision_format.py`` loads in fp32 instead of bfloat16 (the
  README's patch). The script is not part of this repository: it is found at ``<repo>/../shared/seed-scripts/`` or
  ``--seed-scripts DIR``, and without it this bench is skipped, saying so. Its train.jsonl holds the very records
  mydecide trains on, in the seed's record format (``state``, ``question``, ``answer``: the same keys, so the
  conversion only checks them). What the script does at these flags: the proper objective, LoRA r=32 (alpha 64,
  dropout 0.05) on every linear layer, AdamW lr 1e-4 with a 3% warm-up and a cosine schedule, clipping 1.0,
  gradient checkpointing (non-reentrant), one left-padded prompt per question with shuffled option letters, states
  cut at 3000 tokens, the letter logits read at the last position, no evaluation, the adapter saved at the end.
* ``mydecide_seed_settings``: ``mydecide train`` at the same settings: proper objective, LoRA r=32 / alpha 64 on
  all linear layers, batch 4, no accumulation, 1 epoch, fp32, gradient checkpointing on, choices and scores read as
  letters (as the seed reads them), states cut at 3000 tokens, no in-loop evaluation (``eval_at_start=false``,
  ``eval_every`` and ``save_every`` past the end) and no checkpoint saving. mydecide always scores dev once at the
  end to pick its best adapter (``dev_limit`` questions); that check's cost is read from the run's metrics.jsonl and
  each command's time without it is reported too.
* ``mydecide_seed_settings_default_forms``: the same, but choices and scores read in the library's default forms
  (one yes / no read per option and per level, written in the answer turn), the cost issue 37 asks about.
* ``mydecide_demo_settings``: ``mydecide train recipes/train/demo.yaml`` (per-option choices and scores, no system
  prompt, states cut at 96 tokens, the proper objective, r=16, checkpointing off; its task weights cleared, as this
  data has no span task) for one epoch of the same data, with the same evaluation and saving settings.
* ``model_of_seed`` (only with ``--with-model-of-seed``): the re-implementation of the seed's loop that this bench
  timed before it ran the real script, kept to compare the two; no headline ratio uses it.

Headline: seed train.py seconds / mydecide train seconds at the seed's settings, read as letters and in the default
forms (target ≥ 2× for both). Writes
bench/results/train_command.json.

    .venv/bin/python bench/bench_train_command.py [--states 40] [--dev 4] [--rounds 1] [--seed-scripts DIR]
                                                  [--with-model-of-seed]
    .venv/bin/python bench/bench_train_command.py --states 3 --dev 2   # a smoke run: 9 records
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
from typing import Any

from _common import RESULTS, ROOT, find_seed_scripts, seed_copy
from bench_train import make_rows

BATCH = 4
SEED_FLAGS = ["--epochs", "1", "--batch-size", "4", "--grad-accum", "1", "--lora-r", "32", "--lr", "1e-4"]
SEED_FLAGS += ["--mixed-precision", "no"]  # the README's flags; fp32 comes from the patched copy


# ------------------------------------------------ model_of_seed: our re-implementation of the seed loop


def seed_model(data_dir: Path, out_dir: Path, seed: int = 13) -> None:
    """model_of_seed: our re-implementation of the seed's train.py, written for this bench before it ran the real
    script (per-question prompts by our renderer in the letters form, checkpointing on); only with
    ``--with-model-of-seed``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, get_cosine_schedule_with_warmup

    from mydecide.jsonl import iter_jsonl
    from mydecide.modeling import resolve_model_path
    from mydecide.prompt import RenderConfig
    from mydecide.records import parse_record
    from mydecide.scoring.render import Renderer
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


def write_data(folder: Path, states: int, dev: int) -> list[dict[str, Any]]:
    """mydecide's train.jsonl and dev.jsonl in ``folder``; returns the train rows."""
    rows = make_rows(states + dev, seed=0)
    train, held = rows[: 3 * states], rows[3 * states :]
    folder.mkdir(parents=True, exist_ok=True)
    for name, part in (("train.jsonl", train), ("dev.jsonl", held)):
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in part))
    return train


def seed_record(row: dict[str, Any]) -> dict[str, Any]:
    """One mydecide record in the seed's format (prepare_data.py's rows: ``task``, ``state``, ``question``,
    ``answer``). The keys are the same; this checks that the seed reads the record as mydecide does: choice
    criteria a map, noul without criteria (yes / no) and a bool answer, score criteria a list and a level index."""
    question, answer = row["question"], row["answer"]
    kind = question["type"]
    ok = {
        "choice": isinstance(question.get("criteria"), dict) and answer in question["criteria"],
        "noul": question.get("criteria") is None and isinstance(answer, bool),
        "score": isinstance(question.get("criteria"), list) and 0 <= answer < len(question["criteria"]),
    }.get(kind, False)
    if not ok:
        raise ValueError(f"{row['id']}: a {kind} record the seed's train.py would not read as mydecide does")
    return {"id": row["id"], "task": row["task"], "state": row["state"], "question": question, "answer": answer}


def timed(command: list[str], env: dict[str, str], cwd: Path = ROOT) -> float:
    started = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
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
    parser.add_argument("--seed-scripts", type=Path, help="the seed article's scripts (default ../shared/seed-scripts)")
    parser.add_argument("--with-model-of-seed", action="store_true", help="also time the re-implementation")
    parser.add_argument("--seed-model", nargs=2, type=Path, metavar=("DATA_DIR", "OUT_DIR"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RESULTS / "train_command.json")
    args = parser.parse_args()
    if args.seed_model:
        seed_model(*args.seed_model)
        return

    from mydecide.io import atomic_write_text
    from mydecide.modeling import resolve_model_path

    scripts, why = find_seed_scripts(args.seed_scripts, needed=("decision_format.py", "train.py"))
    if scripts is None:
        print(f"bench_train_command skipped: {why}", flush=True)
        skipped = {"benchmark": "train_command", "skipped": why}
        atomic_write_text(args.out, json.dumps(skipped, indent=2) + "\n")
        return

    base, _ = resolve_model_path("smollm2-135m")  # the seed needs the directory; converted once, before any timing
    env = dict(os.environ)
    mydecide = str(Path(sys.executable).parent / "mydecide")
    with tempfile.TemporaryDirectory(prefix="bench-train-command-") as tmp:
        data, runs = Path(tmp) / "data", Path(tmp) / "runs"
        train_rows = write_data(data, args.states, args.dev)
        copy = seed_copy(scripts, Path(tmp) / "seed-scripts")
        seed_train = Path(tmp) / "seed-data" / "train.jsonl"
        seed_train.parent.mkdir()
        seed_train.write_text("".join(json.dumps(seed_record(r)) + "\n" for r in train_rows))
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

        def seed_settings(out: Path) -> list[str]:
            """mydecide train at the seed's settings, reading choices and scores in the library's default forms."""
            return [
                *(mydecide, "train", str(defaults), "--data", str(data), "--out", str(out), *common),
                *("objective.kind=proper", "lora.r=32", "lora.alpha=64", "lora.target_modules=all-linear"),
                *("gradient_checkpointing=true", "prompt.max_state_tokens=3000", "optim.lr=1e-4"),
                *("optim.warmup_ratio=0.03", "optim.schedule=cosine"),
            ]

        commands = {
            "seed_train_py": lambda out: [
                sys.executable,
                str(copy / "train.py"),
                "--base",
                base,
                "--train",
                str(seed_train),
                "--out",
                str(out),
                *SEED_FLAGS,
            ],
            "mydecide_seed_settings": lambda out: [
                *seed_settings(out),
                "prompt.option_form=letters",
                "prompt.score_form=letters",
            ],
            "mydecide_seed_settings_default_forms": seed_settings,
            "mydecide_demo_settings": lambda out: [
                mydecide,
                "train",
                "recipes/train/demo.yaml",
                "--data",
                str(data),
                "--out",
                str(out),
                *common,
                "task_weights={}",  # the demo's weights name its span task, which this data does not have
            ],
        }
        if args.with_model_of_seed:
            commands["model_of_seed"] = lambda out: [sys.executable, __file__, "--seed-model", str(data), str(out)]
        results: dict[str, dict[str, float]] = {}
        for round_ in range(args.rounds):
            names = list(commands) if round_ % 2 == 0 else list(commands)[::-1]  # turns, so load drift hits all
            for name in names:
                out = runs / f"{name}-{round_}"
                cwd = copy if name == "seed_train_py" else ROOT
                seconds = timed(commands[name](out), env, cwd)
                if name == "seed_train_py" and not (out / "epoch1" / "adapter_config.json").is_file():
                    raise SystemExit(f"seed train.py exited without saving {out / 'epoch1'}")
                dev, checks = dev_seconds(out) if name.startswith("mydecide") else (0.0, 0)
                row = {"seconds": seconds, "dev_check_seconds": dev, "dev_checks": checks, "without_dev": seconds - dev}
                print(f"  {name:38s} {seconds:7.1f} s (dev check {dev:.1f} s)", file=sys.stderr, flush=True)
                if name not in results or seconds < results[name]["seconds"]:
                    results[name] = row

    seed = results["seed_train_py"]["seconds"]
    summary = {
        "benchmark": "train_command",
        "what": "whole commands, launch to exit: the seed article's train.py (patched copy, fp32, the README's "
        "flags) vs mydecide train at the same settings and at the demo's, on the same records",
        "model": "smollm2-135m",
        "device": "cpu",
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "train_records": 3 * args.states,
        "dev_limit": args.dev,
        "rounds": args.rounds,
        "seed_scripts": str(scripts),
        "seed_command": "python train.py --base MODEL --train train.jsonl --out OUT " + " ".join(SEED_FLAGS),
        **results,
        "speedup_seed_settings": seed / results["mydecide_seed_settings"]["seconds"],
        "speedup_demo_settings": seed / results["mydecide_demo_settings"]["seconds"],
        "speedup_seed_settings_without_dev": seed / results["mydecide_seed_settings"]["without_dev"],
        "speedup_seed_settings_default_forms": seed / results["mydecide_seed_settings_default_forms"]["seconds"],
        "target_seed_settings": 2.0,
        "target_demo_settings": 2.5,
    }
    if "model_of_seed" in results:
        summary["model_of_seed_over_seed_train_py"] = results["model_of_seed"]["seconds"] / seed
    print(f"{'command':38s} {'seconds':>8s} {'dev check':>10s} {'x seed':>7s}")
    for name, row in results.items():
        print(f"{name:38s} {row['seconds']:8.1f} {row['dev_check_seconds']:10.1f} {seed / row['seconds']:7.2f}")
    dev = results["mydecide_seed_settings"]["dev_check_seconds"]
    print(f"dev check inside mydecide train (seed settings): {dev:.1f} s")
    arms = (("seed_settings", "seed settings"), ("seed_settings_default_forms", "seed settings, default forms"))
    for key, said in arms:
        speedup = summary[f"speedup_{key}"]
        met = "met" if speedup >= summary["target_seed_settings"] else "NOT met"
        print(f"seed train.py / mydecide train ({said}): {speedup:.2f}x (target 2x: {met})")
    print(f"seed train.py / mydecide train (demo settings):   {summary['speedup_demo_settings']:.2f}x")
    atomic_write_text(args.out, json.dumps(summary, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
