"""Training examples → batches: shared renderer, per-epoch option shuffling, length-aware batching.

Each record becomes one or more *units* (a set question: one yes/no unit per label). A choice unit is rendered with
its options in an order drawn per (seed, epoch, record), and its target is permuted with the options so every target
stays attached to its option. As prompting.py renders them everywhere, yes / no questions are always shown as "A. yes,
B. no" and score levels in their order: no client can reorder those, so training does not either.

A choice with more than 26 options (one prompt shows at most 26, labels A–Z) is trained as its gold option among
25 distractors sampled afresh every epoch (every option with target mass is kept, up to 26): over the epochs the
model sees every distractor, and each prompt is a choice among ≤ 26 options like every prompt scored at inference
time (``many_options``: groups of ≤ 26, then a final round among the group leaders).

Batching keeps the questions on one state together (so a batch computes each state's prefix once) and groups units
of similar length (so little compute is spent on padding).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mydecide.many_options import GROUP_SIZE, sub_question
from mydecide.prompting import Batch, Prompt, Renderer, collate, question_units
from mydecide.records import Record

if TYPE_CHECKING:
    import torch

BUCKET_BATCHES = 32  # sort by length inside windows of this many batches, then shuffle the batches


@dataclass(frozen=True)
class Unit:
    """One rendered single-answer question with its target in shown order."""

    prompt: Prompt
    target: tuple[float, ...]  # shown order
    is_score: bool
    record_index: int


@dataclass
class TrainBatch:
    batch: Batch
    targets: torch.Tensor  # (B, K) target distributions in shown order
    is_score: torch.Tensor  # (B,)
    units: list[Unit]

    def to(self, device: torch.device) -> TrainBatch:
        return TrainBatch(self.batch.to(device), self.targets.to(device), self.is_score.to(device), self.units)


def _rng(seed: int, epoch: int, key: str) -> random.Random:
    digest = hashlib.sha256(f"{seed}:{epoch}:{key}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def shown_order(record: Record, seed: int, epoch: int, shuffle: bool, fraction: float = 1.0) -> list[int]:
    """The option order of one record in one epoch.

    Choice options are shuffled (so no answer letter carries a prior); yes / no and score levels keep their order.
    """
    k = record.question.k
    order = list(range(k))
    if shuffle and record.question.type == "choice":
        # ``fraction`` < 1 keeps the given order for the other records this epoch (a coin per record and epoch)
        if fraction < 1.0 and _rng(seed, epoch, f"coin:{record.id}").random() >= fraction:
            return order
        _rng(seed, epoch, record.id).shuffle(order)
    return order


def rotated_orders(record: Record, order: Sequence[int], count: int) -> list[list[int]]:
    """``count`` rotations of ``order`` spread evenly over its positions (all of them when ``count`` ≥ K).

    Shown together, the rotations put every option on ``count`` different letters with the same target, so a letter
    on its own predicts nothing and only the options' text tells the answers apart. Choice questions only (yes / no
    and score keep their one order), and not those with more than 26 options (sampled instead, one order each).
    """
    q = record.question
    if count <= 1 or q.type != "choice" or q.k > GROUP_SIZE:
        return [list(order)]
    count = min(count, q.k)
    shifts = sorted({round(i * q.k / count) for i in range(count)})
    return [list(order[s:]) + list(order[:s]) for s in shifts]


def sampled_options(record: Record, order: Sequence[int], seed: int, epoch: int,
                    size: int = GROUP_SIZE) -> list[int]:
    """The ≤ ``size`` options (canonical indices, in ``order``) a record with more options shows in one epoch.

    Every option with target mass stays (the ``size`` largest, ties by index, if more have mass); the rest are
    distractors drawn without replacement, afresh per (seed, epoch, record).
    """
    target = record.target
    kept = [i for i in range(len(target)) if target[i] > 0]
    if len(kept) > size:
        kept = sorted(kept, key=lambda i: (-target[i], i))[:size]
    chosen = set(kept)
    rest = [i for i in range(len(target)) if i not in chosen]
    chosen.update(_rng(seed, epoch, f"{record.id}\x1fdistractors").sample(rest, min(len(rest), size - len(kept))))
    return [i for i in order if i in chosen]


def record_units(renderer: Renderer, record: Record, index: int, order: Sequence[int], *, seed: int = 0,
                 epoch: int = 0) -> list[Unit]:
    """The training units of one record, options in ``order``; a set → one yes/no unit per label; a choice with
    more than 26 options → its gold among sampled distractors (:func:`sampled_options`, new every epoch)."""
    q = record.question
    if q.type == "set":
        return [Unit(renderer.render(record.state, unit), (p, 1.0 - p), False, index)
                for unit, p in zip(question_units(q), record.target, strict=True)]
    if q.k > GROUP_SIZE:
        shown = sampled_options(record, order, seed, epoch)
        mass = sum(record.target[i] for i in shown)  # < 1 only when more than 26 options carry mass
        prompt = renderer.render(record.state, sub_question(q, shown))
        return [Unit(prompt, tuple(record.target[i] / mass for i in shown), False, index)]
    prompt = renderer.render(record.state, q, order)
    return [Unit(prompt, tuple(record.target[i] for i in order), q.type == "score", index)]


def epoch_units(renderer: Renderer, records: Sequence[Record], seed: int, epoch: int,
                shuffle_options: bool, shuffle_fraction: float = 1.0, orders_per_record: int = 1) -> list[Unit]:
    """Every record's units for one epoch; with ``orders_per_record`` > 1, a choice record yields one unit per
    rotation of its shown order (:func:`rotated_orders`), kept in one batch by :func:`plan_batches`."""
    units: list[Unit] = []
    for index, record in enumerate(records):
        order = shown_order(record, seed, epoch, shuffle_options, shuffle_fraction)
        for rotated in rotated_orders(record, order, orders_per_record):
            units.extend(record_units(renderer, record, index, rotated, seed=seed, epoch=epoch))
    return units


def plan_batches(units: Sequence[Unit], batch_size: int, seed: int, epoch: int,
                 length_buckets: bool = True) -> list[list[Unit]]:
    """Group units into batches of ``batch_size`` questions.

    Units on one state stay adjacent (one prefix per state in a batch); with ``length_buckets`` the state groups are
    sorted by length inside windows of ``BUCKET_BATCHES`` batches, and the batches are then shuffled, so batches are
    homogeneous in length but their order is random. Deterministic in (seed, epoch).
    """
    rng = _rng(seed, epoch, "batches")
    groups: dict[tuple[int, ...], list[Unit]] = {}
    for unit in units:
        groups.setdefault(unit.prompt.prefix, []).append(unit)
    ordered = list(groups.values())
    rng.shuffle(ordered)
    if length_buckets:
        window = batch_size * BUCKET_BATCHES
        flat_windows, current, size = [], [], 0
        for group in ordered:
            current.append(group)
            size += len(group)
            if size >= window:
                flat_windows.append(current)
                current, size = [], 0
        if current:
            flat_windows.append(current)
        ordered = [g for w in flat_windows
                   for g in sorted(w, key=lambda g: len(g[0].prompt.prefix) + max(len(u.prompt.suffix) for u in g))]
    flat = [u for g in ordered for u in g]
    batches = [flat[i:i + batch_size] for i in range(0, len(flat), batch_size)]
    rng.shuffle(batches)
    return batches


@dataclass(frozen=True)
class OrderSchedule:
    """Where each micro-batch falls when training starts with options in their given order.

    Phase 0 (micro-batches before ``switch``) shows every option in its given order, one order per record; phase 1
    uses the recipe's shuffling and rotations. Phase 1 starts inside the epoch phase 0 stopped in, at the same share
    of that epoch, so records are not repeated early. ``per_epoch`` is the number of micro-batches per epoch per
    process in each phase (rotations change it). A pure function of the micro-batch number, so resuming replays it.
    """

    switch: int
    per_epoch: tuple[int, int]

    def locate(self, micro: int) -> tuple[int, int, int]:
        """(phase, epoch, index of the micro-batch in that epoch's plan, per process)."""
        n0, n1 = self.per_epoch
        if micro < self.switch:
            epoch, j = divmod(micro, n0)
            return 0, epoch, j
        epoch0, j0 = divmod(self.switch, n0)
        epochs, j = divmod(micro - self.switch + j0 * n1 // n0, n1)
        return 1, epoch0 + epochs, j

    def epoch_float(self, micro: int) -> float:
        phase, epoch, j = self.locate(micro)
        return epoch + j / self.per_epoch[phase]


def make_batch(units: Sequence[Unit], pad_id: int, shared_prefix: bool) -> TrainBatch:
    import torch

    batch = collate([u.prompt for u in units], pad_id, shared_prefix)
    k = batch.option_mask.shape[1]
    targets = torch.zeros(len(units), k)
    for i, unit in enumerate(units):
        targets[i, : len(unit.target)] = torch.tensor(unit.target)
    is_score = torch.tensor([u.is_score for u in units], dtype=torch.bool)
    return TrainBatch(batch, targets, is_score, list(units))
