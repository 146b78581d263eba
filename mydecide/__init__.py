"""mydecide: train, calibrate, evaluate and serve your own decision model.

The Python API (docs/python-api.md): ``mydecide.prepare``, ``train``, ``calibrate``, ``evaluate`` and
``DecisionModel``, with their typed results. They live in :mod:`mydecide.api` and load on first use, so importing
the package (and ``mydecide --help``) loads no model library.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

API = (
    "prepare",
    "train",
    "calibrate",
    "evaluate",
    "DecisionModel",
    "Prediction",
    "Prepared",
    "Trained",
    "Calibrated",
    "Evaluated",
    "Answer",
    "ChoiceAnswer",
    "NoulAnswer",
    "ScoreAnswer",
    "SetAnswer",
    "SpanAnswer",
    "FoundSpan",
)


def __getattr__(name: str) -> Any:
    """The API's names, from :mod:`mydecide.api` on first use (it sits at the top of the import layers, so the
    package, at the bottom, names it by string)."""
    if name in API:
        return getattr(importlib.import_module("mydecide.api"), name)
    raise AttributeError(f"module 'mydecide' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *API])
