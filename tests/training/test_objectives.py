"""Objectives: proper's minimum, ce against torch, rlcd's schedule, noise and gradient direction."""

from __future__ import annotations

from typing import get_args

import pytest
import torch
import torch.nn.functional as F

from mydecide.commands.train import OBJECTIVE_KINDS
from mydecide.config import CeObjective, Objective, ProperObjective, RlcdObjective
from mydecide.training.objectives import (
    OBJECTIVES,
    centred_noise,
    cross_entropy_loss,
    loss_for,
    proper_loss,
    rlcd_loss,
    rlcd_sigma,
)

RLCD = RlcdObjective()  # the recipe's defaults: group_size 8, sigma 1.0 → 0.3
RLCD_SETTINGS = {"group_size": RLCD.group_size, "sigma_start": RLCD.sigma_start, "sigma_end": RLCD.sigma_end}


def test_the_mapping_covers_every_objective_kind_a_recipe_can_name() -> None:
    kinds = {model.model_fields["kind"].default for model in get_args(Objective)}
    assert set(OBJECTIVES) == kinds == {"proper", "ce", "rlcd"}
    assert OBJECTIVE_KINDS == "proper | ce | rlcd"  # `mydecide train --objective`'s help, from the same union
    assert loss_for(ProperObjective()) is proper_loss
    assert loss_for(CeObjective()) is cross_entropy_loss


def test_rlcd_from_the_mapping_uses_the_recipe_settings() -> None:
    logits, targets, mask, is_score = _rows()
    settings = RlcdObjective(group_size=3, sigma_start=2.0, sigma_end=0.5)
    mapped = loss_for(settings)(
        logits, targets, mask, is_score, progress=0.4, generator=torch.Generator().manual_seed(3)
    )
    direct = rlcd_loss(
        logits,
        targets,
        mask,
        is_score,
        progress=0.4,
        generator=torch.Generator().manual_seed(3),
        group_size=3,
        sigma_start=2.0,
        sigma_end=0.5,
    )
    assert mapped.item() == direct.item()
    other = rlcd_loss(
        logits, targets, mask, is_score, progress=0.4, generator=torch.Generator().manual_seed(3), **RLCD_SETTINGS
    )
    assert mapped.item() != other.item()


def test_proper_minimum_is_minus_half_for_a_certain_correct_answer() -> None:
    # Huge logit on the gold option: log score 0, spherical 1, RPS 0 → composite 0.5 → loss -0.5.
    # Row 0 choice (K = 3), row 1 score (K = 4), row 2 choice with a padded option holding a large junk logit.
    logits = torch.tensor([[0.0, 60.0, 0.0, 0.0], [0.0, 0.0, 0.0, 60.0], [60.0, 0.0, 99.0, 0.0]])
    targets = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True, False], [True] * 4, [True, True, False, True]])
    is_score = torch.tensor([False, True, False])
    loss = proper_loss(logits, targets, mask, is_score, progress=0.0)
    assert loss.item() == pytest.approx(-0.5, abs=1e-4)


def test_proper_loss_exact_on_uniform_logits() -> None:
    # Equal logits over K = 2 valid options: q = [0.5, 0.5], gold option 0, a choice question.
    # log 0.5 = -0.6931472; spherical 0.5 / sqrt(0.5) = 0.7071068;
    # composite = -0.6931472 + 0.5·0.7071068 = -0.3395938, so the loss is +0.3395938.
    logits = torch.tensor([[3.0, 3.0, -7.0]], dtype=torch.float64)
    targets = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False]])
    loss = proper_loss(logits, targets, mask, torch.tensor([False]), progress=0.3)
    assert loss.item() == pytest.approx(0.3395938, abs=1e-7)


def test_proper_loss_decreases_along_its_gradient_and_padding_gets_none() -> None:
    logits = torch.tensor([[0.3, -0.2, 1.0, 5.0]], dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([[0.2, 0.7, 0.1, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, False]])
    loss = proper_loss(logits, targets, mask, torch.tensor([True]), progress=0.0)
    loss.backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
    assert logits.grad[0, 3].item() == 0.0
    with torch.no_grad():
        stepped = proper_loss(logits - 0.1 * logits.grad, targets, mask, torch.tensor([True]), progress=0.0)
    assert stepped.item() < loss.item()


def test_ce_equals_torch_cross_entropy_for_hard_labels() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    gold = torch.tensor([0, 4, 2, 2, 1, 3])
    targets = F.one_hot(gold, 5).to(torch.float64)
    mask = torch.ones(6, 5, dtype=torch.bool)
    ours = cross_entropy_loss(logits, targets, mask, torch.zeros(6, dtype=torch.bool), progress=0.0)
    assert ours.item() == pytest.approx(F.cross_entropy(logits, gold).item(), abs=1e-12)
    # Padding a sixth option (junk logit, masked) changes nothing.
    padded = torch.cat([logits, torch.full((6, 1), 40.0, dtype=torch.float64)], dim=1)
    padded_targets = torch.cat([targets, torch.zeros(6, 1, dtype=torch.float64)], dim=1)
    padded_mask = torch.cat([mask, torch.zeros(6, 1, dtype=torch.bool)], dim=1)
    again = cross_entropy_loss(padded, padded_targets, padded_mask, torch.zeros(6, dtype=torch.bool), progress=0.0)
    assert again.item() == pytest.approx(ours.item(), abs=1e-12)


def test_ce_with_soft_labels_matches_torch_probability_targets() -> None:
    logits = torch.tensor([[1.0, 2.0, 0.5]], dtype=torch.float64)
    targets = torch.tensor([[0.2, 0.5, 0.3]], dtype=torch.float64)
    ours = cross_entropy_loss(logits, targets, torch.ones(1, 3, dtype=torch.bool), torch.tensor([False]), progress=0)
    assert ours.item() == pytest.approx(F.cross_entropy(logits, targets).item(), abs=1e-12)


def test_rlcd_sigma_schedule() -> None:
    # Linear from 1.0 to 0.3: at 0.5 it is 1.0 + (0.3 - 1.0)·0.5 = 0.65.
    assert rlcd_sigma(0.0, RLCD.sigma_start, RLCD.sigma_end) == pytest.approx(1.0)
    assert rlcd_sigma(0.5, RLCD.sigma_start, RLCD.sigma_end) == pytest.approx(0.65)
    assert rlcd_sigma(1.0, RLCD.sigma_start, RLCD.sigma_end) == pytest.approx(0.3)
    assert rlcd_sigma(0.5, sigma_start=2.0, sigma_end=0.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="progress"):
        rlcd_sigma(1.5, RLCD.sigma_start, RLCD.sigma_end)


def test_centred_noise_sums_to_zero_over_valid_options_and_spares_padding() -> None:
    mask = torch.tensor([[True, True, True, False, False], [True] * 5, [False, True, True, True, False]])
    gen = torch.Generator().manual_seed(0)
    noise = centred_noise(mask, 4000, 0.65, generator=gen, dtype=torch.float64)  # (3, 4000, 5)
    assert noise.shape == (3, 4000, 5)
    assert noise.sum(dim=-1).abs().max().item() < 1e-12
    assert (noise[~mask[:, None, :].expand_as(noise)] == 0).all()
    # Centring K i.i.d. N(0, σ²) leaves per-option variance σ²·(K - 1)/K: here 0.4225·2/3 = 0.2817 for K = 3.
    assert noise[0, :, 0].var().item() == pytest.approx(0.65**2 * 2 / 3, rel=0.06)


def _rows() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Four questions: choice hard, choice soft with padding, score hard (K = 5), score soft with padding."""
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(4, 5, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[True, True, True, True, False], [True] * 5, [True] * 5, [True, True, True, False, False]])
    targets = torch.tensor(
        [
            [0.0, 0.0, 1.0, 0.0, 0.0],
            [0.1, 0.5, 0.0, 0.2, 0.2],
            [0.0, 0.0, 0.0, 1.0, 0.0],
            [0.2, 0.3, 0.5, 0.0, 0.0],
        ],
        dtype=torch.float64,
    )
    is_score = torch.tensor([False, False, True, True])
    return logits, targets, mask, is_score


def test_rlcd_gradient_follows_the_composite_gradient() -> None:
    # With many copies and small noise, E[advantage · ∂log N/∂z] points along ∇z(-composite loss).
    logits, targets, mask, is_score = _rows()
    z_rl = logits.clone().requires_grad_()
    gen = torch.Generator().manual_seed(5)
    rl = rlcd_loss(
        z_rl, targets, mask, is_score, progress=1.0, generator=gen, group_size=20000, sigma_start=1.0, sigma_end=0.05
    )
    rl.backward()
    z_pr = logits.clone().requires_grad_()
    proper_loss(z_pr, targets, mask, is_score, progress=1.0).backward()
    assert z_rl.grad is not None and z_pr.grad is not None
    for i in range(4):
        g_rl, g_pr = z_rl.grad[i][mask[i]], z_pr.grad[i][mask[i]]
        cosine = F.cosine_similarity(g_rl, g_pr, dim=0).item()
        assert cosine >= 0.99, f"row {i}: cosine {cosine:.4f}"
    assert (z_rl.grad[~mask] == 0).all()


def test_rlcd_is_reproducible_with_a_generator_and_tolerates_junk_padding() -> None:
    logits, targets, mask, is_score = _rows()
    junk = logits.masked_fill(~mask, float("-inf"))
    a = rlcd_loss(
        junk, targets, mask, is_score, progress=0.2, generator=torch.Generator().manual_seed(1), **RLCD_SETTINGS
    )
    b = rlcd_loss(
        logits, targets, mask, is_score, progress=0.2, generator=torch.Generator().manual_seed(1), **RLCD_SETTINGS
    )
    assert torch.isfinite(a) and a.item() == b.item()
    with pytest.raises(ValueError, match="group_size"):
        rlcd_loss(logits, targets, mask, is_score, progress=0.0, group_size=1, sigma_start=1.0, sigma_end=0.3)


def test_rlcd_gradient_vanishes_at_the_truthful_report_and_not_elsewhere() -> None:
    # Target [0.5, 0.5]: at logits [0, 0] the report is truthful, the composite is at its maximum and its
    # gradient is 0, so the estimate is only noise (std ≈ sqrt(0.5 / 20000) ≈ 0.005). At logits [1, -1]
    # the report is over-confident in option 0, and descent must lower z_0 relative to z_1.
    targets = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    grads = []
    for start in ([0.0, 0.0], [1.0, -1.0]):
        z = torch.tensor([start], dtype=torch.float64, requires_grad=True)
        gen = torch.Generator().manual_seed(2)
        rlcd_loss(
            z,
            targets,
            mask,
            torch.tensor([False]),
            progress=0.0,
            generator=gen,
            **{**RLCD_SETTINGS, "group_size": 20000},
        ).backward()
        assert z.grad is not None
        grads.append(z.grad[0])
    assert grads[0].abs().max().item() < 0.02
    assert grads[1][0].item() > 0.3 and grads[1][1].item() < -0.3


@pytest.mark.parametrize("objective", [ProperObjective(), RLCD, CeObjective()])
def test_bf16_logits_give_a_float32_loss_and_a_bf16_gradient(objective: Objective) -> None:
    loss_fn = loss_for(objective)
    logits, targets, mask, is_score = _rows()
    z16 = logits.to(torch.bfloat16).requires_grad_()
    gen = torch.Generator().manual_seed(0)
    loss = loss_fn(z16, targets.float(), mask, is_score, progress=0.5, generator=gen)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert z16.grad is not None and z16.grad.dtype == torch.bfloat16 and torch.isfinite(z16.grad).all()
    # Same value as in float32 up to the rounding of the logits to bf16.
    z32 = z16.detach().float()
    gen = torch.Generator().manual_seed(0)
    ref = loss_fn(z32, targets.float(), mask, is_score, progress=0.5, generator=gen)
    assert loss.item() == pytest.approx(ref.item(), abs=1e-5)
