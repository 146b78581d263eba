"""Training objectives over option logits.

``OBJECTIVES`` maps every ``objective.kind`` of a training recipe to the loss its settings give (:func:`loss_for`);
every loss has the same signature::

    fn(logits, targets, mask, is_score, *, progress, generator=None) -> scalar loss

- ``logits``   (B, K) option logits z; padded positions hold anything (they are masked to -inf here),
- ``targets``  (B, K) target distributions y over the valid options (soft labels first-class),
- ``mask``     (B, K) bool, True for a real option,
- ``is_score`` (B,) bool, True for score questions (ordered options, charged the RPS),
- ``progress`` in [0, 1], the fraction of training done (only ``rlcd`` uses it),
- ``generator`` a torch.Generator for the noise of ``rlcd`` (the others are deterministic), on the
  device of ``mask``.

Half-precision logits are upcast to float32 inside (the loss is computed on (B, K) values only).

Losses are minimised. ``proper`` is the negated composite proper score, whose best value is -0.5, so
negative losses are normal and expected for a model that is confident and right.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from mydecide.training.scoring_rules import composite_score

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from mydecide.config import Objective, RlcdObjective
    from mydecide.training.batches import TrainBatch

Loss = Callable[..., "Tensor"]


def _full_precision(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """Upcast bf16/fp16 option logits and targets to float32: they are only (B, K), and logs, norms and
    cumulative sums of probabilities lose too much in half precision. The gradient flows back through
    the cast."""
    import torch

    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return logits, targets.to(logits.dtype)


def masked_logits(logits: Tensor, mask: Tensor) -> Tensor:
    """Logits with padded options set to -inf, so a softmax gives them exactly 0. (B, K)"""
    return logits.masked_fill(~mask, float("-inf"))


def proper_loss(
    logits: Tensor,
    targets: Tensor,
    mask: Tensor,
    is_score: Tensor,
    *,
    progress: float,
    generator: torch.Generator | None = None,
) -> Tensor:
    """−mean(S_log + 0.5·S_sph − [score]·RPS) of softmax(z), the default objective.

    The composite score is at most 0 + 0.5·1 − 0 = 0.5 (log score 0, spherical score 1, RPS 0 for a certain,
    correct answer), so the loss is bounded below by −0.5 and is negative once the model is good: that is
    normal, not a bug. The log term uses log_softmax, which keeps a gradient even where q underflows.
    """
    del progress, generator  # deterministic and schedule-free
    logits, targets = _full_precision(logits, targets)
    z = masked_logits(logits, mask)  # (B, K)
    probs = z.softmax(dim=-1)  # (B, K)
    log_probs = z.log_softmax(dim=-1)  # (B, K), -inf at padded options (masked inside)
    return -composite_score(probs, targets, mask, is_score, log_probs=log_probs).mean()


def cross_entropy_loss(
    logits: Tensor,
    targets: Tensor,
    mask: Tensor,
    is_score: Tensor,
    *,
    progress: float,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Soft cross-entropy −mean Σ_k y_k log softmax(z)_k, the ablation baseline (no spherical, no RPS)."""
    import torch

    del is_score, progress, generator
    logits, targets = _full_precision(logits, targets)
    log_probs = masked_logits(logits, mask).log_softmax(dim=-1)  # (B, K)
    terms = torch.where(mask, targets * log_probs, torch.zeros_like(log_probs))  # (B, K), no 0·(-inf)
    return -terms.sum(dim=-1).mean()


def rlcd_sigma(progress: float, sigma_start: float, sigma_end: float) -> float:
    """Noise scale of ``rlcd``: linear from ``sigma_start`` at progress 0 to ``sigma_end`` at progress 1."""
    if not 0.0 <= progress <= 1.0:
        raise ValueError(f"progress must be in [0, 1], got {progress}")
    return sigma_start + (sigma_end - sigma_start) * progress


def centred_noise(
    mask: Tensor,
    group_size: int,
    sigma: float,
    *,
    generator: torch.Generator | None = None,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """Gaussian noise N(0, σ²) on the valid options, centred across them; 0 on padded options. (B, G, K)

    Centring removes the component along the all-ones direction, to which the softmax is blind, so no
    sample is spent on a perturbation that cannot change the probabilities.
    """
    import torch

    b, k = mask.shape
    noise = torch.randn((b, group_size, k), generator=generator, device=mask.device, dtype=dtype) * sigma
    valid = mask[:, None, :].expand(b, group_size, k)  # (B, G, K)
    noise = noise.masked_fill(~valid, 0.0)
    mean = noise.sum(dim=-1, keepdim=True) / valid.sum(dim=-1, keepdim=True).clamp_min(1)  # (B, G, 1)
    return (noise - mean).masked_fill(~valid, 0.0)


def rlcd_loss(
    logits: Tensor,
    targets: Tensor,
    mask: Tensor,
    is_score: Tensor,
    *,
    progress: float,
    generator: torch.Generator | None = None,
    group_size: int,
    sigma_start: float,
    sigma_end: float,
) -> Tensor:
    """Group-relative policy gradient on perturbed logits (Laya-style RLCD), no cross-entropy term.

    For each question, G copies ``sample = z.detach() + ε`` with centred noise ε of scale σ(progress) are
    rewarded with the composite score of softmax(sample); the group-normalised advantage (reward − group
    mean) / (group std + 1e-6) weights the Gaussian log-density log N(sample; z, σ²) (summed over the valid
    options), through which alone z gets its gradient. In expectation the gradient follows the gradient
    of the composite score (a smoothed version of it), so this maximises the same proper score as
    ``proper`` through rewards only. The group std is the population std over the G copies.
    """
    import torch

    if group_size < 2:
        raise ValueError(f"rlcd needs group_size >= 2 to form an advantage, got {group_size}")
    sigma = rlcd_sigma(progress, sigma_start, sigma_end)
    logits, targets = _full_precision(logits, targets)
    b, k = logits.shape
    z = torch.where(mask, logits, torch.zeros_like(logits))  # (B, K), finite everywhere
    eps = centred_noise(mask, group_size, sigma, generator=generator, dtype=logits.dtype)  # (B, G, K)
    sample = z.detach()[:, None, :] + eps  # (B, G, K)
    valid = mask[:, None, :].expand(b, group_size, k)  # (B, G, K)

    with torch.no_grad():
        flat = masked_logits(sample, valid).reshape(b * group_size, k)  # (B·G, K)
        reward = composite_score(
            flat.softmax(dim=-1),
            targets.repeat_interleave(group_size, dim=0),
            valid.reshape(b * group_size, k),
            is_score.repeat_interleave(group_size, dim=0),
            log_probs=flat.log_softmax(dim=-1),
        ).reshape(b, group_size)  # (B, G)
        mean = reward.mean(dim=1, keepdim=True)  # (B, 1)
        std = reward.std(dim=1, unbiased=False, keepdim=True)  # (B, 1)
        advantage = (reward - mean) / (std + 1e-6)  # (B, G)

    # log N(sample; z, σ²) summed over the valid options; (B, G)
    k_valid = mask.sum(dim=-1).to(logits.dtype)  # (B,)
    sq = torch.where(valid, (sample - z[:, None, :]) ** 2, torch.zeros_like(sample)).sum(dim=-1)  # (B, G)
    log_density = -sq / (2.0 * sigma**2) - k_valid[:, None] * (math.log(sigma) + 0.5 * math.log(2.0 * math.pi))
    return -(advantage * log_density).mean()


def _rlcd(objective: RlcdObjective) -> Loss:
    return partial(
        rlcd_loss, group_size=objective.group_size, sigma_start=objective.sigma_start, sigma_end=objective.sigma_end
    )


OBJECTIVES: dict[str, Callable[[Any], Loss]] = {
    "proper": lambda objective: proper_loss,
    "ce": lambda objective: cross_entropy_loss,
    "rlcd": _rlcd,
}
"""The one mapping from a training recipe's ``objective.kind`` to its loss: each entry takes the recipe's objective
settings (``config.Objective``, one model per kind)."""


def loss_for(objective: Objective) -> Loss:
    """The loss that the recipe's ``objective`` trains with."""
    return OBJECTIVES[objective.kind](objective)


def batch_loss(
    module: Any, tb: TrainBatch, loss: Loss, *, progress: float, generator: torch.Generator | None = None
) -> Tensor:
    """The loss of one training batch through one forward call of ``module``: ``loss`` on its questions' option
    logits, and on each span question's word × label reads as yes / no rows (d, 0) against (y, 1 − y), since
    softmax((d, 0)) = (sigmoid d, 1 − sigmoid d): the proper objective charges every cell its log and spherical
    score, ``ce`` its binary log loss. Every question weighs the same, whatever its number of words and labels."""
    import torch

    if tb.spans is None:
        return loss(
            tb.logits(module(tb.batch)), tb.targets, tb.mask, tb.is_score, progress=progress, generator=generator
        )
    option_logits, reads = module(tb.batch, tb.spans)  # (B, K) or None; (M,) yes − no per read
    total, count = reads.sum() * 0.0, 0
    if option_logits is not None:
        kept = loss(tb.logits(option_logits), tb.targets, tb.mask, tb.is_score, progress=progress, generator=generator)
        total, count = total + kept * len(tb.units), len(tb.units)
    rows = torch.stack([reads, torch.zeros_like(reads)], dim=-1)  # (M, 2)
    y = tb.spans.targets.to(rows.dtype)
    targets = torch.stack([y, 1.0 - y], dim=-1)  # (M, 2)
    mask = torch.ones_like(rows, dtype=torch.bool)
    plain = torch.zeros(len(reads), dtype=torch.bool, device=reads.device)
    for question in range(tb.spans.count):
        at = tb.spans.owner == question
        if bool(at.any()):
            cells = loss(rows[at], targets[at], mask[at], plain[at], progress=progress, generator=generator)
            total, count = total + cells, count + 1
    return total / max(count, 1)


def training_loss(objective: Objective) -> Callable[..., Tensor]:
    """The recipe's ``objective`` as one function, built once for the loop: ``(module, tb, progress, generator)`` →
    the batch's loss (:func:`batch_loss`) with the loss it trains with (:func:`loss_for`), which takes ``progress``,
    the fraction of training done (rlcd's σ follows it)."""
    loss = loss_for(objective)

    def step_loss(module: Any, tb: TrainBatch, progress: float, generator: torch.Generator | None = None) -> Tensor:
        return batch_loss(module, tb, loss, progress=progress, generator=generator)

    return step_loss
