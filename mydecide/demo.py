"""The main job end to end on the embedded default (`make demo`).

prepare (bundled real samples) → train (smollm2-135m, LoRA, CPU) → calibrate (dev) → evaluate the base, tuned and
tuned + calibrated model on the test split of the trained tasks, and on the held-out task → a comparison table and
``runs/demo/summary.json`` (the tables: ``summary.md``). Each step runs the real ``mydecide`` command, so the demo is
also a check of the CLI. docs/demo.md's tables are this run's ``summary.md``, copied in by ``scripts/update_readme.py``
(a developer tool of the repository, not part of the package).

    python -m mydecide.demo [--out runs/demo] [--data PREPARED] [--trained RUN] [TRAIN_OVERRIDE ...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from mydecide.config import ModelChoice
from mydecide.evaluation.guarantees import guarantees_markdown
from mydecide.io import atomic_write_json, atomic_write_text

ROOT = Path(__file__).resolve().parent.parent
SCORE_TASK, EVAL_CAP = "vader_sentiment_score", 100_000
"""The demo trains on the score task capped like the others (recipes/data/demo.yaml) and is calibrated and evaluated
on a second prepare without that cap: about 350 dev and 350 test score questions instead of 190, enough for an ECE
to say something about a 5-level scale (docs/calibration.md). The split hashes each state, so the second prepare's
dev and test hold every dev and test row of the first and no training state (checked before training); its
train.jsonl, a larger sample of the same training split, is where evaluate takes the prior baseline from."""
GUARANTEES = ("--alpha", "0.1", "--max-risk", "0.05", "--delta", "0.1")
"""calibrate also fits answer sets for 90% coverage and an auto-act threshold whose error rate among the answered
questions is at most 5% with probability 0.9 (docs/guarantees.md); the summary shows what they gave on test."""
MODEL = ModelChoice().model  # the recipes' default base model
COLUMNS = ("n", "accuracy", "chance_corrected", "log_loss", "ece", "ece_band", "flip_rate")
"""``ece_band``: the ECE a perfectly calibrated model with the same confidences reaches on that many questions (90th
percentile of resamplings, ``metrics.ece_band``): an ECE below it is no evidence of miscalibration."""


def step(title: str, args: list[str]) -> float:
    print(f"\n==> {title}\n    mydecide {' '.join(args)}", flush=True)
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "mydecide.cli", *args], cwd=ROOT)
    if result.returncode != 0:
        sys.exit(f"demo: step failed ({title}), exit code {result.returncode}")
    seconds = time.perf_counter() - started
    print(f"    done in {seconds:.0f}s", flush=True)
    return seconds


def pick(block: dict[str, Any]) -> dict[str, Any]:
    return {key: block.get(key) for key in COLUMNS}


def blocks(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """base / tuned / tuned_calibrated / majority blocks (all questions) from one evaluate report."""
    return {
        "base": pick(report["baselines"]["base_model"]["all"]),
        "tuned": pick(report["uncalibrated"]["all"]),
        "tuned_calibrated": pick(report["all"]),
        "majority": pick(report["baselines"]["majority"]["all"]),
    }


def fmt(value: Any) -> str:
    if value is None:
        return "—"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def table(rows: dict[str, dict[str, Any]]) -> str:
    lines = ["| model | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for name, row in rows.items():
        lines.append(f"| {name} | " + " | ".join(fmt(row[c]) for c in COLUMNS) + " |")
    return "\n".join(lines)


def by_task_table(report: dict[str, Any]) -> str:
    base = report["baselines"]["base_model"]["by_task"]
    tuned = report["uncalibrated"]["by_task"]
    lines = [
        "| task | n | base accuracy | tuned accuracy | tuned + calibrated ECE (up to) | majority accuracy |",
        "|---|---|---|---|---|---|",
    ]
    majority = report["baselines"]["majority"]["by_task"]
    for task, block in report["by_task"].items():
        if "span" in block.get("types", []):  # its word × label cells: span_table shows the task
            continue
        lines.append(
            f"| {task} | {block['n']} | {fmt(base[task]['accuracy'])} | {fmt(tuned[task]['accuracy'])} | "
            f"{fmt(block['ece'])} ({fmt(block.get('ece_band'))}) | {fmt(majority.get(task, {}).get('accuracy'))} |"
        )
    return "\n".join(lines)


def calibration_table(temperatures: dict[str, Any], report: dict[str, Any]) -> str:
    """Per question type: its temperature, and log loss / ECE at T = 1 → calibrated on the dev rows it was fitted on
    and on the test split, each with its question count and the ECE band of a calibrated model."""
    lines = [
        "| type | T | dev n | dev log loss | dev ECE (up to) | test n | test log loss | test ECE (up to) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for qtype, dev in temperatures["types"].items():
        test, raw = report.get(qtype) or {}, (report.get("uncalibrated") or {}).get(qtype) or {}
        if not test.get("n"):
            continue
        lines.append(
            f"| {qtype} | {dev['temperature']:.3f} | {dev['n']} | {fmt(dev['log_loss_before'])} → "
            f"{fmt(dev['log_loss_after'])} | {fmt(dev['ece_before'])} → {fmt(dev['ece_after'])} "
            f"({fmt(dev.get('ece_band_after'))}) | {test['questions']} | {fmt(raw.get('log_loss'))} → "
            f"{fmt(test['log_loss'])} | {fmt(raw.get('ece'))} → {fmt(test['ece'])} ({fmt(test.get('ece_band'))}) |"
        )
    return "\n".join(lines)


SCORE_COLUMNS = (
    ("rps", "RPS"),
    ("mae", "MAE"),
    ("spearman", "Spearman ρ"),
    ("within_one", "within one"),
)


def score_sides(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The score blocks (with ordinal metrics) of the base, tuned and tuned + calibrated model and of the training
    split's level frequencies in one evaluate report; {} when its split holds no score question."""
    baselines = report["baselines"]
    sides = {
        "base": baselines.get("base_model", {}).get("score"),
        "tuned": report.get("uncalibrated", {}).get("score"),
        "tuned_calibrated": report.get("score"),
        "prior": baselines.get("majority", {}).get("score"),
    }
    return {name: block for name, block in sides.items() if block and block.get("ordinal")}


def score_table(report: dict[str, Any]) -> str | None:
    """The score questions' ordinal metrics (accuracy, RPS, MAE of the expected level, Spearman ρ, within-one, ECE and
    threshold ECE with their bands) beside each other; None when the split holds no score question."""
    sides = score_sides(report)
    if not sides:
        return None
    lines = [
        "| model | n | accuracy | "
        + " | ".join(label for _, label in SCORE_COLUMNS)
        + " | ECE (up to) | threshold ECE (up to) |",
        "|---" * (len(SCORE_COLUMNS) + 5) + "|",
    ]
    for name, block in sides.items():
        o = block["ordinal"]
        lines.append(
            f"| {name} | {block['n']} | {fmt(block['accuracy'])} | "
            + " | ".join(fmt(o.get(key)) for key, _ in SCORE_COLUMNS)
            + f" | {fmt(block['ece'])} ({fmt(block.get('ece_band'))}) | {fmt(o.get('threshold_ece'))} "
            f"({fmt(o.get('threshold_ece_band'))}) |"
        )
    return "\n".join(lines)


def shared_states(train: Path, evaluated: list[Path]) -> int:
    """How many states of the ``evaluated`` files also appear in ``train`` (normalised as the split hashes them)."""
    from mydecide.data.split import state_key

    def states(path: Path) -> set[str]:
        with path.open(encoding="utf-8") as handle:
            return {state_key(json.loads(line)["state"]) for line in handle if line.strip()}

    seen = states(train)
    return sum(len(states(path) & seen) for path in evaluated)


def span_sides(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The span blocks (with span-level F1) of the base, tuned and tuned + calibrated model in one evaluate report;
    {} when its split holds no span question."""
    sides = {
        "base": report["baselines"].get("base_model", {}).get("span"),
        "tuned": report.get("uncalibrated", {}).get("span"),
        "tuned_calibrated": report.get("span"),
    }
    return {name: block for name, block in sides.items() if block and block.get("spans")}


def label_f1(cell: dict[str, Any] | None) -> str:
    """A label's exact F1 with its 95% bootstrap interval (questions resampled) where the report has one."""
    if not cell:
        return "—"
    interval = cell.get("exact_f1_ci95")
    return fmt(cell["exact"]["f1"]) + (f" ({interval[0]:.2f}–{interval[1]:.2f})" if interval else "")


def span_table(report: dict[str, Any]) -> str | None:
    """Span-level precision / recall / F1 (exact and overlapping match), the word-level log loss and the span-level
    ECE (its band in brackets) of the base, tuned and tuned + calibrated model on the span questions, then exact F1
    by label; None when the split holds none."""
    sides = span_sides(report)
    if not sides:
        return None
    lines = [
        "| model | span questions | gold spans | exact P | exact R | exact F1 | overlap F1 | word log loss "
        "| span ECE (up to) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, block in sides.items():
        s = block["spans"]
        values = [s["exact"]["precision"], s["exact"]["recall"], s["exact"]["f1"], s["overlap"]["f1"]]
        band = f" ({fmt(s['span_ece_band'])})" if s.get("span_ece_band") is not None else ""
        lines.append(
            f"| {name} | {s['questions']} | {s['gold_spans']} | "
            + " | ".join(fmt(v) for v in values)
            + f" | {fmt(block['log_loss'])} | {fmt(s.get('span_ece'))}{band} |"
        )
    labels = sorted({key for block in sides.values() for key in block["spans"]["by_label"]})
    lines += [
        "",
        "| label (exact F1, 95% bootstrap interval) | gold spans | " + " | ".join(sides) + " |",
        "|---|---|" + "---|" * len(sides),
    ]
    for key in labels:
        cells = [block["spans"]["by_label"].get(key) for block in sides.values()]
        gold = next(c["gold"] for c in cells if c)
        lines.append(f"| {key} | {gold} | " + " | ".join(label_f1(c) for c in cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "demo")
    parser.add_argument("--model", default=MODEL, help=f"Base model (default: the packaged {MODEL}).")
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="A `mydecide prepare` output of recipes/data/demo.yaml to reuse instead of step 1.",
    )
    parser.add_argument(
        "--trained",
        type=Path,
        default=None,
        help="A `mydecide train` run directory of that data to reuse instead of step 2.",
    )
    parser.add_argument("overrides", nargs="*", help="Training recipe overrides, e.g. optim.max_steps=40.")
    args = parser.parse_args()
    out: Path = args.out
    for flag, given in (("--data", args.data), ("--trained", args.trained)):
        if given is not None and given.resolve().is_relative_to(out.resolve()):
            sys.exit(f"demo: {flag} {given} is inside --out {out}, which the demo empties first: give another --out")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    data, run, temps = args.data or out / "data", args.trained or out / "train", out / "temperatures.json"
    evaluation = out / "data_eval"
    started = time.perf_counter()

    def evaluate_args(data_file: str, report_dir: str) -> list[str]:
        """`mydecide evaluate` of the trained adapter with the fitted temperatures on one data file."""
        return [
            "evaluate",
            *("--model", args.model, "--adapter", str(run / "adapter"), "--temperatures", str(temps)),
            *("--data", str(evaluation / data_file), "--out", str(out / report_dir), "--permutations", "2"),
        ]

    seconds: dict[str, float] = {}
    seconds["prepare"] = (
        0.0
        if args.data
        else step(
            "1/5 prepare the bundled data (score, noul, choice and span tasks; one task held out)",
            ["prepare", "recipes/data/demo.yaml", "--out", str(data)],
        )
    )
    seconds["prepare"] += step(
        "1/5 prepare it again with every score row, for dev and test sets large enough to judge the score task's "
        "calibration (the split hashes each state, so a training state is never a dev or test state)",
        ["prepare", "recipes/data/demo.yaml", "--out", str(evaluation), f"cap_per_task.{SCORE_TASK}={EVAL_CAP}"],
    )
    leaked = shared_states(data / "train.jsonl", [evaluation / name for name in ("dev.jsonl", "test.jsonl")])
    if leaked:
        sys.exit(
            f"demo: {leaked} dev or test states of {evaluation} are training states of {data}: give --data a "
            "prepare of recipes/data/demo.yaml"
        )
    print(f"    0 of the evaluation's dev and test states are in {data / 'train.jsonl'}", flush=True)
    seconds["train"] = (
        0.0
        if args.trained
        else step(
            f"2/5 train a LoRA adapter on {args.model}",
            [
                "train",
                "recipes/train/demo.yaml",
                "--model",
                args.model,
                "--data",
                str(data),
                "--out",
                str(run),
                *args.overrides,
            ],
        )
    )
    seconds |= {
        "calibrate": step(
            "3/5 fit temperatures on dev",
            [
                "calibrate",
                "--model",
                args.model,
                "--adapter",
                str(run / "adapter"),
                "--data",
                str(evaluation / "dev.jsonl"),
                "--out",
                str(temps),
                "--min-rows",
                "20",
                *GUARANTEES,
            ],
        ),
        "evaluate_test": step(
            "4/5 evaluate base, tuned and tuned + calibrated on the trained tasks' test split",
            evaluate_args("test.jsonl", "eval_test"),
        ),
        "evaluate_heldout": step(
            "5/5 evaluate on the held-out task (never trained on)", evaluate_args("heldout_tasks.jsonl", "eval_heldout")
        ),
    }
    test = json.loads((out / "eval_test" / "report.json").read_text())
    heldout = json.loads((out / "eval_heldout" / "report.json").read_text())
    summary = {
        **blocks(test),
        "heldout": blocks(heldout),
        "by_task": test["by_task"],
        "span": {name: block["spans"] for name, block in span_sides(test).items()},
        "score": {name: {**pick(block), "ordinal": block["ordinal"]} for name, block in score_sides(test).items()},
        "guarantees": test.get("guarantees"),
        "temperatures": {t: v["temperature"] for t, v in json.loads(temps.read_text())["types"].items()},
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "total_seconds": round(time.perf_counter() - started, 1),
    }
    atomic_write_json(out / "summary.json", summary)
    spans, scores = span_table(test), score_table(test)
    spans_note = "a span is found when its label and both character offsets match; overlap: any shared character"
    if test["baselines"].get("base_model", {}).get("span_read") == "letters":
        spans_note += "; the base model reads spans with the answer letters, the span head comes with the adapter"
    text = (
        f"Test split of the trained tasks ({summary['tuned']['n']} questions):\n\n"
        f"{table({k: summary[k] for k in ('base', 'tuned', 'tuned_calibrated', 'majority')})}\n\n"
        f"{by_task_table(test)}\n\n"
        "Calibration by question type: temperatures fitted on dev, T = 1 → calibrated on dev and on the test split "
        "(in brackets: the ECE a perfectly calibrated model reaches on that many questions, 90th percentile):\n\n"
        f"{calibration_table(json.loads(temps.read_text()), test)}\n\n"
        + (
            f"Score questions of the test split (levels counted 0 … K−1; MAE of the expected level; threshold ECE: the "
            f"ECE of every P(level ≥ k), averaged over k):\n\n{scores}\n\n"
            if scores
            else ""
        )
        + (f"Span questions of the test split (span-level match, {spans_note}):\n\n{spans}\n\n" if spans else "")
        + (
            "Guarantees on the test split (answer sets and auto-act fitted on dev, docs/guarantees.md):\n\n"
            + "\n".join(guarantees_markdown(test)[4:])
            + "\n"
            if test.get("guarantees")
            else ""
        )
        + f"Held-out task (never trained on, {summary['heldout']['tuned']['n']} questions):\n\n"
        f"{table(summary['heldout'])}\n"
    )
    atomic_write_text(out / "summary.md", text)
    print("\n" + text)
    print(f"wrote {out / 'summary.json'}, {out / 'summary.md'}, plots in {out / 'eval_test' / 'reliability.png'}")
    print(f"total {summary['total_seconds']:.0f}s")


if __name__ == "__main__":
    main()
