"""Training throughput: shared-state batches vs one prompt per question, gradient checkpointing off and on.

The same records (states of mixed length, 3 questions each) and the same model (smollm2-135m with a LoRA adapter)
are trained on for one pass per mode, in one process, the modes alternating so that load from other processes
hits all alike (the best of ``--rounds`` passes is kept). Modes:

* ``per_question``: questions in random order, each prompt a whole row (left-padded); how a trainer without
  state sharing works. With checkpointing on (``per_question_ckpt``) this is our own model of the seed article's
  loop (per question, checkpointing on; its script is not part of this repository and is not run here).
* ``shared``: :func:`plan_batches` (a state's questions in one batch, length buckets) and the packed shared-state
  batch (scoring/packed.py): every state computed once per batch, one forward call.
* ``cache`` (checkpointing off only): the same batches through the KV-cache route (``scoring.forward.last_hidden``),
  which checkpointing cannot recompute.

Reports questions/s of forward + backward + optimiser step, the ratios measured in this run, and tokens computed
per question against the unique tokens (each state once plus each question's own tokens: the floor).

    .venv/bin/python bench/bench_train.py [--states 12] [--batch 6] [--model smollm2-135m] [--form per_option]
        [--rounds 2]

Writes bench/results/train.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

from _common import RESULTS

TEXT = (
    "the customer reports that checkout fails with an error after payment and the invoice shows a double "
    "charge while support asks for logs from the web shop during the outage this morning"
)
WORDS = TEXT.split()


def make_rows(n_states: int, seed: int = 0) -> list[dict]:
    """Record dicts: ``n_states`` states of mixed length, three questions each (choice, yes / no, score)."""
    rng = random.Random(seed)
    rows = []
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
            rows.append({"id": f"{i}-{j}", "task": f"t{j}", "state": state, "question": q, "answer": a})
    return rows


def make_records(n_states: int, seed: int = 0) -> list:
    from mydecide.records import parse_record

    return [record for row in make_rows(n_states, seed) for record in parse_record(row)]


def unique_tokens(units: list, records: list, renderer) -> int:
    """The floor: each state once, each question's own text once (a per-option prefix holds the state and the
    question), each prompt's suffix once."""
    states = {renderer.encode_state(records[u.record_index].state)[0] for u in units}
    prefixes = {p.prefix for u in units for p in u.prompts}
    own = sum(len(p) - max(len(s) for s in states if p[: len(s)] == s) for p in prefixes)
    return sum(map(len, states)) + own + sum(len(p.suffix) for u in units for p in u.prompts)


def run_pass(module, optimizer, batches, pad_id: int, shared: bool, packing, loss_fn) -> tuple[float, int, int, int]:
    from mydecide.training.batches import make_batch

    started = time.perf_counter()
    questions = tokens = padded = 0
    for units in batches:
        tb = make_batch(units, pad_id, shared, packing)
        logits = tb.logits(module(tb.batch))  # as the training loop reads them: per-option units gather yes − no
        loss = loss_fn(logits, tb.targets, tb.mask, tb.is_score, progress=0.0)
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
    parser.add_argument("--form", choices=["per_option", "letters"], default="per_option", help="choice questions")
    parser.add_argument("--rounds", type=int, default=2, help="passes per mode, alternating; the best is kept")
    parser.add_argument("--out", type=Path, default=RESULTS / "train.json")
    args = parser.parse_args()

    import torch
    from peft import LoraConfig, get_peft_model

    from mydecide.io import atomic_write_text
    from mydecide.modeling import load_model
    from mydecide.prompt import RenderConfig
    from mydecide.scoring.packed import packing_mode
    from mydecide.training.batches import epoch_units, plan_batches
    from mydecide.training.model import build_module, lora_targets, set_checkpointing
    from mydecide.training.objectives import proper_loss

    torch.manual_seed(0)
    base = load_model(args.model, render=RenderConfig(option_form=args.form))
    lm = get_peft_model(base.lm, LoraConfig(r=16, lora_alpha=32, target_modules=lora_targets(base.lm, "all-linear")))
    module = build_module(lm, base.renderer.label_ids)
    module.train()
    optimizer = torch.optim.AdamW([p for p in lm.parameters() if p.requires_grad], lr=1e-5)
    records = make_records(args.states)
    units = epoch_units(base.renderer, records, seed=0, epoch=0, shuffle_options=True)
    pad_id = base.tokenizer.pad_token_id
    packing = packing_mode(lm)
    if packing is None:
        raise SystemExit(f"{args.model}: its layers cannot take a packed batch (attention kernel or layer kinds)")
    floor = unique_tokens(units, records, base.renderer)

    shuffled = list(units)
    random.Random(1).shuffle(shuffled)
    per_question = [shuffled[i : i + args.batch] for i in range(0, len(shuffled), args.batch)]
    planned = plan_batches(units, args.batch, seed=0, epoch=0, length_buckets=True)
    modes = {  # name → (batches, shared, packing, checkpointing)
        "per_question": (per_question, False, None, False),
        "cache": (planned, True, None, False),
        "shared": (planned, True, packing, False),
        "per_question_ckpt": (per_question, False, None, True),
        "shared_ckpt": (planned, True, packing, True),
    }

    for batches, shared, packed, ckpt in modes.values():  # warm-up: one batch of each mode
        set_checkpointing(lm, ckpt)
        run_pass(module, optimizer, batches[:1], pad_id, shared, packed, proper_loss)
    results: dict[str, dict[str, float]] = {}
    for name in [name for _ in range(args.rounds) for name in modes]:  # alternate, keep the best
        batches, shared, packed, ckpt = modes[name]
        set_checkpointing(lm, ckpt)
        seconds, questions, tokens, padded = run_pass(module, optimizer, batches, pad_id, shared, packed, proper_loss)
        row = {
            "checkpointing": ckpt,
            "seconds": seconds,
            "questions": questions,
            "questions_per_s": questions / seconds,
            "tokens_processed": padded,
            "real_tokens": tokens,
            "padding_fraction": 1 - tokens / padded,
            "tokens_per_question": padded / questions,
            "tokens_over_unique": padded / floor,
            "real_tokens_over_unique": tokens / floor,
        }
        if name not in results or row["questions_per_s"] > results[name]["questions_per_s"]:
            results[name] = row
        print(f"  {name:18s} {questions / seconds:6.2f} questions/s  {padded / floor:5.2f}x unique", file=sys.stderr)

    def ratio(fast: str, slow: str) -> float:
        return results[fast]["questions_per_s"] / results[slow]["questions_per_s"]

    summary = {
        "benchmark": "train",
        "model": args.model,
        "option_form": args.form,
        "packing": packing,
        "device": "cpu",
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "states": args.states,
        "questions_per_state": 3,
        "rounds": args.rounds,
        "batch_size": args.batch,
        "unique_tokens": floor,
        "unique_tokens_per_question": floor / len(units),
        **results,
        "speedup": ratio("shared_ckpt", "per_question_ckpt"),  # the headline: checkpointing on, as the seed runs
        "speedup_no_ckpt": ratio("shared", "per_question"),
        "packed_vs_cache_no_ckpt": ratio("shared", "cache"),
        "checkpointing_cost_shared": results["shared"]["questions_per_s"] / results["shared_ckpt"]["questions_per_s"],
        "target_tokens_over_unique": 1.2,
    }
    print(f"{'mode':18s} {'ckpt':>5s} {'questions/s':>12s} {'padding':>8s} {'tokens/q':>9s} {'x unique':>9s}")
    for name, row in results.items():
        print(
            f"{name:18s} {'on' if row['checkpointing'] else 'off':>5s} {row['questions_per_s']:12.2f} "
            f"{row['padding_fraction']:8.1%} {row['tokens_per_question']:9.1f} {row['tokens_over_unique']:9.2f}"
        )
    print(f"unique tokens per question (floor): {floor / len(units):.1f}")
    print(f"speed-up shared / per question, checkpointing on:  {summary['speedup']:.2f}x")
    print(f"speed-up shared / per question, checkpointing off: {summary['speedup_no_ckpt']:.2f}x")
    print(f"packed / KV-cache route, checkpointing off:         {summary['packed_vs_cache_no_ckpt']:.2f}x")
    atomic_write_text(args.out, json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
