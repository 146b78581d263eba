"""Scoring rules: exact values on hand-computed rows, masking, and strict properness."""

from __future__ import annotations

import math

import pytest
import torch

from mydecide.training.scoring_rules import (
    brier_score,
    composite_score,
    log_score,
    ranked_probability_score,
    spherical_score,
)

RULES = [log_score, spherical_score, brier_score, ranked_probability_score]


def _t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


# Row A: q = [0.5, 0.25, 0.25], hard label on option 1.
# Row B: q = [0.6, 0.4], soft label y = [0.7, 0.3] (padded to K = 3 with a masked third option).
PROBS = _t([[0.5, 0.25, 0.25], [0.6, 0.4, 0.0]])
TARGETS = _t([[0.0, 1.0, 0.0], [0.7, 0.3, 0.0]])
MASK = torch.tensor([[True, True, True], [True, True, False]])


def test_log_score_exact() -> None:
    # A: log 0.25 = -1.3862943611198906
    # B: 0.7·log 0.6 + 0.3·log 0.4 = 0.7·(-0.5108256) + 0.3·(-0.9162907) = -0.6324652
    expected = [math.log(0.25), 0.7 * math.log(0.6) + 0.3 * math.log(0.4)]
    assert log_score(PROBS, TARGETS, MASK).tolist() == pytest.approx(expected, abs=1e-12)
    assert expected[1] == pytest.approx(-0.6324652, abs=1e-7)


def test_spherical_score_exact() -> None:
    # A: ‖q‖ = sqrt(0.25 + 0.0625 + 0.0625) = sqrt(0.375); S = 0.25 / sqrt(0.375) = 0.4082483
    # B: ‖q‖ = sqrt(0.36 + 0.16) = sqrt(0.52) = 0.7211103;
    #    S = (0.7·0.6 + 0.3·0.4) / 0.7211103 = 0.54 / 0.7211103 = 0.7488453
    expected = [0.25 / math.sqrt(0.375), 0.54 / math.sqrt(0.52)]
    assert spherical_score(PROBS, TARGETS, MASK).tolist() == pytest.approx(expected, abs=1e-12)
    assert expected == pytest.approx([0.4082483, 0.7488453], abs=1e-7)


def test_brier_score_exact() -> None:
    # A: 0.5² + 0.75² + 0.25² = 0.25 + 0.5625 + 0.0625 = 0.875
    # B: 0.1² + 0.1² = 0.02
    assert brier_score(PROBS, TARGETS, MASK).tolist() == pytest.approx([0.875, 0.02], abs=1e-12)


def test_rps_exact() -> None:
    # A: Q = [0.5, 0.75, 1], Y = [0, 1, 1]; (0.25 + 0.0625 + 0) / (3 - 1) = 0.15625
    # B: Q = [0.6, 1], Y = [0.7, 1]; 0.01 / (2 - 1) = 0.01  (K counts valid options only)
    assert ranked_probability_score(PROBS, TARGETS, MASK).tolist() == pytest.approx([0.15625, 0.01], abs=1e-12)


def test_rps_is_order_sensitive() -> None:
    # Same mass on a wrong level, further away → worse: gold level 0, q on level 1 vs level 2.
    # near: Q = [0, 1, 1], Y = [1, 1, 1] → 1/2; far: Q = [0, 0, 1] → (1 + 1)/2 = 1.
    q = _t([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    y = _t([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    mask = torch.ones(2, 3, dtype=torch.bool)
    assert ranked_probability_score(q, y, mask).tolist() == pytest.approx([0.5, 1.0])


def test_composite_exact() -> None:
    # A as a score question: -1.3862944 + 0.5·0.4082483 - 0.15625 = -1.3384202
    # B as a choice question: -0.6324652 + 0.5·0.7488453 = -0.2580425
    is_score = torch.tensor([True, False])
    got = composite_score(PROBS, TARGETS, MASK, is_score).tolist()
    expected = [
        math.log(0.25) + 0.5 * 0.25 / math.sqrt(0.375) - 0.15625,
        0.7 * math.log(0.6) + 0.3 * math.log(0.4) + 0.5 * 0.54 / math.sqrt(0.52),
    ]
    assert got == pytest.approx(expected, abs=1e-12)
    assert expected == pytest.approx([-1.3384202, -0.2580425], abs=1e-7)


def test_composite_best_value_is_half() -> None:
    # A certain, correct answer: log 1 = 0, spherical 1, RPS 0 → 0.5, for choice and score rows alike.
    q = _t([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    mask = torch.ones(2, 3, dtype=torch.bool)
    got = composite_score(q, q.clone(), mask, torch.tensor([False, True]))
    assert got.tolist() == pytest.approx([0.5, 0.5], abs=1e-12)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("position", [0, 1, 3])
def test_padded_option_never_changes_a_result(rule, position: int) -> None:
    # Insert a padded option at any position, holding zeros (the contract) or junk: the score is unchanged.
    q = _t([[0.2, 0.5, 0.3]])
    y = _t([[0.1, 0.6, 0.3]])
    base = rule(q, y, torch.ones(1, 3, dtype=torch.bool))
    for junk in (0.0, 0.9):
        q_pad = torch.cat([q[:, :position], torch.full((1, 1), junk, dtype=q.dtype), q[:, position:]], dim=1)
        y_pad = torch.cat([y[:, :position], torch.full((1, 1), junk, dtype=y.dtype), y[:, position:]], dim=1)
        mask = torch.ones(1, 4, dtype=torch.bool)
        mask[0, position] = False
        assert rule(q_pad, y_pad, mask).tolist() == pytest.approx(base.tolist(), abs=1e-12)


def test_zero_probability_gives_finite_values_and_gradients() -> None:
    # 0·log 0 = 0 (no NaN); a zero probability on the gold option is a large, finite penalty.
    q = _t([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]).requires_grad_()
    y = _t([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    mask = torch.ones(2, 3, dtype=torch.bool)
    s = composite_score(q, y, mask, torch.tensor([True, True]))
    assert torch.isfinite(s).all()
    assert s[0].item() == pytest.approx(0.5)
    assert s[1].item() < -700  # log of float64's smallest normal ≈ -708
    s.sum().backward()
    assert torch.isfinite(q.grad).all()


def test_shape_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="same"):
        brier_score(_t([[0.5, 0.5]]), _t([[1.0, 0.0, 0.0]]), torch.ones(1, 2, dtype=torch.bool))


def _expected_score(rule, q: torch.Tensor, p: torch.Tensor, is_score: bool = False) -> torch.Tensor:
    """E_{j ~ p} S(q, e_j) for each candidate row of q (N, K): the honest definition of an expected score."""
    n, k = q.shape
    outcomes = torch.eye(k, dtype=q.dtype)  # (K, K) the one-hot outcomes
    q_rep = q.repeat_interleave(k, dim=0)  # (N·K, K)
    y_rep = outcomes.repeat(n, 1)  # (N·K, K)
    mask = torch.ones(n * k, k, dtype=torch.bool)
    if rule is composite_score:
        scores = rule(q_rep, y_rep, mask, torch.full((n * k,), is_score))
    else:
        scores = rule(q_rep, y_rep, mask)
    return (scores.reshape(n, k) * p).sum(dim=1)  # (N,)


@pytest.mark.parametrize(
    ("rule", "higher_is_better"),
    [(log_score, True), (spherical_score, True), (brier_score, False), (ranked_probability_score, False)],
)
def test_rules_are_strictly_proper(rule, higher_is_better: bool) -> None:
    # For several true distributions p, reporting p beats every one of many other reports q
    # (random Dirichlet draws and small perturbations of p), strictly.
    gen = torch.Generator().manual_seed(0)
    for k in (2, 4, 7):
        for _ in range(5):
            p = torch.distributions.Dirichlet(torch.ones(k, dtype=torch.float64)).sample()
            far = torch.distributions.Dirichlet(torch.ones(k, dtype=torch.float64)).sample((300,))
            near = (p.log() + 0.05 * torch.randn(300, k, generator=gen, dtype=torch.float64)).softmax(dim=1)
            candidates = torch.cat([far, near])  # (600, K)
            best = _expected_score(rule, p[None, :], p)[0]
            others = _expected_score(rule, candidates, p)
            if higher_is_better:
                assert (others < best).all()
            else:
                assert (others > best).all()


def test_composite_is_strictly_proper_for_score_questions() -> None:
    torch.manual_seed(1)
    for is_score in (False, True):
        p = torch.distributions.Dirichlet(torch.ones(5, dtype=torch.float64)).sample()
        candidates = torch.distributions.Dirichlet(torch.ones(5, dtype=torch.float64)).sample((500,))
        best = _expected_score(composite_score, p[None, :], p, is_score)[0]
        assert (_expected_score(composite_score, candidates, p, is_score) < best).all()


def test_properness_check_catches_an_improper_rule() -> None:
    # Control: the linear score Σ y q is improper (it rewards putting all mass on the likeliest option),
    # and the same comparison shows it: a one-hot report beats the truthful one.
    def linear_score(q: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return (q * y * mask).sum(dim=-1)

    p = _t([[0.6, 0.3, 0.1]])[0]
    truthful = _expected_score(linear_score, p[None, :], p)[0]  # 0.36 + 0.09 + 0.01 = 0.46
    one_hot = _expected_score(linear_score, _t([[1.0, 0.0, 0.0]]), p)[0]  # 0.6
    assert truthful.item() == pytest.approx(0.46)
    assert one_hot.item() == pytest.approx(0.6)
    assert one_hot > truthful
