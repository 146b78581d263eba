"""Temperature scaling: recovering a known temperature, argmax invariance, input errors."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import softmax

from mydecide.calibration.temperatures import apply_temperature, fit_temperature


def _logit_rows(rng: np.random.Generator, n: int, scale: float = 4.0) -> list[np.ndarray]:
    """n rows of option logits with K drawn from 2 to 6."""
    return [rng.normal(0.0, scale, size=int(rng.integers(2, 7))) for _ in range(n)]


def test_fit_recovers_the_temperature_of_sampled_labels() -> None:
    # Labels drawn from softmax(z / 2.5), 20000 rows for each K in 2..6: the fitted T lands within 2% of
    # 2.5. Across seeds the estimate spreads by about 0.3% here, so 2% is several standard errors (with
    # 4000 rows the spread is about 2%, and a fixed-seed pass would be luck).
    rng = np.random.default_rng(0)
    true_t = 2.5
    logits: list[np.ndarray] = []
    targets: list[np.ndarray] = []
    for k in range(2, 7):
        z = rng.normal(0.0, 4.0, size=(20000, k))  # (N, K)
        gold = np.argmax(z / true_t + rng.gumbel(size=z.shape), axis=1)  # Gumbel-max: a draw from softmax(z/T)
        logits += list(z)
        targets += list(np.eye(k)[gold])
    assert fit_temperature(logits, targets) == pytest.approx(true_t, rel=0.02)


def test_fit_is_exact_on_soft_labels_from_a_temperature() -> None:
    # With targets softmax(z / T) themselves, the log loss is a cross-entropy minimised exactly at T.
    rng = np.random.default_rng(1)
    logits = _logit_rows(rng, 50)
    for true_t in (0.4, 1.0, 3.0):
        targets = [softmax(z / true_t) for z in logits]
        assert fit_temperature(logits, targets, smooth=False) == pytest.approx(true_t, rel=1e-4)


def test_fit_cools_an_underconfident_model() -> None:
    # Always right with a small margin (z = [1, 0] → p = 0.73): the fit sharpens, T < 1.
    logits = [np.array([1.0, 0.0])] * 9 + [np.array([0.0, 1.0])]
    targets = [np.array([1.0, 0.0])] * 10
    # 9 right at margin 1, one wrong at margin 1: the optimum of 9·log σ(1/T) + log σ(-1/T) is 1/T = ln 9
    assert fit_temperature(logits, targets, smooth=False) == pytest.approx(1 / np.log(9), rel=1e-4)
    # Platt's targets (n·y + 1) / (n + K) = 11/12 and 1/12: a little warmer, still below 1
    assert 1 / np.log(9) < fit_temperature(logits, targets) < 1.0


def test_a_dev_set_the_model_separates_gives_a_finite_temperature() -> None:
    # Every answer right and confident (the demo's spam task on dev): the raw log loss falls all the way to T → 0,
    # which made one later mistake cost |z| / T (a held-out log loss of 18). Smoothed targets stop at a finite T
    # whose probabilities stay near (n + 1) / (n + 2).
    rng = np.random.default_rng(3)
    logits = [np.array([m, -m]) for m in rng.uniform(2.0, 6.0, size=41)]
    targets = [np.array([1.0, 0.0])] * 41
    raw, fitted = fit_temperature(logits, targets, smooth=False), fit_temperature(logits, targets)
    assert raw < 0.1  # towards the lower bound: the raw loss is flat at 0 there
    assert fitted > 0.3
    mean_p = np.mean([softmax(z / fitted)[0] for z in logits])
    assert mean_p == pytest.approx(42 / 43, abs=0.01)


def test_apply_temperature_keeps_the_argmax_and_sums_to_one() -> None:
    rng = np.random.default_rng(2)
    logits = _logit_rows(rng, 200)
    for t in (0.05, 0.7, 1.0, 2.5, 40.0):
        probs = apply_temperature(logits, t)
        assert isinstance(probs, list) and len(probs) == len(logits)
        for z, p in zip(logits, probs, strict=True):
            assert int(np.argmax(p)) == int(np.argmax(z))
            assert p.sum() == pytest.approx(1.0)
    # T = 2 on z = [ln 4, 0]: softmax([ln 2, 0]) = [2/3, 1/3]
    assert apply_temperature([np.array([np.log(4.0), 0.0])], 2.0)[0] == pytest.approx([2 / 3, 1 / 3])


def test_apply_temperature_on_an_array_uses_the_last_axis() -> None:
    z = np.array([[np.log(4.0), 0.0], [0.0, 0.0]])
    probs = apply_temperature(z, 2.0)
    assert isinstance(probs, np.ndarray)
    np.testing.assert_allclose(probs, [[2 / 3, 1 / 3], [0.5, 0.5]], rtol=1e-12)


def test_bad_inputs_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="zero rows"):
        fit_temperature([], [])
    with pytest.raises(ValueError, match="row 0"):
        fit_temperature([np.array([1.0, 2.0])], [np.array([1.0, 0.0, 0.0])])
    with pytest.raises(ValueError, match="finite"):
        fit_temperature([np.array([1.0, np.inf])], [np.array([1.0, 0.0])])
    with pytest.raises(ValueError, match="temperature"):
        apply_temperature([np.array([1.0, 2.0])], 0.0)
