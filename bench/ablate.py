"""Ablation sweep: short trainings that vary one setting at a time around a base recipe.

Each ``KEY=V1,V2,...`` argument adds one row per value (the base recipe with only that key changed), so the table
shows what each setting does on its own. Every row trains from scratch on the same data and reports the final dev
metrics (accuracy, log loss, ECE, flip rate, top-letter share), the best dev accuracy seen, and the wall time.

    .venv/bin/python bench/ablate.py --recipe recipes/train/demo.yaml --data runs/demo/data \
        objective.kind=proper,rlcd,ce optim.lr=3e-4,3e-3 shuffle_options=false

Writes ``--out`` (default runs/ablate)/ablation.json and ablation.md; each run's own directory is kept beside them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from _common import ROOT

COLUMNS = ("accuracy", "best_accuracy", "log_loss", "ece", "flip_rate", "top_letter_share", "seconds")


def variants(axes: list[str]) -> list[tuple[str, list[str]]]:
    rows: list[tuple[str, list[str]]] = [("base recipe", [])]
    for axis in axes:
        key, _, values = axis.partition("=")
        if not values:
            raise SystemExit(f"ablate: {axis!r} must look like KEY=V1,V2")
        for value in values.split(","):
            rows.append((f"{key}={value}", [f"{key}={value}"]))
    return rows


def run_one(recipe_path: Path, data: Path, out: Path, overrides: list[str]) -> dict[str, Any]:
    from mydecide.config import TrainRecipe
    from mydecide.recipe_loading import load_recipe
    from mydecide.training.loop import train

    recipe = load_recipe(recipe_path, [*overrides, f"data={data}", f"out={out}"], model=TrainRecipe)
    started = time.perf_counter()
    train(recipe)
    seconds = time.perf_counter() - started
    from mydecide.jsonl import iter_jsonl

    rows = []
    for where, row, error in iter_jsonl(out / "metrics.jsonl"):
        if error:
            raise SystemExit(f"ablate: {where}: {error}")
        rows.append(row)
    dev = [r for r in rows if r["kind"] == "dev"]
    last = dev[-1]
    return {
        "accuracy": last["accuracy"],
        "best_accuracy": max(r["accuracy"] for r in dev),
        "log_loss": last["log_loss"],
        "ece": last["ece"],
        "flip_rate": last["flip_rate"],
        "top_letter_share": last["top_letter_share"],
        "majority_accuracy": last["majority_accuracy"],
        "base_accuracy": dev[0]["accuracy"],
        "base_log_loss": dev[0]["log_loss"],
        "base_flip_rate": dev[0]["flip_rate"],
        "warnings": last["warnings"],
        "seconds": seconds,
        "updates": last["update"],
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| variant | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for row in rows:
        cells = [f"{row[c]:.3f}" if isinstance(row.get(c), float) else str(row.get(c, "—")) for c in COLUMNS]
        lines.append(f"| {row['variant']} | " + " | ".join(cells) + " |")
    first = rows[0]
    lines += [
        "",
        f"untuned base on the same dev set: accuracy {first['base_accuracy']:.3f}, log loss "
        f"{first['base_log_loss']:.3f}, flip rate {first['base_flip_rate']:.3f}; majority-class accuracy "
        f"{first['majority_accuracy']:.3f}",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "train" / "demo.yaml")
    parser.add_argument("--data", type=Path, required=True, help="A `mydecide prepare` output directory.")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "ablate")
    parser.add_argument("--set", action="append", default=[], help="An override applied to every row.")
    parser.add_argument("axes", nargs="*", help="KEY=V1,V2,... (one row per value, others at the base recipe)")
    args = parser.parse_args()
    from mydecide.io import atomic_write_json, atomic_write_text

    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "ablation.json"
    done = {r["variant"]: r for r in json.loads(results_path.read_text())} if results_path.exists() else {}
    rows = []
    for name, overrides in variants(args.axes):
        if name in done:  # re-running the sweep skips finished rows
            rows.append(done[name])
            continue
        run_dir = args.out / name.replace("=", "_").replace(" ", "_").replace("/", "_")
        print(f"\n=== {name} ===", file=sys.stderr, flush=True)
        import shutil

        shutil.rmtree(run_dir, ignore_errors=True)
        result = {
            "variant": name,
            "overrides": [*args.set, *overrides],
            **run_one(args.recipe, args.data, run_dir, [*args.set, *overrides]),
        }
        rows.append(result)
        atomic_write_json(results_path, rows)
        atomic_write_text(args.out / "ablation.md", markdown(rows))
        print(markdown(rows), flush=True)
    atomic_write_json(results_path, rows)
    atomic_write_text(args.out / "ablation.md", markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main()
