"""Experiment trackers (TensorBoard, wandb, MLflow) through Accelerate: which to start, and what they are given.

The run's own record is ``metrics.jsonl``; trackers get the same numbers as ``section/name`` scalars and the recipe as
flat hyperparameters.
"""

from __future__ import annotations

import json
from typing import Any

from mydecide.config import TrainRecipe
from mydecide.errors import UserError

TRACKER_PACKAGES = {"tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",), "mlflow": ("mlflow",)}


def check_trackers(report_to: list[Any]) -> list[str]:
    """The trackers to start; one whose package is missing is an error (Accelerate would skip it silently)."""
    import importlib.util

    wanted = [t for t in report_to if t != "none"]
    for tracker in wanted:
        packages = TRACKER_PACKAGES[tracker]
        if not any(importlib.util.find_spec(p) for p in packages):
            raise UserError(
                f"report_to: {tracker} needs the {packages[0]} package, which is not installed "
                f"(pip install {packages[0]}), or drop it from report_to"
            )
    return wanted


def tracker_config(recipe: TrainRecipe) -> dict[str, Any]:
    """The recipe as flat ``section.key`` hyperparameters (trackers take numbers, strings and booleans only)."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}{key}.", inner)
        else:
            flat[prefix[:-1]] = value if isinstance(value, (int, float, str, bool)) else json.dumps(value)

    walk("", recipe.model_dump(mode="json"))
    return flat


def tracked(section: str, row: dict[str, Any]) -> dict[str, float]:
    """The numbers of a metrics.jsonl row as ``section/name`` scalars for the trackers; a dev line's per-task
    metrics (``tasks``) as ``section/task/name``."""
    skip = {"kind", "update", "time"}

    def numbers(prefix: str, values: dict[str, Any]) -> dict[str, float]:
        return {
            f"{prefix}/{key}": float(value)
            for key, value in values.items()
            if key not in skip and isinstance(value, (int, float)) and not isinstance(value, bool)
        }

    out = numbers(section, row)
    for task, metrics in (row.get("tasks") or {}).items():
        out.update(numbers(f"{section}/{task}", metrics))
    return out
