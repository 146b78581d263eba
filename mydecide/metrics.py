"""Evaluation metrics over variable-K rows.

``probs`` and ``targets`` are lists of 1-D numpy arrays, one pair per question, each row its own number
of options K (a noul is K = 2). ``probs[i]`` is the predicted distribution q, ``targets[i]`` the target
distribution y (one-hot for a hard label). The gold option is argmax(y), the first one on ties; the
prediction is argmax(q), likewise the first one on ties.

Pure functions: no I/O, no models, numbers in and numbers out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from mydecide.errors import UserError

EPS = 1e-15
"""Probabilities are clipped at this value before a log, so 0·log 0 = 0 and a wrong certainty stays finite."""

Rows = Sequence[np.ndarray]


def _as_rows(probs: Rows, targets: Rows) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Validate the rows (same count, at least one, matching 1-D shapes) and return them as float arrays."""
    if len(probs) != len(targets):
        raise ValueError(f"{len(probs)} prediction rows but {len(targets)} target rows")
    if len(probs) == 0:
        raise ValueError("no rows to score: the metrics need at least one question")
    qs = [np.asarray(q, dtype=float) for q in probs]
    ys = [np.asarray(y, dtype=float) for y in targets]
    for i, (q, y) in enumerate(zip(qs, ys, strict=True)):
        if q.shape != y.shape or q.ndim != 1 or q.size == 0:
            raise ValueError(f"row {i}: prediction shape {q.shape} and target shape {y.shape} must be equal, 1-D")
    return qs, ys


def _gold_and_predicted(probs: Rows, targets: Rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(confidence = max q, predicted index, gold index), each (N,)."""
    confidence = np.array([float(np.max(q)) for q in probs])
    predicted = np.array([int(np.argmax(q)) for q in probs])
    gold = np.array([int(np.argmax(y)) for y in targets])
    return confidence, predicted, gold


def accuracy(probs: Rows, targets: Rows) -> float:
    """Fraction of rows whose argmax(q) is the gold option argmax(y)."""
    probs, targets = _as_rows(probs, targets)
    _, predicted, gold = _gold_and_predicted(probs, targets)
    return float(np.mean(predicted == gold))


def chance_corrected(acc: float, ks: Sequence[int]) -> float:
    """(acc − chance) / (1 − chance) with chance = mean of 1/K: 0 at random guessing, 1 when always right."""
    if len(ks) == 0:
        raise ValueError("chance_corrected needs the option count of at least one row")
    if min(ks) < 2:
        raise ValueError(f"every row needs K >= 2 options for a chance level, got K = {min(ks)}")
    chance = float(np.mean([1.0 / k for k in ks]))
    return (acc - chance) / (1.0 - chance)


def log_loss(probs: Rows, targets: Rows) -> float:
    """Mean −Σ_k y_k log q_k (q clipped at EPS)."""
    return float(np.mean(log_losses(probs, targets)))


def log_losses(probs: Rows, targets: Rows) -> np.ndarray:
    """−Σ_k y_k log q_k of each row (q clipped at EPS)."""
    probs, targets = _as_rows(probs, targets)
    return np.array([-np.sum(y * np.log(np.clip(q, EPS, None))) for q, y in zip(probs, targets, strict=True)])


def brier(probs: Rows, targets: Rows) -> float:
    """Mean Σ_k (q_k − y_k)², in [0, 2]."""
    probs, targets = _as_rows(probs, targets)
    return float(np.mean([np.sum((q - y) ** 2) for q, y in zip(probs, targets, strict=True)]))


def rps(probs: Rows, targets: Rows) -> float:
    """Mean ranked probability score Σ_i (Q_i − Y_i)² / (K − 1) over cumulative distributions, in [0, 1].

    Meant for score questions (ordered levels, lowest first).
    """
    probs, targets = _as_rows(probs, targets)
    values = [
        np.sum((np.cumsum(q) - np.cumsum(y)) ** 2) / max(len(q) - 1, 1) for q, y in zip(probs, targets, strict=True)
    ]
    return float(np.mean(values))


def ordinal_summary(probs: Rows, targets: Rows) -> dict[str, Any]:
    """What score questions (ordered levels, lowest first) need beyond accuracy, with levels as indices 0 … K−1:

    * ``mae``: mean |E_q[level] − gold level|, in levels (soft targets: their expected level);
    * ``spearman``: Spearman ρ between the expected level and the gold level (None when either is constant);
    * ``within_one``: the share whose most probable level is at most one level from the gold one;
    * ``rps`` and ``rps_skill`` = 1 − RPS / RPS of the base rate (each K's level frequencies in these rows, which
      knows the answers' spread but nothing of any state): above 0 the model's states tell it something;
    * ``threshold_ece``: the binary ECE of each P(Y ≥ k) against 1[y ≥ k], averaged over k = 1 … K−1, with
      ``threshold_ece_band`` the same average of :func:`ece_band` (what a calibrated model would show);
    * ``unimodal_share``: the share of predicted distributions that rise to one peak and then fall.
    """
    probs, targets = _as_rows(probs, targets)
    level_of = [np.arange(len(q), dtype=float) for q in probs]
    expected = np.array([float(lv @ q) for lv, q in zip(level_of, probs, strict=True)])
    gold = np.array([float(lv @ y) for lv, y in zip(level_of, targets, strict=True)])
    _, predicted, gold_index = _gold_and_predicted(probs, targets)
    spearman = None
    if len(probs) > 1 and np.ptp(expected) > 0 and np.ptp(gold) > 0:
        from scipy.stats import spearmanr

        spearman = float(spearmanr(expected, gold).statistic)
    base_rate = {k: np.mean([y for y in targets if len(y) == k], axis=0) for k in {len(y) for y in targets}}
    model_rps = rps(probs, targets)
    reference_rps = rps([base_rate[len(y)] for y in targets], targets)
    thresholds = [
        [(float(q[k:].sum()), float(y[k:].sum())) for q, y in zip(probs, targets, strict=True) if len(q) > k]
        for k in range(1, max(len(q) for q in probs))
    ]
    binary = [
        ([np.array([p, 1.0 - p]) for p, _ in pairs], [np.array([t, 1.0 - t]) for _, t in pairs]) for pairs in thresholds
    ]
    return {
        "n": len(probs),
        "mae": float(np.mean(np.abs(expected - gold))),
        "spearman": spearman,
        "within_one": float(np.mean(np.abs(predicted - gold_index) <= 1)),
        "rps": model_rps,
        "rps_skill": 1.0 - model_rps / reference_rps if reference_rps > 0 else None,
        "threshold_ece": float(np.mean([ece(q, y) for q, y in binary])) if binary else None,
        "threshold_ece_band": float(np.mean([ece_band(q) for q, _ in binary])) if binary else None,
        "unimodal_share": float(np.mean([unimodal(q) for q in probs])),
    }


def unimodal(q: np.ndarray, tolerance: float = 1e-9) -> bool:
    """Whether ``q`` never rises again once it has fallen (ties within ``tolerance`` are flat)."""
    steps = np.diff(np.asarray(q, dtype=float))
    falls = np.flatnonzero(steps < -tolerance)
    return not falls.size or not bool(np.any(steps[falls[0] :] > tolerance))


class ReliabilityBins(NamedTuple):
    """Per-bin statistics of the top probability, for ECE and reliability diagrams."""

    edges: np.ndarray  # (bins + 1,) bin edges on [0, 1]
    counts: np.ndarray  # (bins,) rows whose confidence falls in the bin
    confidence: np.ndarray  # (bins,) mean top probability in the bin, NaN when empty
    accuracy: np.ndarray  # (bins,) fraction correct in the bin, NaN when empty


def _bin_index(confidence: np.ndarray, bins: int) -> np.ndarray:
    """The bin of each confidence among ``bins`` equal-width bins [b/bins, (b+1)/bins); 1.0 falls in the last."""
    return np.clip(np.floor(confidence * bins).astype(int), 0, bins - 1)


def reliability_bins(probs: Rows, targets: Rows, bins: int = 10) -> ReliabilityBins:
    """Bin rows by their top probability into ``bins`` equal-width bins [b/bins, (b+1)/bins).

    A confidence of exactly 1.0 falls in the last bin.
    """
    probs, targets = _as_rows(probs, targets)
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    confidence, predicted, gold = _gold_and_predicted(probs, targets)
    correct = (predicted == gold).astype(float)
    index = _bin_index(confidence, bins)  # (N,)
    count = np.bincount(index, minlength=bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.bincount(index, weights=confidence, minlength=bins) / count
        mean_acc = np.bincount(index, weights=correct, minlength=bins) / count
    return ReliabilityBins(np.linspace(0.0, 1.0, bins + 1), count, mean_conf, mean_acc)


def ece(probs: Rows, targets: Rows, bins: int = 10) -> float:
    """Expected calibration error on the top probability: Σ_b (n_b / N)·|acc_b − conf_b|."""
    rb = reliability_bins(probs, targets, bins)
    filled = rb.counts > 0
    weights = rb.counts[filled] / rb.counts.sum()
    return float(np.sum(weights * np.abs(rb.accuracy[filled] - rb.confidence[filled])))


ECE_BAND_DRAWS = 1000
ECE_BAND_QUANTILE = 0.9
ECE_BAND_CELLS = 4_000_000  # simulated outcomes held at once


def ece_band(probs: Rows, bins: int = 10, draws: int = ECE_BAND_DRAWS, seed: int = 0) -> float:
    """The ECE that a perfectly calibrated model with these confidences would show on this many rows: the 90th
    percentile over ``draws`` resamplings in which row i is right with probability max q_i.

    ECE is biased upwards on few rows (each bin's accuracy is a small-sample estimate), so an ECE is only evidence
    of miscalibration where it stands above this band: e.g. 59 questions at accuracy ~0.4 put a calibrated model's
    ECE near 0.1. Deterministic for a given ``seed``."""
    if not len(probs):
        raise ValueError("no rows to score: the metrics need at least one question")
    confidence = np.array([float(np.max(np.asarray(q, dtype=float))) for q in probs])  # (N,)
    index = _bin_index(confidence, bins)  # ECE's own bins (reliability_bins)
    counts = np.bincount(index, minlength=bins).astype(float)  # (bins,)
    conf_sum = np.bincount(index, weights=confidence, minlength=bins)  # (bins,)
    rng = np.random.default_rng(seed)
    eces = np.empty(draws)
    chunk = max(1, ECE_BAND_CELLS // len(confidence))  # draws per step: memory stays bounded at any N
    for start in range(0, draws, chunk):
        n_draws = min(chunk, draws - start)
        right = rng.random((n_draws, len(confidence))) < confidence  # (n_draws, N) outcomes of a calibrated model
        right_sum = np.stack([np.bincount(index, weights=r, minlength=bins) for r in right.astype(float)])
        # Σ_b (n_b/N)·|acc_b − conf_b| = Σ_b |right_b − Σconf_b| / N
        eces[start : start + n_draws] = np.abs(right_sum - conf_sum).sum(axis=1) / counts.sum()
    return float(np.quantile(eces, ECE_BAND_QUANTILE))


def total_variation(probs: Rows, targets: Rows) -> float:
    """Mean total-variation distance ½ Σ_k |q_k − y_k|, in [0, 1]."""
    probs, targets = _as_rows(probs, targets)
    return float(np.mean([0.5 * np.sum(np.abs(q - y)) for q, y in zip(probs, targets, strict=True)]))


def soft_accuracy(probs: Rows, targets: Rows) -> float:
    """Mean y[argmax q]: the mass the (soft) label gives to the predicted option (accuracy for one-hot y)."""
    probs, targets = _as_rows(probs, targets)
    return float(np.mean([y[int(np.argmax(q))] for q, y in zip(probs, targets, strict=True)]))


def selective_curve(probs: Rows, targets: Rows) -> tuple[np.ndarray, np.ndarray]:
    """(coverage, selective accuracy), each (N,): answer only the i most confident rows, i = 1 … N.

    Rows are sorted by top probability, descending (a stable sort, so ties keep their input order).
    coverage[i-1] = i / N and accuracy[i-1] = fraction correct among those i rows.
    """
    probs, targets = _as_rows(probs, targets)
    confidence, predicted, gold = _gold_and_predicted(probs, targets)
    order = np.argsort(-confidence, kind="stable")
    correct = (predicted == gold)[order].astype(float)
    answered = np.arange(1, len(correct) + 1)
    return answered / len(correct), np.cumsum(correct) / answered


def aurc(probs: Rows, targets: Rows) -> float:
    """Area under the risk–coverage curve: mean over coverage points i/N of the selective risk (1 − accuracy).

    Lower is better; a model whose confident answers are the right ones scores near 0.
    """
    _, selective_accuracy = selective_curve(probs, targets)
    return float(np.mean(1.0 - selective_accuracy))


def summarize(probs: Rows, targets: Rows, is_score: Sequence[bool]) -> dict[str, Any]:
    """All headline metrics of one set of rows: n, accuracy, chance_corrected, log_loss, brier, ece, ece_band (see
    :func:`ece_band`), rps
    (None when no row is a score question), total_variation, soft_accuracy, aurc."""
    probs, targets = _as_rows(probs, targets)
    if len(is_score) != len(probs):
        raise ValueError(f"is_score has {len(is_score)} entries for {len(probs)} rows")
    acc = accuracy(probs, targets)
    score_rows = [i for i, flag in enumerate(is_score) if flag]
    return {
        "n": len(probs),
        "accuracy": acc,
        "chance_corrected": chance_corrected(acc, [len(q) for q in probs]),
        "log_loss": log_loss(probs, targets),
        "brier": brier(probs, targets),
        "ece": ece(probs, targets),
        "ece_band": ece_band(probs),
        "rps": rps([probs[i] for i in score_rows], [targets[i] for i in score_rows]) if score_rows else None,
        "total_variation": total_variation(probs, targets),
        "soft_accuracy": soft_accuracy(probs, targets),
        "aurc": aurc(probs, targets),
    }


def auto_act_threshold(right: float, wrong: float, escalate: float) -> float:
    """Confidence above which acting beats escalating: (escalate − wrong) / (right − wrong).

    Acting with confidence p pays p·right + (1 − p)·wrong in expectation, escalating pays ``escalate``;
    they are equal at this p. E.g. right +1, wrong −3, escalate −0.5 gives 2.5 / 4 = 0.625.
    """
    values = {"right": right, "wrong": wrong, "escalate": escalate}
    for name, value in values.items():
        if not math.isfinite(value):
            raise UserError(f"payoff {name} must be a finite number, got {value}")
    if not right > wrong:
        raise UserError(f"payoff right ({right}) must be greater than payoff wrong ({wrong})")
    if not wrong <= escalate <= right:
        raise UserError(f"payoff escalate ({escalate}) must lie between wrong ({wrong}) and right ({right})")
    return (escalate - wrong) / (right - wrong)


def threshold_table(
    probs: Rows,
    targets: Rows,
    thresholds: Sequence[float],
    right: float,
    wrong: float,
    escalate: float,
) -> list[dict[str, float | None]]:
    """One row per threshold t: act on questions whose top probability p > t, escalate the others.

    Each row holds threshold, coverage (fraction acted on), accuracy on the covered questions (None when
    none is covered) and payoff, the mean payoff per question (right / wrong for an acted answer,
    escalate for an escalated one).
    """
    probs, targets = _as_rows(probs, targets)
    auto_act_threshold(right, wrong, escalate)  # validates the payoffs
    confidence, predicted, gold = _gold_and_predicted(probs, targets)
    correct = predicted == gold
    n = len(confidence)
    table: list[dict[str, float | None]] = []
    for t in thresholds:
        acted = confidence > t
        n_acted = int(acted.sum())
        n_right = int((acted & correct).sum())
        payoff = (n_right * right + (n_acted - n_right) * wrong + (n - n_acted) * escalate) / n
        table.append(
            {
                "threshold": float(t),
                "coverage": n_acted / n,
                "accuracy": n_right / n_acted if n_acted else None,
                "payoff": payoff,
            }
        )
    return table


def span_ece(spans: Sequence[tuple[float, bool]]) -> tuple[float, float] | tuple[None, None]:
    """ECE of located spans' probabilities against their exact-match correctness, and the band a calibrated model
    reaches on that many spans (90th percentile): (None, None) without spans."""
    if not spans:
        return None, None
    probs = [np.array([p, 1.0 - p]) for p, _ in spans]
    targets = [np.array([float(right), 1.0 - float(right)]) for _, right in spans]
    return ece(probs, targets), ece_band(probs)


def f1_interval(counts: np.ndarray, draws: int = 1000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """A percentile bootstrap interval of F1 from per-question ``(tp, fp, fn)`` counts ((Q, 3)): the questions are
    resampled with replacement, since a question's spans are not independent of each other (one text, one read)."""
    counts = np.asarray(counts, dtype=float).reshape(-1, 3)
    if len(counts) == 0:
        return 1.0, 1.0
    rng = np.random.default_rng(seed)
    tp, fp, fn = counts[rng.integers(0, len(counts), size=(draws, len(counts)))].sum(axis=1).T
    denominator = 2 * tp + fp + fn
    f1 = np.divide(2 * tp, denominator, out=np.ones_like(tp), where=denominator > 0)
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(f1, [tail, 100 - tail])
    return float(low), float(high)


def confusion(gold: Sequence[int], predicted: Sequence[int], k: int) -> np.ndarray:
    """(K, K) counts of questions: row = gold option, column = predicted option."""
    matrix = np.zeros((k, k), dtype=np.int64)
    np.add.at(matrix, (np.asarray(gold, dtype=np.int64), np.asarray(predicted, dtype=np.int64)), 1)
    return matrix


def per_option(matrix: np.ndarray) -> dict[str, np.ndarray]:
    """Precision, recall and F1 of each option of a :func:`confusion` matrix, each (K,), and its support (gold
    count). An option never predicted has precision 0, one never gold recall 0 (and F1 0 when both are 0)."""
    matrix = np.asarray(matrix, dtype=float)
    tp = np.diag(matrix)
    predicted, gold = matrix.sum(axis=0), matrix.sum(axis=1)
    precision = np.divide(tp, predicted, out=np.zeros_like(tp), where=predicted > 0)
    recall = np.divide(tp, gold, out=np.zeros_like(tp), where=gold > 0)
    total = precision + recall
    f1 = np.divide(2 * precision * recall, total, out=np.zeros_like(tp), where=total > 0)
    return {"precision": precision, "recall": recall, "f1": f1, "support": gold.astype(np.int64)}


def macro_f1(matrix: np.ndarray) -> float:
    """The mean F1 of the options that are gold or predicted at least once (an option absent from both says
    nothing about the model)."""
    matrix = np.asarray(matrix)
    seen = (matrix.sum(axis=0) + matrix.sum(axis=1)) > 0
    return float(np.mean(per_option(matrix)["f1"][seen])) if seen.any() else 1.0


BOOTSTRAP_RESAMPLES = 1000


def mean_interval(
    values: Sequence[float] | np.ndarray, level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> tuple[float, float]:
    """A percentile bootstrap interval of the mean of per-question values (correct 0/1 for accuracy, each
    question's log loss), by ``scipy.stats.bootstrap``. Percentile rather than BCa: BCa's jackknife degenerates on
    the 0/1 values of a small, nearly all-right dev set, where percentile stays defined. All values equal: that
    value twice (no resample can differ)."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("mean_interval needs at least one value")
    if np.all(data == data[0]):
        return float(data[0]), float(data[0])
    from scipy.stats import bootstrap

    found = bootstrap(
        (data,),
        np.mean,
        confidence_level=level,
        n_resamples=resamples,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    return float(found.confidence_interval.low), float(found.confidence_interval.high)


def correct_flags(probs: Rows, targets: Rows) -> np.ndarray:
    """(N,) 1.0 where argmax(q) is the gold option, else 0.0 (their mean is :func:`accuracy`)."""
    probs, targets = _as_rows(probs, targets)
    _, predicted, gold = _gold_and_predicted(probs, targets)
    return (predicted == gold).astype(float)
