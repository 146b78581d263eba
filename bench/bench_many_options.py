"""77 options in one question (groups of ≤ 26 + a final round) vs the gold among 9 sampled distractors.

A Banking77-layout file (``text,category``) is converted twice by the ``banking77`` converter: with
``all_options=True`` (all 77 intents, scored as 3 groups of 26/26/25 plus a final round among the 3 group leaders,
``mydecide.scoring.plan``) and with ``num_distractors=9`` (the gold intent among 9 sampled others, one prompt of 10
options: the seed's setting). Both are scored by the same untuned model in the same process; the table gives
accuracy, chance-corrected accuracy, log loss, and time per question (batched: the wall time of scoring all
questions divided by their number; alone: the median latency of one question scored by itself). The 77-way
answer is also read on the 10 options of the distractor question (its distribution restricted and renormalised)
to separate "harder question" from "worse scoring".

The default data is ``bench/data/banking77_synthetic.csv``: 77 short customer messages written for this
benchmark, one per intent, in the published layout (no Banking77 file can be fetched on an offline machine).
Pass ``--data train.csv`` to use a real Banking77 file.

    .venv/bin/python bench/bench_many_options.py [--limit 60] [--threads 1] [--model smollm2-135m] [--data F]

Writes bench/results/many_options.json.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from pathlib import Path

from _common import BENCH, RESULTS, ROOT


def banking77_records(data: Path, limit: int, **options: object) -> list:
    """Decision records from a Banking77-layout file through the ``banking77`` converter (``options``: its own)."""
    from data_sources import banking77
    from mydecide.records import parse_record

    rows = [
        {k: v for k, v in row.items() if k != "_where"}  # the converter's provenance key
        for row in banking77.convert(str(data), limit=limit, **options)
    ]  # type: ignore[arg-type]
    return [parse_record(row)[0] for row in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data", type=Path, default=BENCH / "data" / "banking77_synthetic.csv")
    parser.add_argument("--limit", type=int, default=24, help="questions (the file's first N rows)")
    parser.add_argument("--distractors", type=int, default=9)
    parser.add_argument("--alone", type=int, default=5, help="questions timed one by one, per mode")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's own choice)")
    parser.add_argument("--out", type=Path, default=RESULTS / "many_options.json")
    args = parser.parse_args()

    import numpy as np
    import torch

    from mydecide.io import atomic_write_json, provenance
    from mydecide.modeling import load_model
    from mydecide.scoring.engine import score_questions
    from mydecide.scoring.plan import prompt_count
    from mydecide.scoring.probabilities import to_probabilities

    if args.threads:
        torch.set_num_threads(args.threads)

    def records(**options: object) -> list:
        return banking77_records(args.data, args.limit, **options)

    modes = {
        "all_77": records(all_options=True),
        f"gold_among_{args.distractors}": records(num_distractors=args.distractors),
    }
    model = load_model(args.model, option_form="letters")  # the groups + final round are the letters form's
    score_questions(model, [(r.state, r.question) for r in modes["all_77"][:1]])  # warm-up

    results: dict[str, dict] = {}
    probs_by_mode: dict[str, list[np.ndarray]] = {}
    for mode, records in modes.items():
        items = [(r.state, r.question) for r in records]
        started, cpu = time.perf_counter(), time.process_time()
        logits = score_questions(model, items, batch_size=16)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        alone = []
        for item in items[: args.alone]:
            t0 = time.perf_counter()
            score_questions(model, [item])
            alone.append(time.perf_counter() - t0)
        probs = [to_probabilities("choice", z) for z in logits]
        probs_by_mode[mode] = probs
        gold = [r.gold_index for r in records]
        k = records[0].question.k
        accuracy = float(np.mean([int(np.argmax(p)) == g for p, g in zip(probs, gold, strict=True)]))
        results[mode] = {
            "k": k,
            "n": len(records),
            "prompts_per_question": prompt_count(records[0].question),
            "accuracy": accuracy,
            "chance": 1 / k,
            "chance_corrected": (accuracy - 1 / k) / (1 - 1 / k),
            "log_loss": float(np.mean([-math.log(max(p[g], 1e-12)) for p, g in zip(probs, gold, strict=True)])),
            "uniform_log_loss": math.log(k),
            "mean_gold_probability": float(np.mean([p[g] for p, g in zip(probs, gold, strict=True)])),
            "sum_of_probabilities_max_error": float(max(abs(p.sum() - 1) for p in probs)),
            "batched_s_per_question": wall / len(records),
            "batched_cpu_s_per_question": cpu / len(records),
            "alone_median_s": statistics.median(alone),
            "alone_s": alone,
        }

    # the 77-way distribution read on the 10 options of the distractor question (renormalised)
    few = f"gold_among_{args.distractors}"
    restricted_right, restricted_loss = [], []
    for big_p, big_r, small_r in zip(probs_by_mode["all_77"], modes["all_77"], modes[few], strict=True):
        index = [big_r.question.options.index(o) for o in small_r.question.options]
        p = big_p[index] / big_p[index].sum()
        restricted_right.append(int(np.argmax(p)) == small_r.gold_index)
        restricted_loss.append(-math.log(max(p[small_r.gold_index], 1e-12)))
    results["all_77_read_on_the_10"] = {
        "accuracy": float(np.mean(restricted_right)),
        "log_loss": float(np.mean(restricted_loss)),
    }

    big, small = results["all_77"], results[few]
    time_ratio = big["batched_s_per_question"] / small["batched_s_per_question"]
    load = os.getloadavg()
    print(
        f"model {args.model} on {model.device}, torch threads {torch.get_num_threads()}, {big['n']} questions "
        f"from {args.data.name}, load average {load[0]:.1f} on {os.cpu_count()} cores"
    )
    print(
        f"{'mode':<24}{'K':>4}{'prompts':>8}{'accuracy':>10}{'chance-c.':>10}{'log loss':>10}{'uniform':>9}"
        f"{'s/q batch':>11}{'s/q alone':>11}{'ratio':>7}"
    )
    for mode in ("all_77", few):
        r = results[mode]
        print(
            f"{mode:<24}{r['k']:>4}{r['prompts_per_question']:>8}{r['accuracy']:>10.3f}"
            f"{r['chance_corrected']:>10.3f}{r['log_loss']:>10.3f}{r['uniform_log_loss']:>9.3f}"
            f"{r['batched_s_per_question']:>11.3f}{r['alone_median_s']:>11.3f}"
            f"{r['batched_s_per_question'] / small['batched_s_per_question']:>6.2f}x"
        )
    r = results["all_77_read_on_the_10"]
    print(f"{'all_77 read on the 10':<24}{10:>4}{'':>8}{r['accuracy']:>10.3f}{'':>10}{r['log_loss']:>10.3f}")
    print(
        f"77 options cost {time_ratio:.2f}x the time of 10 per question (batched); probabilities sum to 1 "
        f"within {big['sum_of_probabilities_max_error']:.1e}"
    )

    atomic_write_json(
        args.out,
        {
            "benchmark": "many_options",
            "what": "a 77-intent Banking77-layout task: all 77 options (groups + final round) vs gold among "
            f"{args.distractors} distractors, untuned base model",
            "data": str(args.data.relative_to(ROOT) if args.data.is_relative_to(ROOT) else args.data),
            "synthetic_data": args.data.name == "banking77_synthetic.csv",
            "model": args.model,
            "device": str(model.device),
            "torch_threads": torch.get_num_threads(),
            "results": results,
            "time_ratio": time_ratio,
            "ratio": {"all_77_over_gold_among_distractors_time": time_ratio},
            "load_average_1m": load[0],
            "cpu_count": os.cpu_count(),
            "provenance": provenance(),
        },
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
