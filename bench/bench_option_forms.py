"""The cost of the per-option scoring form against letters, on 4-, 10- and 77-option questions (same run).

The ``banking77`` converter turns ``bench/data/banking77_synthetic.csv`` (one customer message per intent, written
for the benchmarks) into choice questions: the gold intent among 3 or 9 sampled others, and all 77 intents. Each set
is scored by the same loaded model twice (``letters``: one read over A, B, … per prompt, groups of ≤ 26 plus a
final round above 26 options; ``per_option``, the default: a prefix holding the state and the question ends with the
template's tail, and each option's continuation is its line in the answer turn). The table gives seconds per
question (batched: wall time of scoring every question divided by their number), prompts and tokens processed per
question, and the per-option form's ratio to letters. (The earlier per-option continuations, ``full`` and ``lean``,
are gone; their runs are in docs/LOG.md.)
Accuracy of the untuned model is printed for orientation only (zero-shot, near chance in both forms).

    .venv/bin/python bench/bench_option_forms.py [--limit 12] [--threads 1] [--model smollm2-135m]

Writes bench/results/option_forms.json.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from _common import BENCH, RESULTS

PER_OPTION_FORMS = ("per_option",)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data", type=Path, default=BENCH / "data" / "banking77_synthetic.csv")
    parser.add_argument("--limit", type=int, default=12, help="questions per option count")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's own choice)")
    parser.add_argument("--out", type=Path, default=RESULTS / "option_forms.json")
    args = parser.parse_args()

    import numpy as np
    import torch
    from bench_many_options import banking77_records

    from mydecide.io import atomic_write_json, provenance
    from mydecide.modeling import load_model
    from mydecide.scoring.engine import score_questions
    from mydecide.scoring.model import LoadedModel
    from mydecide.scoring.plan import ScoringPlan
    from mydecide.scoring.render import Renderer

    if args.threads:
        torch.set_num_threads(args.threads)

    def records(**options: object) -> list:
        return banking77_records(args.data, args.limit, **options)

    sets = {4: records(num_distractors=3), 10: records(num_distractors=9), 77: records(all_options=True)}
    base = load_model(args.model)
    configs = {
        "letters": {"option_form": "letters"},
        "per_option": {"option_form": "per_option"},
    }
    models = {
        form: LoadedModel(
            base.lm, base.tokenizer, Renderer(base.tokenizer, base.renderer.config.model_copy(update=update)), base.name
        )
        for form, update in configs.items()
    }
    for model in models.values():  # warm-up
        score_questions(model, [(r.state, r.question) for r in sets[4][:1]])

    results: dict[str, dict] = {}
    for k, recs in sets.items():
        items = [(r.state, r.question) for r in recs]
        row: dict[str, dict] = {}
        for form, model in models.items():
            plan = ScoringPlan(model.renderer, items)
            started = time.perf_counter()
            logits = score_questions(model, items, batch_size=32)
            wall = time.perf_counter() - started
            accuracy = float(np.mean([int(np.argmax(z)) == r.gold_index for z, r in zip(logits, recs, strict=True)]))
            row[form] = {
                "s_per_question": wall / len(items),
                "prompts_per_question": len(plan.prompts) / len(items),
                "tokens_per_question": plan.tokens() / len(items),
                "zero_shot_accuracy": accuracy,
            }
        for form in PER_OPTION_FORMS:
            row[form]["time_ratio"] = row[form]["s_per_question"] / row["letters"]["s_per_question"]
            row[form]["token_ratio"] = row[form]["tokens_per_question"] / row["letters"]["tokens_per_question"]
        results[str(k)] = row

    load = os.getloadavg()
    print(
        f"model {args.model}, torch threads {torch.get_num_threads()}, {args.limit} questions per K, "
        f"load average {load[0]:.1f} on {os.cpu_count()} cores"
    )
    print(
        f"{'K':>4}{'form':>19}{'prompts/q':>11}{'tokens/q':>10}{'s/q':>9}{'acc@0':>7}{'time ratio':>12}"
        f"{'token ratio':>13}"
    )
    for k, row in results.items():
        for form, r in row.items():
            ratio = f"{r['time_ratio']:.2f}x" if "time_ratio" in r else ""
            tokens = f"{r['token_ratio']:.2f}x" if "token_ratio" in r else ""
            print(
                f"{k:>4}{form:>19}{r['prompts_per_question']:>11.1f}{r['tokens_per_question']:>10.0f}"
                f"{r['s_per_question']:>9.3f}{r['zero_shot_accuracy']:>7.2f}{ratio:>12}{tokens:>13}"
            )
    atomic_write_json(
        args.out,
        {
            "benchmark": "option_forms",
            "what": "seconds per question of the per-option form (the default) against letters on 4-, 10- and "
            "77-option choice questions, same model, same run",
            "model": args.model,
            "torch_threads": torch.get_num_threads(),
            "results": results,
            "ratio": {
                f"{form}_over_letters_time_k{k}": row[form]["time_ratio"]
                for k, row in results.items()
                for form in PER_OPTION_FORMS
            },
            "time_ratio_k4": results["4"]["per_option"]["time_ratio"],
            "load_average_1m": load[0],
            "cpu_count": os.cpu_count(),
            "provenance": provenance(),
        },
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
