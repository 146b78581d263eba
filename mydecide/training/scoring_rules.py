"""Scoring rules over a padded batch of option distributions.

Every function takes

- ``probs``   (B, K) predicted distributions q (a softmax over the valid options),
- ``targets`` (B, K) target distributions y (soft labels are first-class; a hard label is one-hot),
- ``mask``    (B, K) bool, True where the option is real; padded options carry q = 0 and y = 0,

and returns one score per row, shape (B,). Padded options never change a result: every sum runs over
the valid options only. Log and spherical scores are *positively* oriented (higher is better), Brier and
RPS negatively (lower is better); ``composite_score`` combines them into the positively oriented score
that the ``proper`` and ``rlcd`` objectives maximise.

These are pure tensor functions (no state, no I/O), differentiable wherever the rule is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

SPHERICAL_WEIGHT = 0.5
"""Weight of the spherical score inside the composite score."""


def _check_shapes(probs: Tensor, targets: Tensor, mask: Tensor) -> None:
    if probs.shape != targets.shape or probs.shape != mask.shape:
        raise ValueError(
            f"probs {tuple(probs.shape)}, targets {tuple(targets.shape)} and mask {tuple(mask.shape)} "
            "must have the same (B, K) shape"
        )


def _valid(values: Tensor, mask: Tensor) -> Tensor:
    """Zero every padded position (with `where`, so a NaN/inf there cannot leak into sums or gradients)."""
    import torch

    return torch.where(mask, values, torch.zeros_like(values))


def log_score(probs: Tensor, targets: Tensor, mask: Tensor, *, log_probs: Tensor | None = None) -> Tensor:
    """Log score Σ_k y_k log q_k per row, (B,). Maximum 0 for a certain, correct answer.

    q is clamped at the dtype's smallest normal number, so 0·log 0 counts as 0 and a zero probability on
    a target option gives a large finite penalty instead of -inf/NaN. Callers that have logits can pass
    ``log_probs`` (a log-softmax, (B, K)) to use instead of log(q): it keeps a gradient even where q
    underflows to 0.
    """
    import torch

    _check_shapes(probs, targets, mask)
    if log_probs is None:
        log_probs = torch.log(probs.clamp_min(torch.finfo(probs.dtype).tiny))  # (B, K)
    return (_valid(targets, mask) * _valid(log_probs, mask)).sum(dim=-1)


def spherical_score(probs: Tensor, targets: Tensor, mask: Tensor) -> Tensor:
    """Spherical score Σ_k y_k q_k / ‖q‖ per row, (B,), with the norm over the valid options. Maximum 1."""
    import torch

    _check_shapes(probs, targets, mask)
    q = _valid(probs, mask)  # (B, K)
    norm = torch.linalg.vector_norm(q, dim=-1).clamp_min(torch.finfo(q.dtype).tiny)  # (B,)
    return (_valid(targets, mask) * q).sum(dim=-1) / norm


def brier_score(probs: Tensor, targets: Tensor, mask: Tensor) -> Tensor:
    """Brier score Σ_k (q_k − y_k)² per row, (B,). Range [0, 2], 0 for a certain, correct answer."""
    _check_shapes(probs, targets, mask)
    diff = _valid(probs, mask) - _valid(targets, mask)  # (B, K)
    return (diff * diff).sum(dim=-1)


def ranked_probability_score(probs: Tensor, targets: Tensor, mask: Tensor) -> Tensor:
    """Ranked probability score Σ_i (Q_i − Y_i)² / (K_i − 1) per row, (B,), over cumulative distributions.

    Meant for ordered options (score levels, lowest first). K_i is the number of valid options in row i;
    the cumulative sums run over the valid options in their order, and only valid positions are summed, so
    a padded option (wherever it sits) never changes the result. The last cumulative term is 0 when both
    rows sum to 1. Range [0, 1]; a row with a single valid option scores 0.
    """
    import torch

    _check_shapes(probs, targets, mask)
    cum_q = torch.cumsum(_valid(probs, mask), dim=-1)  # (B, K)
    cum_y = torch.cumsum(_valid(targets, mask), dim=-1)  # (B, K)
    sq = _valid((cum_q - cum_y) ** 2, mask)  # (B, K)
    k = mask.sum(dim=-1).to(probs.dtype)  # (B,)
    return sq.sum(dim=-1) / (k - 1.0).clamp_min(1.0)


def composite_score(
    probs: Tensor,
    targets: Tensor,
    mask: Tensor,
    is_score: Tensor,
    *,
    log_probs: Tensor | None = None,
) -> Tensor:
    """Composite proper score S_log + 0.5·S_sph − [score]·RPS per row, (B,).

    ``is_score`` (B,) bool (or 0/1 float) marks score questions, the only ones whose options are ordered
    and so the only ones charged the RPS. A sum of proper scores is proper, so the composite is maximised
    in expectation by reporting the true distribution. Its maximum, for a certain and correct answer,
    is 0 + 0.5·1 − 0 = 0.5. ``log_probs`` is passed through to ``log_score``.
    """
    s_log = log_score(probs, targets, mask, log_probs=log_probs)  # (B,)
    s_sph = spherical_score(probs, targets, mask)  # (B,)
    rps = ranked_probability_score(probs, targets, mask)  # (B,)
    return s_log + SPHERICAL_WEIGHT * s_sph - is_score.to(probs.dtype) * rps
