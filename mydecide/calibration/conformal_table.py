"""The ``conformal`` section of temperatures.json, read back and checked, and what it answers: a question's set and
whether to act on it (``calibrate --alpha`` / ``--max-risk`` write it: :mod:`~mydecide.calibration.conformal_fit`).

A set is a boolean mask over the question's options in canonical order (a set question: one mask over (yes, no) per
label); ``act`` is "auto" when the answer's confidence reaches the risk-controlled threshold, else "escalate".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mydecide.calibration.conformal import SCORES, prediction_sets
from mydecide.errors import UserError

SET_TYPES = {"choice": SCORES["choice"], "noul": SCORES["binary"], "score": SCORES["score"], "set": SCORES["binary"]}
"""The question types that get conformal sets, with the scores each may use (span questions: a threshold per label)."""
ACT_TYPES = ("choice", "noul", "score", "set")


@dataclass(frozen=True)
class SetRule:
    """Sets of score function ``score`` at threshold q̂ (``threshold``), fitted for ``alpha`` on ``n`` dev rows."""

    score: str
    threshold: float
    alpha: float
    n: int


@dataclass(frozen=True)
class ActRule:
    """Auto-act at confidence ≥ ``threshold`` (None: never), fitted for error rate ``max_risk`` at ``delta``."""

    threshold: float | None
    max_risk: float
    delta: float
    n: int


@dataclass(frozen=True)
class SpanRule:
    """Word thresholds bounding the rate of missed gold spans at ``alpha``: per label, ``default`` for any other."""

    thresholds: tuple[tuple[str, float], ...]
    default: float | None
    alpha: float
    n: int

    def threshold(self, label: str) -> float | None:
        return dict(self.thresholds).get(label, self.default)


@dataclass(frozen=True)
class ConformalTable:
    """Sets and auto-act rules by question type (what serve and predict answer with: a request names no task) and by
    task (what evaluate also reports), the span rule, and the tasks dev held (the guarantee's population)."""

    sets: dict[str, SetRule] = field(default_factory=dict)
    task_sets: dict[str, SetRule] = field(default_factory=dict)
    acts: dict[str, ActRule] = field(default_factory=dict)
    task_acts: dict[str, ActRule] = field(default_factory=dict)
    span: SpanRule | None = None
    dev_tasks: tuple[str, ...] = ()


def answer_set(qtype: str, probs: np.ndarray, rule: SetRule) -> np.ndarray:
    """The set of one question as a mask over its options; a set question: (labels, 2) masks over (yes, no)."""
    p = np.asarray(probs, dtype=np.float64)
    if qtype == "set":
        return np.array(prediction_sets(rule.score, [np.array([v, 1.0 - v]) for v in p], rule.threshold))
    return prediction_sets(rule.score, [p], rule.threshold)[0]


def confidence(qtype: str, probs: np.ndarray) -> float:
    """What auto-act thresholds: the top probability; a set question's least certain label's max(p, 1 − p)."""
    p = np.asarray(probs, dtype=np.float64)
    if qtype == "set":
        return float(np.min(np.maximum(p, 1.0 - p))) if len(p) else 1.0
    return float(np.max(p))


def act(qtype: str, probs: np.ndarray, rule: ActRule) -> str:
    """ "auto" when the answer's :func:`confidence` reaches the rule's threshold, else "escalate"."""
    return "auto" if rule.threshold is not None and confidence(qtype, probs) >= rule.threshold else "escalate"


def wire_set(qtype: str, options: Sequence[str], mask: np.ndarray) -> Any:
    """A set as the wire carries it: choice option ids; noul "yes" / "no"; score {"low", "high"} level indices; set
    label → its "yes" / "no" set."""
    if qtype == "score":
        inside = np.flatnonzero(mask)
        return {"low": int(inside.min()), "high": int(inside.max())}
    if qtype == "set":
        return {
            label: [v for v, m in zip(("yes", "no"), row, strict=True) if m]
            for label, row in zip(options, mask, strict=True)
        }
    return [option for option, m in zip(options, mask, strict=True) if m]


# -------------------------------------------------------------------------------------------- the JSON, checked


def _number(value: Any, key: str, low: float, high: float, *, closed: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{key}: {value!r} is not a finite number")
    if not (low <= value <= high if closed else low < value < high):
        interval = f"[{low:g}, {high:g}]" if closed else f"({low:g}, {high:g})"
        raise ValueError(f"{key}: {value!r} is outside {interval}")
    return float(value)


def _count(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key}: {value!r} is not a count of dev rows (an integer ≥ 1)")
    return value


def _object(value: Any, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{key}: must be an object")
    return value


def _set_rule(entry: Any, key: str, qtype: str) -> SetRule:
    entry = _object(entry, key)
    if qtype not in SET_TYPES:
        raise ValueError(f"{key}: {qtype!r} questions get no conformal set (types: {', '.join(SET_TYPES)})")
    if entry.get("score") not in SET_TYPES[qtype]:
        scores = ", ".join(SET_TYPES[qtype])
        raise ValueError(f"{key}.score: {entry.get('score')!r} is not a score for {qtype} questions ({scores})")
    return SetRule(
        entry["score"],
        _number(entry.get("threshold"), f"{key}.threshold", -math.inf, math.inf),
        _number(entry.get("alpha"), f"{key}.alpha", 0.0, 1.0),
        _count(entry.get("n"), f"{key}.n"),
    )


def _act_rule(entry: Any, key: str) -> ActRule:
    entry = _object(entry, key)
    threshold = entry.get("threshold")
    return ActRule(
        None if threshold is None else _number(threshold, f"{key}.threshold", 0.0, 1.0, closed=True),
        _number(entry.get("max_risk"), f"{key}.max_risk", 0.0, 1.0),
        _number(entry.get("delta"), f"{key}.delta", 0.0, 1.0),
        _count(entry.get("n"), f"{key}.n"),
    )


def _span_rule(entry: Any, key: str) -> SpanRule:
    entry = _object(entry, key)
    labels = _object(entry.get("thresholds", {}), f"{key}.thresholds")
    default = entry.get("default_threshold")
    return SpanRule(
        tuple(
            sorted(
                (
                    str(k),
                    _number(
                        _object(v, f"{key}.thresholds.{k}").get("threshold"),
                        f"{key}.thresholds.{k}.threshold",
                        0.0,
                        1.0,
                    ),
                )
                for k, v in labels.items()
            )
        ),
        None if default is None else _number(default, f"{key}.default_threshold", 0.0, 1.0),
        _number(entry.get("alpha"), f"{key}.alpha", 0.0, 1.0),
        _count(entry.get("n"), f"{key}.n"),
    )


def conformal_section(document: dict[str, Any], path: Any) -> ConformalTable | None:
    """:func:`conformal_from_json` of a temperatures document's ``conformal`` key; a bad value is a one-line
    ``UserError`` naming the file and the key."""
    try:
        return conformal_from_json(document.get("conformal"))
    except ValueError as err:
        raise UserError(f"{path}: {err}") from None


def conformal_from_json(data: Any, where: str = "conformal") -> ConformalTable | None:
    """The ``conformal`` section read back (None when the file has none); a bad value is a ``ValueError`` naming its
    key: α, max_risk and δ in (0, 1), counts ≥ 1, a score function of the question type, finite thresholds."""
    if data is None:
        return None
    data = _object(data, where)
    known = {"alpha", "max_risk", "delta", "dev_tasks", "sets", "task_sets", "spans", "auto_act", "task_auto_act"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}")
    tasks = data.get("dev_tasks", [])
    if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
        raise ValueError(f"{where}.dev_tasks: must be a list of task names")
    sets = {t: _set_rule(e, f"{where}.sets.{t}", t) for t, e in _object(data.get("sets", {}), f"{where}.sets").items()}
    task_sets = {}
    for task, entry in _object(data.get("task_sets", {}), f"{where}.task_sets").items():
        task_sets[task] = _set_rule(entry, f"{where}.task_sets.{task}", _object(entry, task).get("type", ""))
    acts = {}
    for qtype, entry in _object(data.get("auto_act", {}), f"{where}.auto_act").items():
        if qtype not in ACT_TYPES:
            raise ValueError(f"{where}.auto_act.{qtype}: not a question type auto-act decides ({', '.join(ACT_TYPES)})")
        acts[qtype] = _act_rule(entry, f"{where}.auto_act.{qtype}")
    task_acts = {
        task: _act_rule(entry, f"{where}.task_auto_act.{task}")
        for task, entry in _object(data.get("task_auto_act", {}), f"{where}.task_auto_act").items()
    }
    span = None if data.get("spans") is None else _span_rule(data["spans"], f"{where}.spans")
    return ConformalTable(sets, task_sets, acts, task_acts, span, tuple(tasks))
