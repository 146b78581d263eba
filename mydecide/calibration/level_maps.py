"""Level maps: a calibration map for score questions that a temperature cannot give.

A temperature divides every logit by one number: it can make a distribution sharper or flatter, never move
probability from one level to another. A score model can be wrong in a way only the latter fixes. The demo's tuned
model rarely answers the middle levels of its 5-level sentiment scale, so its calibrated ECE stays near 0.10 on 354
test questions, well above what a calibrated model shows on that many (docs/calibration.md#level-maps).

A level map, fitted per option count K on the dev score questions, takes the tempered log-probabilities of a score
question's K levels to new logits: ``p = softmax(W · log softmax(z / T) + b)``, with W a K × K matrix and b a vector
(matrix scaling on log-probabilities, the form Kull et al. call Dirichlet calibration, NeurIPS 2019). The identity W
and zero b give back the temperature's answer. Off-diagonal weights and the bias are pulled towards zero by an L2
penalty λ chosen by 5-fold cross-validation of the dev log loss, and a map is kept only where that held-out log
loss beats the temperature alone: on too few questions, or where it does not help, the score questions of that K
keep their temperature. A level means the same across the tasks that share a K only as far as their scales do, so
a map is fitted per K, like the option-count buckets of the temperatures.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mydecide.metrics import ece, log_loss, ordinal_summary
from mydecide.scoring.probabilities import log_softmax, softmax

QUESTIONS_PER_PARAMETER = 10
"""A K-level map has K² + K parameters; it is fitted only with this many dev questions per parameter (300 for K = 5)."""

PENALTIES = (1e-3, 1e-2, 1e-1, 1.0)
"""The L2 penalties cross-validation chooses among (on the off-diagonal weights and the bias)."""

FOLDS = 5


@dataclass(frozen=True)
class LevelMap:
    """``softmax(weights · log softmax(z / T) + bias)`` for score questions of K = len(bias) levels."""

    weights: np.ndarray  # (K, K)
    bias: np.ndarray  # (K,)

    @property
    def k(self) -> int:
        return len(self.bias)

    def probabilities(self, logits: np.ndarray | Sequence[float], temperature: float = 1.0) -> np.ndarray:
        """The calibrated distribution of one question's K logits (or of (N, K) rows at once)."""
        return softmax(log_softmax(np.asarray(logits, dtype=np.float64) / temperature) @ self.weights.T + self.bias)

    def to_json(self) -> dict[str, Any]:
        return {"weights": self.weights.tolist(), "bias": self.bias.tolist()}


def level_map_from_json(entry: object, key: str) -> LevelMap:
    """A map read back from temperatures.json; ValueError naming ``key`` when its shape or values are wrong."""
    if not isinstance(entry, dict) or "weights" not in entry or "bias" not in entry:
        raise ValueError(f"{key}: a level map needs 'weights' (K × K) and 'bias' (K)")
    try:
        weights = np.asarray(entry["weights"], dtype=np.float64)
        bias = np.asarray(entry["bias"], dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{key}: weights and bias must be numbers") from None
    k = bias.shape[0] if bias.ndim == 1 else 0
    if k < 2 or weights.shape != (k, k):
        raise ValueError(
            f"{key}: weights must be K × K and bias K numbers (K ≥ 2), got {weights.shape} and {bias.shape}"
        )
    if not (np.isfinite(weights).all() and np.isfinite(bias).all()):
        raise ValueError(f"{key}: weights and bias must be finite")
    return LevelMap(weights, bias)


def min_questions(k: int) -> int:
    """Dev score questions of K levels a map needs: :data:`QUESTIONS_PER_PARAMETER` per parameter."""
    return QUESTIONS_PER_PARAMETER * (k * k + k)


def _fit(x: np.ndarray, y: np.ndarray, penalty: float) -> LevelMap:
    """Minimise the mean cross-entropy of softmax(x Wᵀ + b) against ``y`` plus ``penalty`` · (‖W off the
    diagonal‖² + ‖b‖²), from the identity."""
    from scipy.optimize import minimize

    n, k = x.shape
    off = 1.0 - np.eye(k)

    def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
        w, b = theta[: k * k].reshape(k, k), theta[k * k :]
        z = x @ w.T + b
        z = z - z.max(axis=1, keepdims=True)
        log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        value = -float((y * log_p).sum()) / n + penalty * (float(((w * off) ** 2).sum()) + float(b @ b))
        g = (np.exp(log_p) * y.sum(axis=1, keepdims=True) - y) / n
        grad_w = g.T @ x + 2.0 * penalty * w * off
        grad_b = g.sum(axis=0) + 2.0 * penalty * b
        return value, np.concatenate([grad_w.ravel(), grad_b])

    start = np.concatenate([np.eye(k).ravel(), np.zeros(k)])
    theta = minimize(loss, start, jac=True, method="L-BFGS-B", options={"maxiter": 500}).x
    return LevelMap(theta[: k * k].reshape(k, k).copy(), theta[k * k :].copy())


def fit_level_map(
    logits: Sequence[np.ndarray], targets: Sequence[np.ndarray], temperature: float, *, seed: int = 0
) -> tuple[LevelMap | None, dict[str, Any]]:
    """Fit the map of one K on its dev score questions, at that K's temperature.

    Returns (map, summary); map is None (and the summary's ``fallback`` says why) when there are fewer than
    :func:`min_questions`, or when no penalty's 5-fold held-out log loss is below the temperature's. The summary has
    the chosen penalty, both cross-validated log losses and the question count.
    """
    x = log_softmax(np.asarray(np.stack(logits), dtype=np.float64) / temperature)
    y = np.asarray(np.stack(targets), dtype=np.float64)
    n, k = x.shape
    summary: dict[str, Any] = {"n": n, "k": k, "min_questions": min_questions(k)}
    if n < min_questions(k):
        return None, summary | {"fallback": f"{n} dev questions of {k} levels, fewer than {min_questions(k)}"}
    folds = np.array_split(np.random.default_rng(seed).permutation(n), FOLDS)
    held_out = {"temperature": log_loss(list(softmax(x)), list(y))}  # the identity map: the temperature alone
    for penalty in PENALTIES:
        total = 0.0
        for i, fold in enumerate(folds):
            rest = np.concatenate([f for j, f in enumerate(folds) if j != i])
            fitted = _fit(x[rest], y[rest], penalty)
            total += log_loss(list(softmax(x[fold] @ fitted.weights.T + fitted.bias)), list(y[fold])) * len(fold)
        held_out[str(penalty)] = total / n
    best = min(PENALTIES, key=lambda lam: held_out[str(lam)])
    summary |= {"penalty": best, "cv_log_loss_temperature": held_out["temperature"], "cv_log_loss": held_out}
    if not held_out[str(best)] < held_out["temperature"]:
        return None, summary | {"fallback": "no penalty's held-out log loss beats the temperature alone"}
    summary["cv_log_loss_map"] = held_out[str(best)]
    fitted = _fit(x, y, best)
    if not (np.isfinite(fitted.weights).all() and np.isfinite(fitted.bias).all()):  # pragma: no cover - defensive
        return None, summary | {"fallback": "the fit did not converge"}
    return fitted, summary


def fit_level_maps(
    items: Sequence[tuple[str, int, np.ndarray, Sequence[float]]], temperature: Callable[[str, int], float]
) -> tuple[dict[int, LevelMap], dict[str, dict[str, Any]]]:
    """The maps kept, by K, and the ``level_maps`` block of temperatures.json: per K of the dev score questions among
    ``items`` ((type, K, logits, target) per question), its fitted map with its summary, or the summary alone with a
    ``fallback``. The summary of a fitted map adds the dev ECE and threshold ECE at the temperature alone and through
    the map (on the questions it was fitted on: the held-out log losses are the honest comparison)."""
    by_k: dict[int, list[tuple[np.ndarray, Sequence[float]]]] = {}
    for qtype, k, z, y in items:
        if qtype == "score":
            by_k.setdefault(k, []).append((np.asarray(z, dtype=np.float64), y))
    kept: dict[int, LevelMap] = {}
    block: dict[str, dict[str, Any]] = {}
    for k in sorted(by_k):
        logits, targets = [z for z, _ in by_k[k]], [np.asarray(y, dtype=np.float64) for _, y in by_k[k]]
        t = temperature("score", k)
        fitted, summary = fit_level_map(logits, targets, t)
        summary["temperature"] = t
        if fitted is not None:
            before = list(softmax(np.stack(logits), t))
            after = list(fitted.probabilities(np.stack(logits), t))
            summary |= {
                "ece_before": ece(before, targets),
                "ece_after": ece(after, targets),
                "threshold_ece_before": ordinal_summary(before, targets)["threshold_ece"],
                "threshold_ece_after": ordinal_summary(after, targets)["threshold_ece"],
            }
            summary = fitted.to_json() | summary
            kept[k] = fitted
        block[str(k)] = summary
    return kept, block


def describe(summary: dict[str, Any]) -> str:
    """One line for calibrate's report."""
    k = summary["k"]
    if "fallback" in summary:
        return f"score K={k}: no level map ({summary['fallback']}): the temperature alone"
    return (
        f"score K={k}: level map on {summary['n']} dev questions (penalty {summary['penalty']:g}); held-out log loss "
        f"{summary['cv_log_loss_temperature']:.4f} with the temperature alone → {summary['cv_log_loss_map']:.4f}"
        + (
            f"; dev ECE {summary['ece_before']:.4f} → {summary['ece_after']:.4f}, threshold ECE "
            f"{summary['threshold_ece_before']:.4f} → {summary['threshold_ece_after']:.4f}"
            if "ece_after" in summary and not math.isnan(summary["ece_after"])
            else ""
        )
    )
