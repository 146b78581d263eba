"""mydecide.metrics against scikit-learn's on 100 random cases each, to 1e-9: accuracy, log loss, Brier (K = 2, where
scikit-learn's binary Brier is half of ours, and K > 2) and per-option / macro F1 from the confusion matrix."""

from __future__ import annotations

import numpy as np
import pytest

from mydecide import metrics

sklearn_metrics = pytest.importorskip("sklearn.metrics")  # in the dev extra, pinned in requirements.lock

CASES = 100


def random_case(seed: int, k: int | None = None) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray, int]:
    """(probability rows, one-hot targets, gold indices, K) of one random case: N in 5..60 questions, K in 2..6,
    probabilities from a Dirichlet (some near 0 or 1)."""
    rng = np.random.default_rng(seed)
    k = k or int(rng.integers(2, 7))
    n = int(rng.integers(5, 61))
    probs = rng.dirichlet(np.full(k, float(rng.choice([0.3, 1.0, 5.0]))), size=n)
    probs = np.clip(probs, 1e-12, None)
    probs /= probs.sum(axis=1, keepdims=True)
    gold = rng.integers(0, k, size=n)
    targets = np.eye(k)[gold]
    return list(probs), list(targets), gold, k


@pytest.mark.parametrize("seed", range(CASES))
def test_accuracy_log_loss_and_brier_agree_with_scikit_learn(seed: int) -> None:
    probs, targets, gold, k = random_case(seed)
    stacked = np.stack(probs)
    predicted = stacked.argmax(axis=1)
    assert metrics.accuracy(probs, targets) == pytest.approx(sklearn_metrics.accuracy_score(gold, predicted), abs=1e-9)
    assert metrics.log_loss(probs, targets) == pytest.approx(
        sklearn_metrics.log_loss(gold, stacked, labels=list(range(k))), abs=1e-9
    )
    theirs = sklearn_metrics.brier_score_loss(gold, stacked, labels=list(range(k)), scale_by_half=False)
    assert metrics.brier(probs, targets) == pytest.approx(theirs, abs=1e-9)
    binary, binary_targets, binary_gold, _ = random_case(10_000 + seed, k=2)
    # scikit-learn's binary Brier is the mean (p(option 1) - y)^2: half of Σ_k over both options
    assert metrics.brier(binary, binary_targets) == pytest.approx(
        2 * sklearn_metrics.brier_score_loss(binary_gold, np.stack(binary)[:, 1]), abs=1e-9
    )


@pytest.mark.parametrize("seed", range(CASES))
def test_per_option_precision_recall_f1_and_macro_f1_agree_with_scikit_learn(seed: int) -> None:
    _, _, gold, k = random_case(seed)
    predicted = np.random.default_rng(seed + 1).integers(0, k, size=len(gold))
    if seed % 4 == 0:  # some options never predicted: precision 0, as scikit-learn's zero_division=0
        predicted = np.minimum(predicted, 1)
    matrix = metrics.confusion(gold, predicted, k)
    np.testing.assert_array_equal(matrix, sklearn_metrics.confusion_matrix(gold, predicted, labels=list(range(k))))
    ours = metrics.per_option(matrix)
    precision, recall, f1, support = sklearn_metrics.precision_recall_fscore_support(
        gold, predicted, labels=list(range(k)), zero_division=0
    )
    np.testing.assert_allclose(ours["precision"], precision, rtol=0, atol=1e-9)
    np.testing.assert_allclose(ours["recall"], recall, rtol=0, atol=1e-9)
    np.testing.assert_allclose(ours["f1"], f1, rtol=0, atol=1e-9)
    np.testing.assert_array_equal(ours["support"], support)
    assert metrics.macro_f1(matrix) == pytest.approx(
        sklearn_metrics.f1_score(gold, predicted, average="macro", zero_division=0), abs=1e-9
    )


def test_mean_interval_is_scipy_percentile_bootstrap_and_holds_the_mean() -> None:
    values = np.random.default_rng(3).integers(0, 2, size=80).astype(float)
    low, high = metrics.mean_interval(values)
    assert low < values.mean() < high
    assert (low, high) == metrics.mean_interval(values)  # seeded: the same interval every run
    assert high - low == pytest.approx(2 * 1.96 * values.std() / np.sqrt(len(values)), rel=0.15)
    assert metrics.mean_interval([1.0, 1.0, 1.0]) == (1.0, 1.0)
    with pytest.raises(ValueError, match="at least one value"):
        metrics.mean_interval([])
