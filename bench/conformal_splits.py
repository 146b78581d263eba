"""How much of a conformal set's coverage and size is the luck of one dev / test draw?

`calibrate --alpha` fits a set rule on one dev split and `evaluate` measures it on one test split. Both numbers are
one draw: a dev split that happens to be harder than the test split gives a threshold that over-covers on test,
with wider sets than the model needs. This bench takes the predictions ``evaluate`` wrote on the dev split and on
the test split (the same model and temperatures.json) and, per question type and conformal score:

* fits the threshold on the real dev split and measures it on the real test split (what evaluate reports);
* pools the two splits and redraws ``--splits`` exchangeable dev / test splits of the same sizes (seed 0), fitting
  and measuring each the same way: the mean, 10th and 90th percentile of coverage and set size over the redraws.

Only the rows ``evaluate`` wrote are used (choice, noul, score; per-label set and span rules are not redrawn).
Writes bench/results/conformal_splits.json and .md.

    .venv/bin/mydecide evaluate --adapter RUN/train/adapter -t RUN/temperatures.json \\
        --data RUN/data_eval/dev.jsonl --out /tmp/eval_dev --no-base --permutations 0
    .venv/bin/python bench/conformal_splits.py --dev /tmp/eval_dev/predictions.jsonl \\
        --test RUN/eval_test/predictions.jsonl --alpha 0.1
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
from _common import RESULTS

from mydecide.calibration.conformal import SCORES, conformal_quantile, gold_scores, prediction_sets
from mydecide.calibration.conformal_fit import KIND
from mydecide.io import atomic_write_text

TYPES = ("choice", "noul", "score")


def read_rows(path: Path) -> dict[str, list[tuple[np.ndarray, int]]]:
    """(calibrated probabilities, gold index) per question type from an evaluate predictions.jsonl (hard targets
    only, as the conformal fit takes them)."""
    rows: dict[str, list[tuple[np.ndarray, int]]] = {}
    with path.open(encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r["type"] not in TYPES or r.get("soft") or not r.get("target"):
                continue
            keys = list(r["probabilities"])  # the order of the options (levels 0 … K − 1 for score)
            p = np.array([r["probabilities"][key] for key in keys], dtype=np.float64)
            rows.setdefault(r["type"], []).append((p, int(np.argmax([r["target"][key] for key in keys]))))
    return rows


def measure(score: str, fit: list[tuple[np.ndarray, int]], held: list[tuple[np.ndarray, int]], alpha: float):
    q = conformal_quantile(gold_scores(score, [p for p, _ in fit], [g for _, g in fit]), alpha)
    sets = prediction_sets(score, [p for p, _ in held], q)
    covered = np.mean([s[g] for s, (_, g) in zip(sets, held, strict=True)])
    return float(covered), float(np.mean([s.sum() for s in sets]))


def run(dev: dict, test: dict, alpha: float, splits: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    rng = np.random.default_rng(0)
    for qtype in TYPES:
        if qtype not in dev or qtype not in test:
            continue
        pooled = dev[qtype] + test[qtype]
        n_dev = len(dev[qtype])
        orders = [rng.permutation(len(pooled)) for _ in range(splits)]
        for score in SCORES[KIND[qtype]]:
            cov, size = measure(score, dev[qtype], test[qtype], alpha)
            draws = np.array(
                [measure(score, [pooled[i] for i in o[:n_dev]], [pooled[i] for i in o[n_dev:]], alpha) for o in orders]
            )
            out[f"{qtype}/{score}"] = {
                "dev_n": n_dev,
                "test_n": len(test[qtype]),
                "this_split": {"coverage": cov, "mean_size": size},
                "redraws": {
                    "coverage_mean": float(draws[:, 0].mean()),
                    "size_mean": float(draws[:, 1].mean()),
                    "size_p10": float(np.percentile(draws[:, 1], 10)),
                    "size_p90": float(np.percentile(draws[:, 1], 90)),
                    "size_rank_of_this_split": float(np.mean(draws[:, 1] <= size)),
                },
            }
    return out


def table(results: dict[str, Any], alpha: float, splits: int) -> str:
    lines = [
        f"Conformal sets at alpha {alpha:g}: the real dev / test split against {splits} exchangeable redraws of the "
        "same questions",
        "",
        "| type / score | dev n | test n | this split: coverage | size | redraws: coverage | size mean | p10–p90 "
        "| share of redraws ≤ this size |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, r in results.items():
        s, d = r["this_split"], r["redraws"]
        lines.append(
            f"| {key} | {r['dev_n']} | {r['test_n']} | {s['coverage']:.3f} | {s['mean_size']:.2f} | "
            f"{d['coverage_mean']:.3f} | {d['size_mean']:.2f} | {d['size_p10']:.2f}–{d['size_p90']:.2f} | "
            f"{d['size_rank_of_this_split']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dev", type=Path, required=True, help="evaluate's predictions.jsonl on the dev split")
    ap.add_argument("--test", type=Path, required=True, help="evaluate's predictions.jsonl on the test split")
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--splits", type=int, default=300)
    ap.add_argument("--name", default="conformal_splits")
    args = ap.parse_args()
    results = run(read_rows(args.dev), read_rows(args.test), args.alpha, args.splits)
    report = {"alpha": args.alpha, "splits": args.splits, "dev": str(args.dev), "test": str(args.test)} | {
        "results": results
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    atomic_write_text(RESULTS / f"{args.name}.json", json.dumps(report, indent=2) + "\n")
    text = table(results, args.alpha, args.splits)
    atomic_write_text(RESULTS / f"{args.name}.md", text)
    print(text, end="")


if __name__ == "__main__":
    main()
