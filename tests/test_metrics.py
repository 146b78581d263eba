"""Metrics: exact values on tiny hand cases, edge cases of binning and ties, and payoff thresholds."""

from __future__ import annotations

import numpy as np
import pytest

from mydecide.metrics import (
    accuracy,
    aurc,
    auto_act_threshold,
    brier,
    chance_corrected,
    ece,
    f1_interval,
    log_loss,
    reliability_bins,
    rps,
    selective_curve,
    soft_accuracy,
    summarize,
    threshold_table,
    total_variation,
)


def _rows(*values: list[float]) -> list[np.ndarray]:
    return [np.array(v, dtype=float) for v in values]


# Four questions with different K:
#   r1 q = [0.7, 0.2, 0.1]          gold 0  → right, confidence 0.7
#   r2 q = [0.4, 0.6]               gold 0  → wrong, confidence 0.6
#   r3 q = [0.25, 0.25, 0.25, 0.25] gold 2  → wrong (a tie predicts the first option), confidence 0.25
#   r4 q = [0.1, 0.9]               gold 1  → right, confidence 0.9
PROBS = _rows([0.7, 0.2, 0.1], [0.4, 0.6], [0.25, 0.25, 0.25, 0.25], [0.1, 0.9])
TARGETS = _rows([1, 0, 0], [1, 0], [0, 0, 1, 0], [0, 1])


def test_accuracy_and_chance_corrected() -> None:
    # 2 right of 4 → 0.5. chance = mean(1/3, 1/2, 1/4, 1/2) = (4 + 6 + 3 + 6)/48 = 19/48;
    # (0.5 - 19/48) / (1 - 19/48) = (5/48) / (29/48) = 5/29.
    assert accuracy(PROBS, TARGETS) == 0.5
    assert chance_corrected(0.5, [3, 2, 4, 2]) == pytest.approx(5 / 29)
    assert chance_corrected(1.0, [3, 2]) == pytest.approx(1.0)
    assert chance_corrected(0.5, [2, 2]) == pytest.approx(0.0)


def test_gold_is_the_first_argmax_of_a_tied_target() -> None:
    # Target [0.5, 0.5] → gold is option 0; predicting option 1 is wrong, option 0 right.
    assert accuracy(_rows([0.3, 0.7]), _rows([0.5, 0.5])) == 0.0
    assert accuracy(_rows([0.7, 0.3]), _rows([0.5, 0.5])) == 1.0


def test_log_loss_exact() -> None:
    # -(ln 0.7 + ln 0.4 + ln 0.25 + ln 0.9)/4 = (0.3566749 + 0.9162907 + 1.3862944 + 0.1053605)/4 = 0.6911551
    assert log_loss(PROBS, TARGETS) == pytest.approx(0.6911551, abs=1e-7)
    # Soft target: -(0.7 ln 0.6 + 0.3 ln 0.4) = 0.6324652; a zero probability stays finite (clipped at 1e-15).
    assert log_loss(_rows([0.6, 0.4]), _rows([0.7, 0.3])) == pytest.approx(0.6324652, abs=1e-7)
    assert log_loss(_rows([1.0, 0.0]), _rows([0.0, 1.0])) == pytest.approx(-np.log(1e-15))


def test_brier_exact() -> None:
    # r1: 0.09 + 0.04 + 0.01 = 0.14; r2: 0.36 + 0.36 = 0.72; r3: 3·0.0625 + 0.5625 = 0.75;
    # r4: 0.01 + 0.01 = 0.02; mean = 1.63 / 4 = 0.4075
    assert brier(PROBS, TARGETS) == pytest.approx(0.4075)


def test_rps_exact() -> None:
    # q = [0.2, 0.5, 0.3], gold 1: Q = [0.2, 0.7, 1], Y = [0, 1, 1] → (0.04 + 0.09)/2 = 0.065
    # q = [0.1, 0.9], gold 1: Q = [0.1, 1], Y = [0, 1] → 0.01/1 = 0.01;   mean = 0.0375
    assert rps(_rows([0.2, 0.5, 0.3], [0.1, 0.9]), _rows([0, 1, 0], [0, 1])) == pytest.approx(0.0375)
    # Distance matters: all mass two levels away costs more than one level away.
    assert rps(_rows([0, 0, 1]), _rows([1, 0, 0])) == pytest.approx(1.0)
    assert rps(_rows([0, 1, 0]), _rows([1, 0, 0])) == pytest.approx(0.5)


def test_ece_exact() -> None:
    # Bins of width 0.1: 0.7 → bin 7 (right: |1 - 0.7| = 0.3), 0.6 → bin 6 (wrong: 0.6),
    # 0.25 → bin 2 (wrong: 0.25), 0.9 → bin 9 (right: 0.1). ECE = (0.3 + 0.6 + 0.25 + 0.1)/4 = 0.3125
    assert ece(PROBS, TARGETS) == pytest.approx(0.3125)


def test_ece_averages_within_a_bin_and_puts_certainty_in_the_last_bin() -> None:
    # 0.62 (right) and 0.68 (wrong) share bin 6: conf 0.65, acc 0.5 → gap 0.15 with weight 2/3;
    # confidence exactly 1.0 (right) falls in bin 9: gap 0. ECE = (2/3)·0.15 = 0.1
    probs = _rows([0.62, 0.38], [0.68, 0.32], [1.0, 0.0])
    targets = _rows([1, 0], [0, 1], [1, 0])
    assert ece(probs, targets) == pytest.approx(0.1)
    rb = reliability_bins(probs, targets)
    assert rb.counts.tolist() == [0, 0, 0, 0, 0, 0, 2, 0, 0, 1]
    assert rb.confidence[6] == pytest.approx(0.65) and rb.accuracy[6] == pytest.approx(0.5)
    assert rb.confidence[9] == 1.0 and rb.accuracy[9] == 1.0
    assert np.isnan(rb.confidence[0]) and np.isnan(rb.accuracy[0])
    assert rb.edges.tolist() == pytest.approx([i / 10 for i in range(11)])


def test_ece_bin_edges_belong_to_the_upper_bin() -> None:
    # A confidence of exactly b/10 opens bin b ([b/10, (b+1)/10)), whatever the float rounding of b/10 · 10.
    for b in range(1, 10):
        conf = b / 10
        rest = 1.0 - conf  # spread over enough options that each stays below conf
        k_rest = int(np.ceil(rest / conf)) + 1
        row = np.array([conf] + [rest / k_rest] * k_rest)
        rb = reliability_bins([row], [np.eye(len(row))[0]])
        assert rb.counts[b] == 1, f"confidence {conf} fell outside bin {b}"


def test_total_variation_and_soft_accuracy() -> None:
    # TV: r1 0.5·(0.3 + 0.2 + 0.1) = 0.3; r2 0.6; r3 0.5·(0.75 + 0.75) = 0.75; r4 0.1 → 1.75/4 = 0.4375
    assert total_variation(PROBS, TARGETS) == pytest.approx(0.4375)
    # One-hot targets: soft accuracy = accuracy.
    assert soft_accuracy(PROBS, TARGETS) == pytest.approx(0.5)
    # Soft: predicted option 0 of y = [0.7, 0.3] → 0.7; predicted option 1 of y = [0.5, 0.5] → 0.5; mean 0.6
    assert soft_accuracy(_rows([0.6, 0.4], [0.2, 0.8]), _rows([0.7, 0.3], [0.5, 0.5])) == pytest.approx(0.6)


def test_selective_curve_and_aurc() -> None:
    # By confidence: r4 0.9 right, r1 0.7 right, r2 0.6 wrong, r3 0.25 wrong.
    # Selective accuracy 1, 1, 2/3, 1/2 → risk 0, 0, 1/3, 1/2; AURC = (1/3 + 1/2)/4 = 5/24.
    coverage, sel_acc = selective_curve(PROBS, TARGETS)
    assert coverage.tolist() == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert sel_acc.tolist() == pytest.approx([1.0, 1.0, 2 / 3, 0.5])
    assert aurc(PROBS, TARGETS) == pytest.approx(5 / 24)
    # Confidence that ranks the wrong answers first is worse: swap confidences (wrong answers most confident).
    reversed_probs = _rows([0.6, 0.3, 0.1], [0.1, 0.9], [0.97, 0.01, 0.01, 0.01], [0.45, 0.55])
    # r2' 0.9 wrong, r3' 0.97 wrong, r1' 0.6 right, r4' 0.55 right → risk 1, 1, 2/3, 1/2 → 19/24
    assert aurc(reversed_probs, TARGETS) == pytest.approx((1 + 1 + 2 / 3 + 0.5) / 4)


def test_summarize_keys_values_and_rps_only_on_score_rows() -> None:
    summary = summarize(PROBS, TARGETS, [False, False, False, False])
    assert set(summary) == {
        "n",
        "accuracy",
        "chance_corrected",
        "log_loss",
        "brier",
        "ece",
        "ece_band",
        "rps",
        "total_variation",
        "soft_accuracy",
        "aurc",
    }
    assert summary["n"] == 4
    assert summary["rps"] is None
    assert summary["chance_corrected"] == pytest.approx(5 / 29)
    assert summary["brier"] == pytest.approx(0.4075)
    # Only r1 is a score row: Q = [0.7, 0.9, 1], Y = [1, 1, 1] → (0.09 + 0.01)/2 = 0.05
    assert summarize(PROBS, TARGETS, [True, False, False, False])["rps"] == pytest.approx(0.05)


def test_empty_and_mismatched_inputs_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="at least one"):
        summarize([], [], [])
    with pytest.raises(ValueError, match="row 1"):
        accuracy(_rows([0.5, 0.5], [0.5, 0.5]), _rows([1, 0], [1, 0, 0]))
    with pytest.raises(ValueError, match="2 prediction rows but 1 target rows"):
        brier(_rows([0.5, 0.5], [0.5, 0.5]), _rows([1, 0]))
    with pytest.raises(ValueError, match="is_score"):
        summarize(PROBS, TARGETS, [True])


def test_auto_act_threshold() -> None:
    # (escalate - wrong)/(right - wrong) = (-0.5 + 3)/(1 + 3) = 2.5/4 = 0.625
    assert auto_act_threshold(1.0, -3.0, -0.5) == pytest.approx(0.625)
    assert auto_act_threshold(1.0, -1.0, 0.0) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="greater"):
        auto_act_threshold(-3.0, 1.0, -0.5)
    with pytest.raises(ValueError, match="between"):
        auto_act_threshold(1.0, -3.0, 2.0)
    with pytest.raises(ValueError, match="finite"):
        auto_act_threshold(1.0, float("nan"), 0.0)


def test_threshold_table() -> None:
    # Payoffs +1 / -3 / -0.5. Act when confidence > t.
    # t = 0: all four acted, 2 right 2 wrong → coverage 1, accuracy 0.5, payoff (2 - 6)/4 = -1
    # t = 0.625: r1 (0.7) and r4 (0.9), both right; r2, r3 escalated → payoff (2 - 1)/4 = 0.25
    # t = 0.95: nothing acted → coverage 0, accuracy None, payoff -0.5
    table = threshold_table(PROBS, TARGETS, [0.0, 0.625, 0.95], right=1.0, wrong=-3.0, escalate=-0.5)
    assert table == [
        {"threshold": 0.0, "coverage": 1.0, "accuracy": 0.5, "payoff": -1.0},
        {"threshold": 0.625, "coverage": 0.5, "accuracy": 1.0, "payoff": 0.25},
        {"threshold": 0.95, "coverage": 0.0, "accuracy": None, "payoff": -0.5},
    ]
    # A confidence equal to the threshold escalates (strictly greater acts).
    assert threshold_table(PROBS, TARGETS, [0.7], 1.0, -3.0, -0.5)[0]["coverage"] == 0.25


def test_the_ece_band_is_what_a_calibrated_model_reaches_on_that_many_rows() -> None:
    from mydecide.metrics import ece, ece_band

    rng = np.random.default_rng(0)
    k = 5
    for n in (59, 400):
        probs = [p for p in rng.dirichlet(np.ones(k) * 0.7, size=n)]
        band = ece_band(probs)
        # outcomes drawn from the model itself (perfectly calibrated): its ECE stays under the band ~90% of the time
        under = 0
        for _ in range(300):
            gold = [int(rng.choice(k, p=p)) for p in probs]
            # a calibrated model's ECE bins the top probability, which is right with probability max p
            under += ece(probs, [np.eye(k)[g] for g in gold]) <= band
        assert 0.8 <= under / 300 <= 0.97, (n, under)
    few = ece_band([np.array([0.4, 0.3, 0.3])] * 59)
    many = ece_band([np.array([0.4, 0.3, 0.3])] * 1000)
    assert few > 2 * many > 0
    assert ece_band([np.array([1.0, 0.0])] * 10) == 0.0  # certain and calibrated: no room for an error


# ------------------------------------------------------------------------------------------ ordinal (score) metrics


def _one_hot(level: int, k: int) -> np.ndarray:
    y = np.zeros(k)
    y[level] = 1.0
    return y


def test_ordinal_summary_of_a_perfect_model_and_of_the_base_rate() -> None:
    from mydecide.metrics import ordinal_summary

    golds = [0, 1, 2, 2, 4, 3, 1, 0]
    targets = [_one_hot(g, 5) for g in golds]
    perfect = ordinal_summary(targets, targets)
    assert perfect["mae"] == 0.0 and perfect["spearman"] == pytest.approx(1.0) and perfect["within_one"] == 1.0
    assert perfect["rps"] == 0.0 and perfect["rps_skill"] == 1.0 and perfect["threshold_ece"] == 0.0
    assert perfect["unimodal_share"] == 1.0 and perfect["n"] == 8
    base_rate = np.mean(targets, axis=0)
    flat = ordinal_summary([base_rate] * len(targets), targets)
    assert flat["rps_skill"] == pytest.approx(0.0, abs=1e-12)
    assert flat["spearman"] is None  # one expected level for every question: no ranking to correlate


def test_ordinal_summary_by_hand() -> None:
    from mydecide.metrics import ordinal_summary

    # question 1: E = 0.5, gold 2 (MAE 1.5; argmax 0 is two levels off); question 2: E = 1.4, gold 1 (MAE 0.4)
    probs = [np.array([0.5, 0.5, 0.0]), np.array([0.1, 0.4, 0.5])]
    targets = [_one_hot(2, 3), _one_hot(1, 3)]
    out = ordinal_summary(probs, targets)
    assert out["mae"] == pytest.approx((1.5 + 0.4) / 2)
    assert out["within_one"] == 0.5
    assert out["spearman"] == pytest.approx(-1.0)  # the higher expected level has the lower gold level
    # RPS: q1 cumulatives (0.5, 1) vs (0, 0) → (0.25 + 1) / 2; q2 (0.1, 0.5) vs (0, 1) → (0.01 + 0.25) / 2
    assert out["rps"] == pytest.approx(((0.25 + 1.0) / 2 + (0.01 + 0.25) / 2) / 2)


def test_threshold_ece_of_a_model_sure_of_the_top_level_when_levels_are_uniform() -> None:
    from mydecide.metrics import ordinal_summary

    targets = [_one_hot(g, 3) for g in (0, 1, 2) * 10]
    sure = [np.array([0.0, 0.0, 1.0])] * 30
    # P(Y ≥ 1) = 1 where 2/3 are ≥ 1 (ECE 1/3); P(Y ≥ 2) = 1 where 1/3 are (ECE 2/3): the mean is 1/2
    assert ordinal_summary(sure, targets)["threshold_ece"] == pytest.approx(0.5)


def test_threshold_ece_band_tells_a_calibrated_ordinal_model_from_an_overconfident_one() -> None:
    from mydecide.metrics import ordinal_summary

    rng = np.random.default_rng(3)
    inside = {"calibrated": 0, "overconfident": 0}
    for _trial in range(40):
        probs = [rng.dirichlet(np.ones(5)) for _ in range(300)]
        targets = [_one_hot(int(rng.choice(5, p=q)), 5) for q in probs]  # levels drawn from the model itself
        sharp = [q**2 / np.sum(q**2) for q in probs]  # the same answers, said with more confidence
        for name, predicted in (("calibrated", probs), ("overconfident", sharp)):
            out = ordinal_summary(predicted, targets)
            inside[name] += out["threshold_ece"] <= out["threshold_ece_band"]
    assert inside["calibrated"] >= 32  # each threshold's band is a 90th percentile; their mean is inside more often
    assert inside["overconfident"] <= 4


@pytest.mark.parametrize(
    ("q", "expected"),
    [([0.1, 0.5, 0.4], True), ([0.4, 0.1, 0.5], False), ([0.3, 0.3, 0.4], True), ([0.5, 0.2, 0.2, 0.1], True)],
)
def test_unimodal(q: list[float], expected: bool) -> None:
    from mydecide.metrics import unimodal

    assert unimodal(np.array(q)) is expected


def test_f1_interval_holds_the_pooled_f1_and_narrows_with_more_questions() -> None:
    rng = np.random.default_rng(3)
    few = np.array([[rng.integers(0, 4), rng.integers(0, 2), rng.integers(0, 2)] for _ in range(20)])
    many = np.concatenate([few] * 20)
    tp, fp, fn = few.sum(axis=0)
    pooled = 2 * tp / (2 * tp + fp + fn)
    low, high = f1_interval(few)
    assert 0.0 <= low < pooled < high <= 1.0
    low_many, high_many = f1_interval(many)
    assert high_many - low_many < (high - low) / 2  # 20× the questions: about 1/√20 the width
    assert f1_interval(few) == (low, high)  # seeded: the same report twice
    assert f1_interval(np.array([[3, 0, 0]] * 5)) == (1.0, 1.0)  # every span found, nothing else
    assert f1_interval(np.zeros((4, 3))) == (1.0, 1.0)  # nothing to find, nothing found
