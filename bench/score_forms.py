"""Score forms side by side: letters, per option, thresholds and binomial, trained and judged on the same score task.

For each form, on the demo data's score task alone (``vader_sentiment_score``: 5 levels), with the demo's training
recipe and seed: train an adapter (``tasks=[…] prompt.score_form=FORM``), then judge it by two-fold calibration, so
that every dev and test question counts and none is judged with a temperature fitted on itself: calibrate on dev and
evaluate test, calibrate on test and evaluate dev, and pool the two halves' predictions (about 380 questions). The
base model (the same form, adapter disabled) and the training split's level frequencies (the prior) are judged on
the same questions. Reported per form: accuracy, RPS, MAE of the expected level, Spearman ρ, within-one accuracy,
ECE with its resampling band, threshold ECE with its band, and seconds per question of the evaluation's scoring.

    .venv/bin/python bench/score_forms.py --data DIR [--steps 150] [--forms letters,per_option,thresholds,binomial]

``--data`` is a `mydecide prepare recipes/data/demo.yaml` output (with ``augment.soft_targets=true`` its train rows
are the raters' level shares: docs/records.md; the prior is then their mean). Writes bench/results/score_forms.json
and prints the table; the runs are kept under ``--work`` (default runs/score_forms).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import RESULTS, ROOT

from mydecide.evaluation.rows import block, rows_from_predictions
from mydecide.prompt import SCORE_FORMS

TASK = "vader_sentiment_score"
COLUMNS = (
    ("accuracy", "accuracy"),
    ("rps", "RPS"),
    ("mae", "MAE"),
    ("spearman", "ρ"),
    ("within_one", "within one"),
    ("ece", "ECE"),
    ("ece_band", "ECE band"),
    ("threshold_ece", "threshold ECE"),
    ("threshold_ece_band", "band"),
    ("seconds_per_question", "s / question"),
)


def cli(*args: str) -> None:
    command = [sys.executable, "-m", "mydecide.cli", *args]
    print("$ mydecide " + " ".join(args), flush=True)
    subprocess.run(command, check=True, cwd=ROOT)


def task_files(data: Path, work: Path) -> Path:
    """train / dev / test of the score task alone, beside each other (so evaluate finds the training prior)."""
    out = work / "data"
    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "dev", "test"):
        lines = [
            line for line in (data / f"{split}.jsonl").read_text().splitlines() if json.loads(line)["task"] == TASK
        ]
        (out / f"{split}.jsonl").write_text("".join(line + "\n" for line in lines))
        print(f"{split}: {len(lines)} {TASK} questions")
    return out


def summary(rows: list[Any], seconds: float | None) -> dict[str, Any]:
    b = block(rows)
    ordinal = b["ordinal"]
    return {
        "n": b["n"],
        "accuracy": b["accuracy"],
        "ece": b["ece"],
        "ece_band": b["ece_band"],
        **{k: ordinal[k] for k in ("rps", "mae", "spearman", "within_one", "threshold_ece", "threshold_ece_band")},
        "seconds_per_question": seconds,
    }


def prior_rows(train: Path, rows: list[Any]) -> list[Any]:
    """The same questions answered with the training split's level frequencies."""
    from dataclasses import replace

    from mydecide.record_files import load_records

    freq = np.mean([r.target for r in load_records(train)], axis=0)
    return [replace(r, probs=freq) for r in rows]


def run_form(form: str, data: Path, work: Path, steps: int, model: str) -> dict[str, Any]:
    run = work / form
    started = time.perf_counter()
    if not (run / "adapter").is_dir():
        cli(
            "train",
            "recipes/train/demo.yaml",
            "--model",
            model,
            "--data",
            str(data),
            "--out",
            str(run),
            f"tasks=[{TASK}]",
            "task_weights={}",  # the demo recipe's weights name the span task, which this run leaves out
            f"prompt.score_form={form}",
            f"optim.max_steps={steps}",
            f"eval_every={steps}",
            f"save_every={steps}",
        )
    train_seconds = time.perf_counter() - started
    halves: dict[str, dict[str, list[dict[str, Any]]]] = {}
    seconds = 0.0
    questions = 0
    for fit, judged in (("dev", "test"), ("test", "dev")):
        temperatures = run / f"temperatures_{fit}.json"
        out = run / f"eval_{judged}"
        cli(
            "calibrate",
            "--model",
            model,
            "--adapter",
            str(run / "adapter"),
            "--data",
            str(data / f"{fit}.jsonl"),
            "--out",
            str(temperatures),
            "--force",
            "-q",
        )
        started = time.perf_counter()
        cli(
            "evaluate",
            "--model",
            model,
            "--adapter",
            str(run / "adapter"),
            "-t",
            str(temperatures),
            "--data",
            str(data / f"{judged}.jsonl"),
            "--out",
            str(out),
            "--permutations",
            "0",
            "-q",
        )
        seconds += time.perf_counter() - started
        report = json.loads((out / "report.json").read_text())
        questions += report["records"]
        halves[judged] = {
            "model": [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()],
            "base": [json.loads(line) for line in (out / "base_predictions.jsonl").read_text().splitlines()],
        }
    model_rows = [r for half in halves.values() for r in rows_from_predictions(half["model"])]
    base_rows = [r for half in halves.values() for r in rows_from_predictions(half["base"])]
    per_question = seconds / questions / 2  # the evaluation scored the model and the base model
    return {
        "form": form,
        "train_seconds": train_seconds,
        "tuned_calibrated": summary(model_rows, per_question),
        "base_model": summary(base_rows, per_question),
        "prior": summary(prior_rows(data / "train.jsonl", model_rows), None),
    }


def table(results: list[dict[str, Any]]) -> str:
    header = "| form | model | n | " + " | ".join(label for _, label in COLUMNS) + " |"
    lines = [header, "|" + "---|" * (len(COLUMNS) + 3)]
    for result in results:
        for side in ("tuned_calibrated", "base_model", "prior"):
            s = result[side]
            cells = ["—" if s[k] is None else f"{s[k]:.3f}" for k, _ in COLUMNS]
            lines.append(f"| {result['form']} | {side.replace('_', ' ')} | {s['n']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="a `mydecide prepare recipes/data/demo.yaml` output")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "score_forms")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--forms", default=",".join(SCORE_FORMS), help=f"comma-separated, of {', '.join(SCORE_FORMS)}")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--out", type=Path, default=RESULTS / "score_forms.json")
    args = parser.parse_args()
    forms = args.forms.split(",")
    unknown = [form for form in forms if form not in SCORE_FORMS]
    if unknown:
        parser.error(f"--forms: {', '.join(unknown)} not among {', '.join(SCORE_FORMS)}")
    data = task_files(args.data, args.work)
    results = [run_form(form, data, args.work, args.steps, args.model) for form in forms]
    print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "task": TASK,
                "steps": args.steps,
                "model": args.model,
                "soft_train_rows": sum('"target"' in line for line in (data / "train.jsonl").open()),
                "results": results,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
