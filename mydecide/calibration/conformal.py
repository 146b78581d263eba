"""Conformal answer sets and risk-controlled auto-act: the pure math (docs/guarantees.md says what it guarantees).

Everything here takes numpy arrays and returns numbers or arrays, so it is tested with exact values and by
simulation (tests/calibration/test_conformal.py).

* **Split conformal prediction.** With n dev (calibration) scores s_1 … s_n and a new exchangeable question, the set
  {y : s(x, y) ≤ q̂}, q̂ the ⌈(n + 1)(1 − α)⌉-th smallest dev score, holds the gold answer with probability at least
  1 − α (Vovk et al.; Angelopoulos & Bates, "A gentle introduction", 2021). That needs ⌈(n + 1)(1 − α)⌉ ≤ n, i.e.
  n ≥ (1 − α) / α: 9 dev questions for α = 0.1, 19 for α = 0.05 (:func:`min_rows_for`).
* **Scores** (:data:`SCORES`): ``lac``, 1 − p of the option (Sadinle et al. 2019: the smallest sets on average);
  ``aps``, the probability mass of the options at least as probable as it (Romano et al. 2020, without
  randomisation); for ordinal questions ``ordinal_aps``, the mass of the range grown from the most probable level
  towards the more probable neighbour until it reaches the level (Lu et al. 2022), and ``ordinal_hull``, 1 − the
  highest p at which the level still lies between two levels of that probability. The two ordinal scores give a
  contiguous range of levels at every threshold. Every set also holds the most probable option, so no set is empty
  (adding an option never lowers coverage).
* **Conformal risk control** (Angelopoulos et al. 2022) for a loss L_i(t) in [0, 1] that does not fall as the
  threshold t rises: t̂ = the largest t with (n / (n + 1)) R̂_n(t) + 1 / (n + 1) ≤ α gives E[L_{n+1}(t̂)] ≤ α.
* **Learn then Test** (Angelopoulos et al. 2021) for auto-act: thresholds on the top probability, tested from the
  most conservative down, each against H_λ: "the error rate among answered questions exceeds ε" with the exact
  binomial p-value P(Binomial(n_λ, ε) ≤ errors_λ); the sequence stops at the first p-value above δ. The lowest
  threshold rejected has an error rate among its answered questions of at most ε with probability ≥ 1 − δ.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

SCORES = {"choice": ("lac", "aps"), "score": ("ordinal_aps", "ordinal_hull"), "binary": ("lac",)}
"""The non-conformity scores tried per kind of question; ``binary``: yes/no questions and each label of a set."""

AUTO_ACT_GRID = (0.999, 0.998, 0.995, *(round(0.99 - 0.005 * i, 3) for i in range(199)))
"""The thresholds auto-act tests, most conservative first: 0.999, 0.998, 0.995, 0.99, 0.985, …, 0.0 (fixed before any
data is seen, as Learn then Test needs)."""


class TooFewRows(ValueError):
    """Dev holds too few questions for the α asked."""


def min_rows_for(alpha: float) -> int:
    """The fewest dev rows that give a finite conformal threshold at ``alpha``: ⌈(n + 1)(1 − α)⌉ ≤ n."""
    check_alpha(alpha)
    return math.ceil((1.0 - alpha) / alpha - 1e-9)


def check_alpha(alpha: float) -> None:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be a number in (0, 1), got {alpha!r}")


def quantile_rank(n: int, alpha: float) -> int:
    """⌈(n + 1)(1 − α)⌉: which smallest of n dev scores is the threshold; :class:`TooFewRows` when it exceeds n."""
    check_alpha(alpha)
    rank = math.ceil((n + 1) * (1.0 - alpha) - 1e-9)  # (9 + 1)·0.9 is 9.000000000000002 in floating point
    if rank > n:
        raise TooFewRows(f"{n} dev rows are too few for alpha = {alpha:g}: it needs at least {min_rows_for(alpha)}")
    return rank


def conformal_quantile(scores: Sequence[float] | np.ndarray, alpha: float) -> float:
    """q̂: the ⌈(n + 1)(1 − α)⌉-th smallest of ``scores`` (the level ⌈(n + 1)(1 − α)⌉ / n quantile)."""
    s = np.sort(np.asarray(scores, dtype=np.float64))
    return float(s[quantile_rank(len(s), alpha) - 1])


# ------------------------------------------------------------------------------------------------ option scores


def option_scores(score: str, probs: np.ndarray) -> np.ndarray:
    """(N, K) non-conformity score each option of each row would have, were it gold; ``probs``: (N, K) rows."""
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] < 2:
        raise ValueError(f"option scores need (N, K ≥ 2) probabilities, got shape {p.shape}")
    if score == "lac":
        return 1.0 - p
    if score == "aps":  # mass of the options at least as probable: Σ_{j: p_j ≥ p_y} p_j
        return np.where(p[:, None, :] >= p[:, :, None], p[:, None, :], 0.0).sum(axis=2)
    if score == "ordinal_hull":  # the level lies between two levels of probability ≥ t for t up to this minimum
        left = np.maximum.accumulate(p, axis=1)
        right = np.maximum.accumulate(p[:, ::-1], axis=1)[:, ::-1]
        return 1.0 - np.minimum(left, right)
    if score == "ordinal_aps":
        return _grown_mass(p)
    raise ValueError(f"unknown conformal score {score!r} (the scores are lac, aps, ordinal_aps, ordinal_hull)")


def _grown_mass(p: np.ndarray) -> np.ndarray:
    """For each level, the mass of the range grown from the most probable level, one neighbour at a time (the more
    probable one; the lower on a tie), at the step that takes the level in. (N, K)."""
    n, k = p.shape
    rows = np.arange(n)
    lo = hi = np.argmax(p, axis=1)
    mass = p[rows, lo].copy()
    out = np.empty_like(p)
    out[rows, lo] = mass
    for _ in range(k - 1):
        left_p = np.where(lo > 0, p[rows, np.maximum(lo - 1, 0)], -1.0)
        right_p = np.where(hi < k - 1, p[rows, np.minimum(hi + 1, k - 1)], -1.0)
        go_left = left_p >= right_p
        lo = np.where(go_left, lo - 1, lo)
        hi = np.where(go_left, hi, hi + 1)
        added = np.where(go_left, lo, hi)
        mass = mass + p[rows, added]
        out[rows, added] = mass
    return out


def gold_scores(score: str, probs: Sequence[np.ndarray], gold: Sequence[int]) -> np.ndarray:
    """The non-conformity score of each row's gold option; rows may differ in K (grouped by K)."""
    out = np.empty(len(probs))
    for index in _by_width(probs).values():
        scores = option_scores(score, np.array([probs[i] for i in index]))
        out[index] = scores[np.arange(len(index)), [gold[i] for i in index]]
    return out


def prediction_sets(score: str, probs: Sequence[np.ndarray], threshold: float) -> list[np.ndarray]:
    """Each row's set: a boolean mask of the options whose score is at most ``threshold``, and always the most
    probable option (so no set is empty)."""
    out: list[np.ndarray] = [np.empty(0, dtype=bool)] * len(probs)
    for index in _by_width(probs).values():
        p = np.array([probs[i] for i in index])
        inside = option_scores(score, p) <= threshold + 1e-12
        inside[np.arange(len(index)), np.argmax(p, axis=1)] = True
        for row, i in enumerate(index):
            out[i] = inside[row]
    return out


def _by_width(probs: Sequence[np.ndarray]) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(probs):
        groups.setdefault(len(p), []).append(i)
    return groups


def fit_threshold(score: str, probs: Sequence[np.ndarray], gold: Sequence[int], alpha: float) -> float:
    """q̂ of ``score`` on these dev rows (:func:`conformal_quantile` of their gold scores)."""
    return conformal_quantile(gold_scores(score, probs, gold), alpha)


def choose_score(
    candidates: Sequence[str], probs: Sequence[np.ndarray], gold: Sequence[int], alpha: float, *, splits: int = 20
) -> tuple[str, dict[str, float]]:
    """The candidate score with the smallest mean set size, measured on dev by ``splits`` random halvings (fit on one
    half, count set sizes on the other; seed 0), and each candidate's measured mean size. The first candidate wins a
    tie and is taken without measuring when dev is too small to halve at ``alpha``."""
    n = len(probs)
    half = n // 2
    if len(candidates) == 1 or half < min_rows_for(alpha):
        return candidates[0], {}
    rng = np.random.default_rng(0)
    orders = [rng.permutation(n) for _ in range(splits)]
    sizes: dict[str, float] = {}
    for score in candidates:
        scores = gold_scores(score, probs, gold)
        measured = []
        for order in orders:
            fit, held = order[:half], order[half:]
            q = conformal_quantile(scores[fit], alpha)
            measured += [float(s.sum()) for s in prediction_sets(score, [probs[i] for i in held], q)]
        sizes[score] = float(np.mean(measured))
    best = min(candidates, key=lambda s: (round(sizes[s], 9), candidates.index(s)))
    return best, sizes


# ------------------------------------------------------------------------------------------ conformal risk control


def risk_controlled_threshold(losses: np.ndarray, thresholds: np.ndarray, alpha: float) -> float:
    """Conformal risk control: the largest t of ``thresholds`` with (n / (n + 1)) R̂_n(t) + 1 / (n + 1) ≤ α, where
    ``losses`` (n, T) holds each dev item's loss in [0, 1] at each threshold and does not fall as t rises (columns
    in the order of ``thresholds``, ascending). :class:`TooFewRows` when even the lowest threshold fails."""
    check_alpha(alpha)
    n = losses.shape[0]
    bound = n / (n + 1.0) * losses.mean(axis=0) + 1.0 / (n + 1.0)
    feasible = np.flatnonzero(bound <= alpha + 1e-12)
    if n == 0 or not len(feasible):
        raise TooFewRows(f"{n} dev rows are too few for alpha = {alpha:g}: it needs at least {min_rows_for(alpha)}")
    return float(thresholds[feasible.max()])


def missed_fraction(best: Sequence[np.ndarray], thresholds: np.ndarray) -> np.ndarray:
    """(n, T) loss of n span questions: the fraction of each one's gold spans that no word reaches at threshold t.
    ``best[i]``: the highest word probability inside each gold span of question i (at least one span each)."""
    values = np.concatenate([np.asarray(b, dtype=np.float64) for b in best])
    starts = np.cumsum([0] + [len(b) for b in best[:-1]])
    missed = np.add.reduceat((values[:, None] < np.asarray(thresholds)[None, :]).astype(float), starts, axis=0)
    return missed / np.array([len(b) for b in best], dtype=float)[:, None]


def span_threshold(best: Sequence[np.ndarray], alpha: float) -> float:
    """The highest word threshold whose rate of missed gold spans is controlled at α (:func:`risk_controlled_threshold`
    over the values the loss changes at: the gold spans' own highest word probabilities)."""
    candidates = np.unique(np.concatenate([np.asarray(b, dtype=np.float64) for b in best])) if best else np.zeros(0)
    t = risk_controlled_threshold(missed_fraction(best, candidates), candidates, alpha)
    return min(max(t, 1e-12), 1.0 - 1e-12)  # a threshold of temperatures.json lies in (0, 1); lower is safe


# ---------------------------------------------------------------------------------------- Learn then Test auto-act


def binomial_p_value(errors: int, n: int, max_risk: float) -> float:
    """P(Binomial(n, ε) ≤ errors): the p-value of "the error rate exceeds ε" after ``errors`` in ``n`` answers."""
    from scipy.stats import binom

    return float(binom.cdf(errors, n, max_risk))


def clopper_pearson(successes: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) two-sided interval of a binomial proportion."""
    from scipy.stats import beta

    if n == 0:
        return 0.0, 1.0
    tail = (1.0 - level) / 2.0
    low = 0.0 if successes == 0 else float(beta.ppf(tail, successes, n - successes + 1))
    high = 1.0 if successes == n else float(beta.ppf(1.0 - tail, successes + 1, n - successes))
    return low, high


def fewest_answers(max_risk: float, delta: float) -> int:
    """The fewest answered rows at which a threshold can pass at all (no error: (1 − ε)^n ≤ δ)."""
    return math.ceil(math.log(delta) / math.log(1.0 - max_risk) - 1e-9)


def learn_then_test(
    confidence: np.ndarray, wrong: np.ndarray, max_risk: float, delta: float, grid: Sequence[float] = AUTO_ACT_GRID
) -> dict[str, float | int | None]:
    """The lowest threshold of ``grid`` (fixed-sequence testing from its most conservative end) whose error rate among
    the rows answered (confidence ≥ threshold) is shown ≤ ``max_risk`` at level ``delta``.

    Thresholds that answer fewer rows than :func:`fewest_answers` are passed over: no outcome of their rows could
    reject, and which ones they are depends on the confidences alone, not on the answers. Returns the threshold (None
    when the first tested one fails), its answered fraction, dev error rate, p-value and Clopper-Pearson upper bound
    (one-sided at 1 − δ) on dev.
    """
    for name, value in (("max_risk", max_risk), ("delta", delta)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
            raise ValueError(f"{name} must be a number in (0, 1), got {value!r}")
    conf, bad = np.asarray(confidence, dtype=np.float64), np.asarray(wrong, dtype=bool)
    from scipy.stats import binom

    order = np.argsort(-conf, kind="stable")
    errors_through = np.r_[0, np.cumsum(bad[order])]  # errors among the i most confident rows
    lams = np.asarray(grid, dtype=np.float64)
    answered = np.searchsorted(-conf[order], -lams, side="right")  # rows with confidence ≥ λ, per λ
    errors = errors_through[answered]
    p_values = binom.cdf(errors, answered, max_risk)
    chosen: dict[str, float | int | None] = {"threshold": None, "answered": 0.0, "dev_risk": None, "p_value": None}
    for i in np.flatnonzero(answered >= fewest_answers(max_risk, delta)):
        if p_values[i] > delta:
            break
        n, e = int(answered[i]), int(errors[i])
        chosen = {"threshold": float(lams[i]), "answered": n / len(conf), "dev_risk": e / n, "p_value": p_values[i]}
        chosen["risk_upper"] = clopper_pearson(e, n, 1.0 - 2.0 * delta)[1]
    return chosen
