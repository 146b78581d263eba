"""evaluate shows the training run's per-task dev curves when the adapter lives in a run directory."""

from __future__ import annotations

import json
from pathlib import Path

from mydecide.evaluation.curves import curves_markdown, training_curves


def write_run(run: Path) -> Path:
    (run / "adapter").mkdir(parents=True)
    dev = [
        {
            "kind": "dev",
            "update": 0,
            "log_loss": 1.1,
            "kept": True,
            "tasks": {"team": {"log_loss": 1.2, "accuracy": 0.3}},
        },
        {"kind": "train", "update": 1, "loss": 0.9},
        {
            "kind": "dev",
            "update": 10,
            "log_loss": 0.8,
            "kept": True,
            "tasks": {"team": {"log_loss": 0.7, "accuracy": 0.6}, "pii": {"log_loss": 0.9, "accuracy": None}},
        },
    ]
    lines = [json.dumps(row) for row in dev] + ['{"kind": "dev", "upd']  # a half-written last line: skipped
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run / "adapter"


def test_the_curves_are_the_runs_dev_lines_by_task(tmp_path: Path) -> None:
    adapter = write_run(tmp_path / "run")
    curves = training_curves(str(adapter))
    assert curves == {
        "run": str(tmp_path / "run"),
        "updates": [0, 10],
        "kept": [0, 10],
        "log_loss": [1.1, 0.8],
        "tasks": {
            "pii": {"log_loss": [None, 0.9], "accuracy": [None, None]},
            "team": {"log_loss": [1.2, 0.7], "accuracy": [0.3, 0.6]},
        },
    }
    lines = curves_markdown({"training": curves})
    assert "| update | all: log loss | pii | team |" in lines
    assert "| 0* | 1.100 | - / - | 1.200 / 0.300 |" in lines
    assert "| 10* | 0.800 | 0.900 / - | 0.700 / 0.600 |" in lines
    assert "![dev curves by task](dev_curves.png)" in lines


def test_an_adapter_outside_a_run_directory_has_no_curves(tmp_path: Path) -> None:
    (tmp_path / "adapter").mkdir()
    assert training_curves(str(tmp_path / "adapter")) is None
    assert training_curves(None) is None
    assert curves_markdown({}) == []
