"""The training run's dev curves in the report: when the evaluated adapter lives in a run directory (``RUN/adapter``
or ``RUN/last``, beside ``RUN/metrics.jsonl``), evaluate reads the dev lines train wrote there and shows each task's
dev log loss and accuracy by update, as a table in report.md and as ``dev_curves.png``.

Nothing is recomputed: the numbers are train's own (training/dev.py ``task_metrics``), on the dev records train
evaluated (its ``dev_limit`` applies).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

CURVES_PLOT = "dev_curves.png"


def training_curves(adapter: str | None) -> dict[str, Any] | None:
    """The dev curves of the run ``adapter`` was trained in: ``run``, ``updates``, ``kept`` (the updates whose
    adapter became RUN/adapter when evaluated), ``log_loss`` (all tasks pooled) and ``tasks`` (per task: its
    ``log_loss`` and ``accuracy`` at each update, None where a line lacks it). None when the adapter is not in a run
    directory or the run has no dev line."""
    if adapter is None:
        return None
    path = Path(adapter).parent / "metrics.jsonl"
    if not path.is_file():
        return None
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line a killed run left half-written
        if isinstance(row, dict) and row.get("kind") == "dev" and isinstance(row.get("update"), int):
            rows.append(row)
    if not rows:
        return None
    names = sorted({task for row in rows for task in (row.get("tasks") or {})})

    def at(row: dict[str, Any], task: str, key: str) -> float | None:
        value = (row.get("tasks") or {}).get(task, {}).get(key)
        return float(value) if isinstance(value, (int, float)) else None

    return {
        "run": str(path.parent),
        "updates": [row["update"] for row in rows],
        "kept": [row["update"] for row in rows if row.get("kept") is True],
        "log_loss": [row.get("log_loss") for row in rows],
        "tasks": {
            task: {key: [at(row, task, key) for row in rows] for key in ("log_loss", "accuracy")} for task in names
        },
    }


def curves_markdown(report: dict[str, Any]) -> list[str]:
    """report.md's "Training" section: the dev log loss (and accuracy) of each task at each dev evaluation."""
    curves = report.get("training")
    if not curves:
        return []

    def fmt(value: float | None) -> str:
        return "-" if value is None or not math.isfinite(value) else f"{value:.3f}"

    tasks = curves["tasks"]
    lines = [
        "## Training: dev metrics by update",
        "",
        f"From {curves['run']}/metrics.jsonl (train's dev evaluations; * = the adapter kept then). Each task: dev log "
        "loss / accuracy.",
        "",
        "| update | all: log loss | " + " | ".join(tasks) + " |",
        "|---" * (2 + len(tasks)) + "|",
    ]
    for i, update in enumerate(curves["updates"]):
        mark = "*" if update in curves["kept"] else ""
        cells = [f"{fmt(t['log_loss'][i])} / {fmt(t['accuracy'][i])}" for t in tasks.values()]
        lines.append(f"| {update}{mark} | {fmt(curves['log_loss'][i])} | " + " | ".join(cells) + " |")
    return [*lines, "", f"![dev curves by task]({CURVES_PLOT})", ""]


def plot_curves(curves: dict[str, Any], path: str | Path) -> None:
    """dev_curves.png: dev log loss (left) and accuracy (right) against the update, one line per task (and all tasks
    pooled, dashed). Written atomically."""

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mydecide.io import atomic_write_figure

    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(10, 4))
    updates = curves["updates"]
    loss_ax.plot(updates, curves["log_loss"], "k--", marker="o", label="all tasks")
    for task, values in curves["tasks"].items():
        loss_ax.plot(updates, values["log_loss"], marker="o", label=task)
        acc_ax.plot(updates, values["accuracy"], marker="o", label=task)
    for ax, name in ((loss_ax, "dev log loss"), (acc_ax, "dev accuracy")):
        ax.set_xlabel("update")
        ax.set_ylabel(name)
        ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_write_figure(path, fig)
