"""Temperature scaling: recovering a known temperature, argmax invariance, input errors."""

from __future__ import annotations

import math

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


# ---------------------------------------------------------------------------------- small dev sets, many options


def _model_rows(rng: np.random.Generator, n: int, k: int, planted: float, margins=(0.3, 3.0)):
    """n rows of a model that ``planted`` calibrates: answers drawn from softmax(z*), logits z = planted · z*, with
    row margins from near-uniform to confident (as bench/bench_calibration.py draws them)."""
    true = rng.standard_normal((n, k)) * rng.uniform(*margins, size=(n, 1))
    gold = np.argmax(true + rng.gumbel(size=true.shape), axis=1)  # a draw from softmax(z*)
    return list(true * planted), list(np.eye(k)[gold])


@pytest.mark.parametrize("k", [2, 7, 77])
@pytest.mark.parametrize("planted", [0.5, 1.0, 2.0])
def test_the_fit_recovers_a_planted_temperature_at_small_and_large_dev_sizes(k: int, planted: float) -> None:
    # The median over 15 dev sets, within 10% at 500 questions and 25% at 36. One dev set of 36 binary questions
    # spreads much wider than that (10th-90th percentile of T / planted about 0.65-1.5 in the bench), so a single
    # draw passing would be luck; the median says the fit is not biased away from the truth.
    rng = np.random.default_rng(k * 10 + int(planted * 2))
    for n, tolerance in ((500, 0.10), (36, 0.25)):
        fits = [fit_temperature(*_model_rows(rng, n, k, planted)) for _ in range(15)]
        assert float(np.median(fits)) == pytest.approx(planted, rel=tolerance), (n, fits)


def test_the_earlier_per_option_smoothing_fails_where_the_new_fit_holds() -> None:
    # The case of issue 38: 36 dev questions of 7 options from a calibrated model. One pseudo-count per option moved
    # K / (n + K) = 16% of every target and fitted T ≈ 1.5 on such sets; Platt's right / wrong pair moves 1 / (n + 2).
    from mydecide.calibration.temperatures import _padded

    rng = np.random.default_rng(5)
    old, new = [], []
    for _ in range(15):
        logits, targets = _model_rows(rng, 36, 7, 1.0)
        z, y = _padded(logits, targets)
        per_option = np.where(np.isfinite(z), (36 * y + 1) / (36 + 7), 0.0)
        old.append(fit_temperature(logits, list(per_option), smooth=False))
        new.append(fit_temperature(logits, targets))
    assert np.median(old) > 1.35
    assert np.median(new) == pytest.approx(1.0, rel=0.15)


@pytest.mark.parametrize("k", [2, 7])
def test_a_separated_dev_set_gives_a_finite_temperature_that_does_not_hurt_held_out_rows(k: int) -> None:
    from mydecide.calibration.temperatures import LOG_T_BOUNDS, checked_temperature
    from mydecide.metrics import log_loss

    # an accurate, calibrated model; its dev sets of 36 are often answered without a mistake: take the first one
    rng = np.random.default_rng(7 + k)
    for _ in range(500):
        dev_logits, dev_targets = _model_rows(rng, 36, k, 1.0, (8.0, 14.0))
        if all(np.argmax(z) == np.argmax(y) for z, y in zip(dev_logits, dev_targets, strict=True)):
            break
    else:
        pytest.fail("no separated dev set drawn")
    held_logits, held_targets = _model_rows(rng, 4000, k, 1.0, (8.0, 14.0))  # the same model, its mistakes too
    assert any(np.argmax(z) != np.argmax(y) for z, y in zip(held_logits, held_targets, strict=True))
    used, fitted, _ = checked_temperature(dev_logits, dev_targets)
    assert math.exp(LOG_T_BOUNDS[0]) * 10 < fitted < math.exp(LOG_T_BOUNDS[1]) / 10  # finite, off the bound
    at_one = log_loss(apply_temperature(held_logits, 1.0), held_targets)
    assert log_loss(apply_temperature(held_logits, used), held_targets) <= at_one + 0.005
    # the raw fit on the same rows runs to the bound, and costs the held-out rows dearly
    raw = fit_temperature(dev_logits, dev_targets, smooth=False)
    assert log_loss(apply_temperature(held_logits, raw), held_targets) > at_one + 0.5


def test_calibration_never_raises_the_dev_log_loss_or_says_why_t1_was_kept() -> None:
    from mydecide.calibration.temperatures import fit_temperatures

    rng = np.random.default_rng(11)
    kept_one = 0
    for trial in range(40):
        k = (2, 4, 7, 77)[trial % 4]
        n = (20, 36, 100)[trial % 3]
        logits, targets = _model_rows(rng, n, k, float(rng.choice([0.5, 1.0, 2.0])))
        items = [("choice", k, z, y) for z, y in zip(logits, targets, strict=True)]
        fit = fit_temperatures(items, min_rows=1)["types"]["choice"]
        assert fit["log_loss_after"] <= fit["log_loss_before"] + 1e-12
        if fit["temperature"] == 1.0 and fit["fitted_temperature"] != 1.0:
            kept_one += 1
            assert "does not lower the dev log loss" in fit["kept_t1"]
            assert f"{fit['fitted_temperature']:.3f}" in fit["kept_t1"]
            assert fit["log_loss_after"] == fit["log_loss_before"]
        assert fit["weak"] == (n < 100)
    assert kept_one > 0  # the check did act on some of these sets


def test_keep_fit_keeps_a_fit_that_raises_the_dev_log_loss_and_says_so() -> None:
    from mydecide.calibration.temperatures import fit_temperatures

    # a calibrated model on few rows: the smoothed fit lands a little above 1 and above T = 1's raw log loss
    rng = np.random.default_rng(11)
    for _ in range(50):
        logits, targets = _model_rows(rng, 20, 4, 1.0)
        items = [("choice", 4, z, y) for z, y in zip(logits, targets, strict=True)]
        checked = fit_temperatures(items, min_rows=1)["types"]["choice"]
        if "kept_t1" in checked:
            break
    else:
        pytest.fail("no dev set where the check keeps T = 1")
    kept = fit_temperatures(items, min_rows=1, keep_fit=True)["types"]["choice"]
    assert kept["temperature"] == checked["fitted_temperature"] != 1.0
    assert kept["log_loss_after"] > kept["log_loss_before"]
    assert "kept all the same" in kept["kept_fit"]


def test_a_bucket_whose_own_fit_does_not_help_takes_its_type_temperature_or_t1() -> None:
    from mydecide.calibration.temperatures import fit_temperatures

    rng = np.random.default_rng(3)
    items = []
    for k, planted, n in ((2, 2.0, 200), (7, 1.0, 40)):  # an overconfident 2-option bucket, a calibrated 7-option one
        logits, targets = _model_rows(rng, n, k, planted)
        items += [("choice", k, z, y) for z, y in zip(logits, targets, strict=True)]
    fit = fit_temperatures(items, by_bucket=True, min_rows=20)
    for bucket in fit["buckets"]["choice"].values():
        assert bucket["log_loss_after"] <= bucket["log_loss_before"] + 1e-12
    assert fit["types"]["choice"]["log_loss_after"] <= fit["types"]["choice"]["log_loss_before"]


def test_the_calibrate_report_names_the_fitted_value_both_log_losses_and_the_band() -> None:
    from mydecide.calibration.run import fit_report
    from mydecide.calibration.temperatures import fit_temperatures

    rng = np.random.default_rng(11)
    for _ in range(50):
        logits, targets = _model_rows(rng, 20, 4, 1.0)
        fit = fit_temperatures([("choice", 4, z, y) for z, y in zip(logits, targets, strict=True)], min_rows=1)
        if "kept_t1" in fit["types"]["choice"]:
            break
    lines = fit_report(fit)
    s = fit["types"]["choice"]
    row = next(line for line in lines if line.startswith("choice"))
    assert f"{s['fitted_temperature']:.3f}" in row and "  1.000  " in row and f"({s['ece_band_after']:.3f})" in row
    note = next(line for line in lines if line.startswith("choice: the fitted T"))
    assert note.endswith(": T = 1 kept") and f"{s['log_loss_before']:.4f} at T = 1" in note
    assert any(line.startswith("choice: 20 questions: the temperature is weakly determined") for line in lines)
