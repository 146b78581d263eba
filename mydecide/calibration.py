"""Temperature scaling (SPEC §6).

The pure part, at the top: ``fit_temperature`` finds the one temperature T that minimises the mean log
loss of softmax(z / T) over a set of rows, and ``apply_temperature`` turns logits into calibrated
probabilities. Dividing all logits of a row by the same T > 0 never changes which option is largest, so
calibration changes confidence, never the answer.

Rows are 1-D numpy arrays of option logits, each row its own number of options K; targets are the
matching target distributions (one-hot for hard labels).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

LOG_T_BOUNDS = (-4.0, 4.0)
"""Search interval of log T: T from e^-4 ≈ 0.018 to e^4 ≈ 54.6."""


def _padded(logits: Sequence[np.ndarray], targets: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Stack variable-K rows into (N, K_max) arrays: logits padded with -inf, targets with 0."""
    if len(logits) != len(targets):
        raise ValueError(f"{len(logits)} logit rows but {len(targets)} target rows")
    if len(logits) == 0:
        raise ValueError("cannot fit a temperature on zero rows")
    k_max = max(len(z) for z in logits)
    z_pad = np.full((len(logits), k_max), -np.inf)
    y_pad = np.zeros((len(logits), k_max))
    for i, (z, y) in enumerate(zip(logits, targets, strict=True)):
        z, y = np.asarray(z, dtype=float), np.asarray(y, dtype=float)
        if z.ndim != 1 or z.shape != y.shape or z.size == 0:
            raise ValueError(f"row {i}: logits shape {z.shape} and target shape {y.shape} must be equal, 1-D")
        if not np.all(np.isfinite(z)):
            raise ValueError(f"row {i}: logits must be finite")
        z_pad[i, : len(z)] = z
        y_pad[i, : len(y)] = y
    return z_pad, y_pad


def _mean_log_loss(z_pad: np.ndarray, y_pad: np.ndarray, temperature: float) -> float:
    """Mean −Σ y log softmax(z / T) over padded rows (padding: z = -inf, y = 0)."""
    from scipy.special import log_softmax

    log_q = log_softmax(z_pad / temperature, axis=1)  # (N, K_max), -inf at padding
    terms = np.where(y_pad > 0, y_pad * np.where(np.isfinite(log_q), log_q, 0.0), 0.0)
    return float(-terms.sum(axis=1).mean())


def fit_temperature(logits: Sequence[np.ndarray], targets: Sequence[np.ndarray]) -> float:
    """The temperature T minimising the mean log loss of softmax(z / T) on these rows.

    A bounded scalar minimisation over log T in ``LOG_T_BOUNDS`` (the log loss is smooth and unimodal in
    log T, and searching in log space treats T and 1/T symmetrically). Data that is perfectly separable
    pushes T to the lower bound. Raises ValueError on empty or malformed input.
    """
    from scipy.optimize import minimize_scalar

    z_pad, y_pad = _padded(logits, targets)
    result = minimize_scalar(
        lambda log_t: _mean_log_loss(z_pad, y_pad, math.exp(log_t)),
        bounds=LOG_T_BOUNDS,
        method="bounded",
        options={"xatol": 1e-6},
    )
    return float(math.exp(result.x))


def apply_temperature(
    logits: Sequence[np.ndarray] | np.ndarray, temperature: float
) -> list[np.ndarray] | np.ndarray:
    """softmax(z / T) per row.

    A list of 1-D rows (any K each) gives a list of probability rows; a numpy array gives an array of the
    same shape, with the softmax over its last axis.
    """
    from scipy.special import softmax

    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
    if isinstance(logits, np.ndarray):
        return softmax(logits / temperature, axis=-1)
    return [softmax(np.asarray(z, dtype=float) / temperature) for z in logits]
