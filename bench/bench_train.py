"""Training throughput: length-bucketed + shared-state batches vs plain one-prompt-per-question batches.

The same records (states of mixed length, 3 questions each) and the same model (smollm2-135m with a LoRA adapter)
are trained on for one pass in both modes, in one process, alternating mode by mode so that load from other
processes hits both alike. Reports questions/s of forward + backward + optimiser step, the ratio, and the fraction
of processed tokens that are padding.

    .venv/bin/python bench/bench_train.py [--states 12] [--batch 6] [--model smollm2-135m]

Writes bench/results/train.json.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TEXT = (
    "the customer reports that checkout fails with an error after payment and the invoice shows a double "
    "charge while support asks for logs from the web shop during the outage this morning"
)
WORDS = TEXT.split()


def make_records(n_states: int, seed: int = 0) -> list:
    from mydecide.records import parse_record

    rng = random.Random(seed)
    records = []
    for i in range(n_states):
        length = rng.choice([12, 20, 30, 160, 240])  # a mix of short and long states (words)
        state = f"Ticket {i}: " + " ".join(rng.choice(WORDS) for _ in range(length))
        questions = [
            {
                "type": "choice",
                "instructions": "Which team should handle this ticket?",
                "criteria": {
                    "billing": "Charges and refunds",
                    "engineering": "Bugs and outages",
                    "support": "How-to questions",
                },
            },
            {"type": "noul", "instructions": "Is a production system down?"},
            {"type": "score", "instructions": "How urgent is it?", "criteria": ["low", "medium", "high", "critical"]},
        ]
        answers = [rng.choice(["billing", "engineering", "support"]), rng.random() < 0.5, rng.randrange(4)]
        for j, (q, a) in enumerate(zip(questions, answers, strict=True)):
            records.extend(
                parse_record({"id": f"{i}-{j}", "task": f"t{j}", "state": state, "question": q, "answer": a})
            )
    return records


def run_pass(module, optimizer, batches, pad_id: int, shared: bool, objective) -> tuple[float, int, int, int]:
    from mydecide.training.batches import make_batch

    started = time.perf_counter()
    questions = tokens = padded = 0
    for units in batches:
        tb = make_batch(units, pad_id, shared)
        logits = tb.logits(module(tb.batch))  # as the training loop reads them: per-option units gather yes − no
        loss = objective(logits, tb.targets, tb.mask, tb.is_score, progress=0.0)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        questions += len(units)
        tokens += tb.batch.n_tokens
        padded += tb.batch.n_padded
    return time.perf_counter() - started, questions, tokens, padded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", type=int, default=12)
    parser.add_argument("--batch", type=int, default=6)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "train.json")
    args = parser.parse_args()

    import torch
    from peft import LoraConfig, get_peft_model

    from mydecide.modeling import load_model
    from mydecide.training.batches import epoch_units, plan_batches
    from mydecide.training.loop import build_module, lora_targets
    from mydecide.training.objectives import proper_loss

    torch.manual_seed(0)
    base = load_model(args.model)
    lm = get_peft_model(base.lm, LoraConfig(r=16, lora_alpha=32, target_modules=lora_targets(base.lm, "all-linear")))
    module = build_module(lm, base.renderer.label_ids)
    module.train()
    optimizer = torch.optim.AdamW([p for p in lm.parameters() if p.requires_grad], lr=1e-5)
    records = make_records(args.states)
    units = epoch_units(base.renderer, records, seed=0, epoch=0, shuffle_options=True)
    pad_id = base.tokenizer.pad_token_id

    # baseline: questions in random order, each a whole prompt; fast: state groups kept together, length-bucketed
    shuffled = list(units)
    random.Random(1).shuffle(shuffled)
    modes = {
        "plain": ([shuffled[i : i + args.batch] for i in range(0, len(shuffled), args.batch)], False),
        "bucketed_shared": (plan_batches(units, args.batch, seed=0, epoch=0, length_buckets=True), True),
    }
    for batches, shared in modes.values():  # warm-up: every batch shape once in each mode (allocator, kernels)
        run_pass(module, optimizer, batches, pad_id, shared, proper_loss)
    results: dict[str, dict[str, float]] = {}
    for name in ["plain", "bucketed_shared", "plain", "bucketed_shared"]:  # alternate, keep the better of two
        batches, shared = modes[name]
        seconds, questions, tokens, padded = run_pass(module, optimizer, batches, pad_id, shared, proper_loss)
        row = {
            "seconds": seconds,
            "questions": questions,
            "questions_per_s": questions / seconds,
            "tokens_processed": padded,
            "real_tokens": tokens,
            "padding_fraction": 1 - tokens / padded,
        }
        if name not in results or row["questions_per_s"] > results[name]["questions_per_s"]:
            results[name] = row
        print(
            f"  {name:16s} {questions / seconds:6.2f} questions/s  padding {1 - tokens / padded:5.1%}", file=sys.stderr
        )
    ratio = results["bucketed_shared"]["questions_per_s"] / results["plain"]["questions_per_s"]
    summary = {
        "benchmark": "train",
        "model": args.model,
        "states": args.states,
        "questions_per_state": 3,
        "batch_size": args.batch,
        **{f"{k}": v for k, v in results.items()},
        "speedup": ratio,
        "target_speedup": 1.5,
    }
    print(f"{'mode':18s} {'questions/s':>12s} {'padding':>8s} {'tokens':>8s}")
    for name, row in results.items():
        print(
            f"{name:18s} {row['questions_per_s']:12.2f} {row['padding_fraction']:8.1%} {row['tokens_processed']:8.0f}"
        )
    print(f"speed-up bucketed+shared / plain: {ratio:.2f}x (target ≥ 1.5x)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
