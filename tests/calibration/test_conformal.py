"""Conformal sets, conformal risk control and Learn then Test: exact values, and simulations on synthetic models with
a known truth over 200 random dev / test splits (numpy only; the whole file runs in a few seconds)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import beta as beta_dist

from mydecide.calibration.conformal import (
    AUTO_ACT_GRID,
    TooFewRows,
    binomial_p_value,
    choose_score,
    clopper_pearson,
    conformal_quantile,
    fewest_answers,
    gold_scores,
    learn_then_test,
    min_rows_for,
    missed_fraction,
    option_scores,
    prediction_sets,
    quantile_rank,
    risk_controlled_threshold,
    span_threshold,
)

SPLITS = 200

# ----------------------------------------------------------------------------------------------------- exact values


def test_finite_sample_rank_and_the_fewest_rows() -> None:
    assert quantile_rank(19, 0.05) == 19  # ⌈20 · 0.95⌉
    assert quantile_rank(100, 0.1) == 91  # ⌈101 · 0.9⌉ = ⌈90.9⌉
    assert quantile_rank(9, 0.1) == 9  # (9 + 1) · 0.9 is 9.000000000000002 in floating point
    assert min_rows_for(0.05) == 19 and min_rows_for(0.1) == 9 and min_rows_for(0.2) == 4
    with pytest.raises(TooFewRows, match=r"^18 dev rows are too few for alpha = 0.05: it needs at least 19$"):
        quantile_rank(18, 0.05)
    with pytest.raises(ValueError, match=r"alpha must be a number in \(0, 1\), got 1.5"):
        quantile_rank(10, 1.5)


def test_conformal_quantile_is_the_rank_th_smallest_score() -> None:
    scores = [0.9, 0.1, 0.5, 0.3, 0.7, 0.2, 0.8, 0.4, 0.6, 0.05]  # n = 10, α = 0.2: ⌈11 · 0.8⌉ = 9th smallest
    assert conformal_quantile(scores, 0.2) == 0.8
    assert conformal_quantile(scores, 0.1) == 0.9  # ⌈11 · 0.9⌉ = 10th


def test_option_scores_exact() -> None:
    p = np.array([[0.5, 0.3, 0.2]])
    np.testing.assert_allclose(option_scores("lac", p), [[0.5, 0.7, 0.8]])
    np.testing.assert_allclose(option_scores("aps", p), [[0.5, 0.8, 1.0]])
    levels = np.array([[0.1, 0.5, 0.15, 0.25]])
    # grown from level 1 (0.5): level 2 (0.15 > 0.1), then level 3 (0.25 > 0.1), then level 0
    np.testing.assert_allclose(option_scores("ordinal_aps", levels), [[1.0, 0.5, 0.65, 0.9]])
    # level 2 lies between level 1 (0.5) and level 3 (0.25): in every range cut at t ≤ 0.25
    np.testing.assert_allclose(option_scores("ordinal_hull", levels), [[0.9, 0.5, 0.75, 0.75]])
    with pytest.raises(ValueError, match="unknown conformal score 'raps'"):
        option_scores("raps", p)


def test_sets_hold_the_top_option_and_group_rows_by_k() -> None:
    rows = [np.array([0.5, 0.3, 0.2]), np.array([0.6, 0.4]), np.array([0.34, 0.33, 0.33])]
    sets = prediction_sets("lac", rows, 0.6)  # p ≥ 0.4
    assert [s.tolist() for s in sets] == [[True, False, False], [True, True], [True, False, False]]
    assert gold_scores("aps", rows, [1, 1, 2]).tolist() == pytest.approx([0.8, 1.0, 1.0])


def test_learn_then_test_exact() -> None:
    assert fewest_answers(0.05, 0.1) == 45  # 0.95^45 = 0.0994 ≤ 0.1 < 0.95^44
    assert binomial_p_value(0, 45, 0.05) == pytest.approx(0.95**45)
    assert clopper_pearson(0, 10)[1] == pytest.approx(1 - 0.025 ** (1 / 10))
    assert clopper_pearson(10, 10) == (pytest.approx(0.025 ** (1 / 10)), 1.0)
    # 100 answers at 0.95 without an error, then 100 at 0.6 of which 30 wrong: the sequence stops between them
    conf = np.r_[np.full(100, 0.95), np.full(100, 0.6)]
    wrong = np.r_[np.zeros(100, bool), np.arange(100) < 30]
    got = learn_then_test(conf, wrong, 0.05, 0.1)
    # the lowest grid threshold that answers the same 100 rows: 0.605 (0.6 would answer all 200)
    assert got["threshold"] == 0.605 and got["answered"] == 0.5 and got["dev_risk"] == 0.0
    assert got["p_value"] == pytest.approx(0.95**100)
    # the first threshold with at least 45 answers fails: nothing is auto-acted
    assert learn_then_test(np.full(50, 0.99), np.arange(50) < 5, 0.05, 0.1)["threshold"] is None
    assert AUTO_ACT_GRID[:4] == (0.999, 0.998, 0.995, 0.99) and AUTO_ACT_GRID[-1] == 0.0


def test_risk_control_exact() -> None:
    thresholds = np.array([0.2, 0.4, 0.6])
    losses = np.array([[0, 0, 1], [0, 0, 0], [0, 1, 1]] + [[0, 0, 0]] * 17, dtype=float)  # n = 20
    # bound(t) = 20/21 · R̂ + 1/21: 0.048, 0.095, 0.143
    assert risk_controlled_threshold(losses, thresholds, 0.1) == 0.4
    assert risk_controlled_threshold(losses, thresholds, 0.05) == 0.2
    with pytest.raises(TooFewRows, match=r"20 dev rows are too few for alpha = 0\.04"):
        risk_controlled_threshold(losses, thresholds, 0.04)
    # two questions' gold spans: their highest word probabilities
    best = [np.array([0.9, 0.3])] + [np.array([0.8])] * 19
    assert span_threshold(best, 0.1) == 0.8  # at 0.8 question 1 misses half: 20/21 · 0.025 + 1/21 ≤ 0.1


# ------------------------------------------------------------------------------------------------- simulations


def synthetic(rng: np.random.Generator, n: int, k: int, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a model that answers softmax(log p / T) where p is the truth the gold is drawn from: T = 1 is
    calibrated, T = 0.5 over-confident, T = 2 under-confident."""
    truth = rng.dirichlet(np.full(k, 0.4), size=n)
    gold = (rng.random((n, 1)) > np.cumsum(truth, axis=1)).sum(axis=1).clip(max=k - 1)  # a draw from each truth
    logits = np.log(truth + 1e-12) / temperature
    model = np.exp(logits - logits.max(axis=1, keepdims=True))
    return model / model.sum(axis=1, keepdims=True), gold


@pytest.mark.parametrize(
    ("score", "k", "temperature"),
    [
        ("lac", 4, 1.0),
        ("aps", 4, 0.5),
        ("ordinal_aps", 5, 2.0),
        ("ordinal_hull", 5, 0.5),
        ("lac", 2, 0.5),
    ],
)
def test_coverage_over_random_splits(score: str, k: int, temperature: float) -> None:
    rng = np.random.default_rng(7)
    probs, gold = synthetic(rng, 1200, k, temperature)
    n_dev, alpha = 200, 0.1
    all_sets = option_scores(score, probs)  # (N, K): sets at q̂ are {scores ≤ q̂} ∪ {argmax}
    gold_s = all_sets[np.arange(len(gold)), gold]
    top = np.argmax(probs, axis=1)
    covered = []
    for _ in range(SPLITS):
        order = rng.permutation(len(gold))
        dev, test = order[:n_dev], order[n_dev:]
        q = conformal_quantile(gold_s[dev], alpha)
        covered.append(float(np.mean((gold_s[test] <= q) | (gold[test] == top[test]))))
    covered_arr = np.array(covered)
    m = len(gold) - n_dev
    # coverage given dev is Beta(r, n + 1 − r), r = ⌈(n + 1)(1 − α)⌉ (at least: sets also hold the top option)
    r = quantile_rank(n_dev, alpha)
    mean_floor = 1 - alpha - 3 * math.sqrt(alpha * (1 - alpha) / (n_dev * SPLITS))
    assert covered_arr.mean() >= mean_floor
    low = beta_dist.ppf(0.005, r, n_dev + 1 - r) - 3 * math.sqrt(alpha * (1 - alpha) / m)
    assert np.mean(covered_arr >= low) >= 0.97


def test_the_chosen_score_keeps_coverage() -> None:
    """The choice between lac and aps looks at dev; coverage still holds on average over the splits."""
    rng = np.random.default_rng(3)
    probs, gold = synthetic(rng, 800, 5, 0.5)
    covered, chosen = [], []
    for _ in range(SPLITS // 4):
        order = rng.permutation(len(gold))
        dev, test = order[:200], order[200:]
        score, sizes = choose_score(("lac", "aps"), list(probs[dev]), list(gold[dev]), 0.1, splits=5)
        q = conformal_quantile(gold_scores(score, list(probs[dev]), list(gold[dev])), 0.1)
        sets = prediction_sets(score, list(probs[test]), q)
        covered.append(np.mean([s[g] for s, g in zip(sets, gold[test], strict=True)]))
        chosen.append(score)
        assert set(sizes) == {"lac", "aps"}
    assert np.mean(covered) >= 0.9 - 0.01
    assert chosen.count("lac") > len(chosen) / 2  # the smaller sets of 1 − p (Sadinle et al.)


def test_ordinal_sets_are_contiguous() -> None:
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.full(7, 0.3), size=500)  # many with two peaks
    for score in ("ordinal_aps", "ordinal_hull"):
        for q in (0.2, 0.5, 0.8, 0.95):
            for s in prediction_sets(score, list(probs), q):
                inside = np.flatnonzero(s)
                assert len(inside) >= 1 and inside.max() - inside.min() + 1 == len(inside)


@pytest.mark.parametrize("temperature", [1.0, 0.4])
def test_learn_then_test_controls_risk_over_random_splits(temperature: float) -> None:
    rng = np.random.default_rng(11)
    probs, gold = synthetic(rng, 6000, 2, temperature)
    conf = probs.max(axis=1)
    wrong = np.argmax(probs, axis=1) != gold
    eps, delta = 0.05, 0.1
    within, answered = [], []
    for _ in range(SPLITS):
        order = rng.permutation(len(gold))
        dev, test = order[:500], order[500:]
        got = learn_then_test(conf[dev], wrong[dev], eps, delta)
        if got["threshold"] is None:
            within.append(True)  # nothing auto-acted: no error
            continue
        acted = conf[test] >= got["threshold"]
        within.append(bool(wrong[test][acted].mean() <= eps))
        answered.append(acted.mean())
    assert np.mean(within) >= 1 - delta
    assert np.mean(answered) > 0.3  # it does answer: Dirichlet(0.4) truths are often confident


def test_span_miss_rate_bound_over_random_splits() -> None:
    """Questions with 1 to 3 gold spans whose best word probability is Beta(4, 1.5): the test rate of missed spans
    at the fitted threshold is at most α on average."""
    rng = np.random.default_rng(5)
    best = [rng.beta(4, 1.5, size=rng.integers(1, 4)) for _ in range(1000)]
    alpha, rates = 0.1, []
    for _ in range(SPLITS):
        order = rng.permutation(len(best))
        dev, test = order[:250], order[250:]
        t = span_threshold([best[i] for i in dev], alpha)
        rates.append(np.mean(missed_fraction([best[i] for i in test], np.array([t]))))
    assert np.mean(rates) <= alpha + 3 * 0.3 / math.sqrt(250 * SPLITS)
    assert np.mean(rates) > alpha - 0.02  # and not far below: the bound is tight
