"""The scoring layer's last step: logits → probabilities, the one place a temperature is applied.

A question's logits come from :mod:`mydecide.scoring.plan` in its canonical option order: choice / noul / score
give K logits whose softmax is the answer; a set question gives one yes − no logit per label, whose sigmoid is
P(label applies). :func:`to_probabilities` is the only softmax of the package, :func:`calibrated_probabilities` the
one place calibration (a temperature, a score question's level map) is applied; :func:`answer_rows` the only place
a set question becomes binary rows (for metrics, temperature fits and the training's dev metrics);
:func:`build_answer` the wire answer made from a question's probabilities (``mydecide serve``, ``evaluate
--coherence``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mydecide.records import Question

TemperatureLookup = Callable[[str, int], float]
"""The temperature of a (question type, option count K); ``calibration.TemperatureTable`` is one."""


def softmax(logits: np.ndarray | Sequence[float], temperature: float = 1.0) -> np.ndarray:
    """softmax(z / T) over the last axis (a row, or (N, K) rows at once; −inf logits get probability 0)."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def log_softmax(logits: np.ndarray | Sequence[float]) -> np.ndarray:
    """log softmax(z) over the last axis (a row, or (N, K) rows at once), computed without overflow."""
    z = np.asarray(logits, dtype=np.float64)
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def to_probabilities(question_type: str, logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """softmax(z / T) over the options; ``set`` → independent sigmoid(z / T) per label; ``span`` → per cell of its
    word × label grid."""
    if question_type in ("set", "span"):
        z = np.asarray(logits, dtype=np.float64) / temperature
        return np.exp(-np.logaddexp(0.0, -z))  # sigmoid without overflow for large |z / T|
    return softmax(logits, temperature)


def calibrated_probabilities(
    question_type: str, k: int, logits: np.ndarray, temperature: TemperatureLookup | None
) -> np.ndarray:
    """A question's answer probabilities as calibrate fitted them: :func:`to_probabilities` at its temperature, and a
    score question of K levels through the level map the lookup holds for that K (``calibration.level_maps``:
    ``TemperatureTable.level_maps``), where it has one. No lookup: T = 1."""
    if temperature is None:
        return to_probabilities(question_type, logits)
    t = temperature(question_type, k)
    level_map = level_map_of(question_type, k, temperature)
    if level_map is not None:
        return np.asarray(level_map.probabilities(logits, t))
    return to_probabilities(question_type, logits, t)


def level_map_of(question_type: str, k: int, temperature: TemperatureLookup | None) -> Any:
    """The level map a score question of K levels goes through after its temperature (a
    ``calibration.level_maps.LevelMap`` the lookup holds for that K), or None: other types, other K, plain lookups."""
    if question_type != "score" or temperature is None:
        return None
    return getattr(temperature, "level_maps", {}).get(k)


def answer_rows(
    question_type: str,
    values: np.ndarray | Sequence[float],
    target: np.ndarray | Sequence[float],
    *,
    logits: bool = False,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (prediction, target) rows one question counts as: itself, or one binary row per label of a set.

    A set label's row is (p, 1 − p) against (y, 1 − y); with ``logits`` its yes − no logit d becomes (d, 0), since
    softmax((d, 0) / T) = (sigmoid(d / T), 1 − sigmoid(d / T)): a temperature fit sees every type as softmax rows.
    """
    v = np.asarray(values, dtype=np.float64)
    y = np.asarray(target, dtype=np.float64)
    if v.shape != y.shape:
        raise ValueError(f"{question_type} question: {v.shape[0]} values for {y.shape[0]} target entries")
    if question_type not in ("set", "span"):  # a span question: one binary row per word × label cell
        return [(v, y)]
    second = (lambda _: 0.0) if logits else (lambda p: 1.0 - p)
    return [(np.array([d, second(d)]), np.array([t, 1.0 - t])) for d, t in zip(v, y, strict=True)]


def jev_confidence(p_max: float, k: int) -> float:
    """Jev's confidence: (K·p_max − 1)/(K − 1), 0 at the uniform distribution and 1 at certainty."""
    return (k * p_max - 1.0) / (k - 1.0)


def build_answer(question: Question, probs: np.ndarray) -> dict[str, Any]:
    """The Jev answer object for one question from its probabilities (canonical option order)."""
    p = [float(x) for x in probs]
    if question.type == "noul":
        return {"type": "noul", "noul": p[0]}
    if question.type == "set":
        probabilities = dict(zip(question.options, p, strict=True))
        return {
            "type": "set",
            "probabilities": probabilities,
            "selected": [label for label, v in probabilities.items() if v >= 0.5],
        }
    best = max(range(len(p)), key=p.__getitem__)
    confidence = jev_confidence(p[best], len(p))
    if question.type == "score":
        return {
            "type": "score",
            "score": sum(i * v for i, v in enumerate(p)),
            "confidence": confidence,
            "probabilities": {str(i): v for i, v in enumerate(p)},
            "legend": {str(i): d for i, d in enumerate(question.descriptions)},
        }
    return {
        "type": "choice",
        "choice": question.options[best],
        "confidence": confidence,
        "probabilities": dict(zip(question.options, p, strict=True)),
    }
