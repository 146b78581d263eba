"""Training examples → batches: shared renderer, per-epoch option shuffling, length-aware batching.

Each record becomes one or more *units* (a set question: one yes/no unit per label). A choice unit is rendered with
its options in an order drawn per (seed, epoch, record), and its target is permuted with the options so every target
stays attached to its option. As scoring/render.py renders them everywhere, yes / no questions are always shown as
"A. yes, B. no" and score levels in their order: no client can reorder those, so training does not either.

A choice with more than 26 options (one prompt shows at most 26, labels A–Z) is trained as its gold option among
25 distractors sampled afresh every epoch (every option with target mass is kept, up to 26): over the epochs the
model sees every distractor, and each prompt is a choice among ≤ 26 options like every prompt scored at inference
time (``many_options``: groups of ≤ 26, then a final round among the group leaders).

Batching cuts an epoch into ⌈units / batch size⌉ batches: the questions on one state stay next to each other (so a
batch computes each state's prefix once, unless the batch fills up among them) and units of similar length go
together (so little compute is spent on padding). A recipe's ``task_weights`` show a task's records more (or less)
often per epoch.

A span question is one :class:`SpanUnit`: its sequences (one per label and window, ``scoring.span_layout``) run
beside the batch's prompts in the same forward call, and its target is the word × label grid in the order of their
reads. With ``prompt.span.layout: shared`` a packed batch lays its sequences as blocks in the rows of their states
(``SpanBatch.packed_from``), each one more question of its state.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from mydecide.records import Record
from mydecide.scoring.forward import Batch, collate
from mydecide.scoring.packed import PackedBatch, pack
from mydecide.scoring.plan import GROUP_SIZE, sub_question
from mydecide.scoring.render import Prompt, Renderer, question_units
from mydecide.scoring.span_layout import SpanSequence, span_layout
from mydecide.scoring.yes_no import yes_no_view

if TYPE_CHECKING:
    import torch

BUCKET_BATCHES = 32  # sort by length inside windows of this many batches, then shuffle the batches


@dataclass(frozen=True)
class Unit:
    """One single-answer question to train on, with its target in shown order.

    Letters form: one prompt whose K label logits are the answer. Per-option form (``yes_no``): one yes / no prompt
    per option, all continuing one prefix; the K yes − no logits are the answer. Threshold form (``cumulative``, score
    questions): K − 1 yes / no prompts, level j's logit the sum of the first j reads' log-odds. Binomial form
    (``binomial``, score questions): one yes / no prompt, level j's logit log C(K − 1, j) + j·s of its log-odds s.
    """

    prompts: tuple[Prompt, ...]
    target: tuple[float, ...]  # shown order (per-option form: the order of ``prompts``)
    is_score: bool
    record_index: int
    yes_no: bool = False
    cumulative: bool = False  # threshold form: K − 1 yes / no reads whose running sums are the K level logits
    binomial: bool = False  # binomial form: one yes / no read s, the K level logits log C(K − 1, j) + j·s
    copy: int = 0  # which showing of its record this epoch (``task_weights`` > 1 show a record more than once)

    @property
    def prompt(self) -> Prompt:
        """The first prompt (the only one in the letters form); every prompt of a unit has the same prefix."""
        return self.prompts[0]

    @property
    def state_ids(self) -> tuple[int, ...]:
        """The state's tokens: the prefix's root (its start where the prefix also holds the question, per option)."""
        return self.prompt.root

    @property
    def group(self) -> tuple[int, tuple[int, ...]]:
        """What keeps units together in a batch: one showing of one state (two showings go apart)."""
        return self.copy, self.state_ids

    @property
    def k(self) -> int:
        return len(self.target)


@dataclass(frozen=True)
class SpanUnit(Unit):
    """A span question: ``sequences`` to read, ``target`` one 0 / 1 per value read (sequence order, as
    ``SpanSequence.cells`` lists them). ``prompts`` mirror the sequences (whole sequence as suffix) for length
    bucketing; ``state_key`` groups it with its state's questions."""

    sequences: tuple[SpanSequence, ...] = ()
    state_key: tuple[int, ...] = ()

    @property
    def state_ids(self) -> tuple[int, ...]:
        return self.state_key


def span_unit(renderer: Renderer, record: Record, index: int) -> SpanUnit:
    """The one training unit of a span record: every read of its layout with the grid's target for that cell."""
    layout = span_layout(renderer, record.state, record.question)
    labels = record.question.k
    target = tuple(record.target[cell] for s in layout.sequences for cell in s.cells(labels))
    prompts = tuple(Prompt((), s.ids, (0, 1)) for s in layout.sequences) or (Prompt((), (), (0, 1)),)
    key = renderer.encode_state(record.state)[0]
    return SpanUnit(prompts, target, False, index, sequences=layout.sequences, state_key=key)


@dataclass
class SpanBatch:
    """The span questions of a batch: their sequences (one right-padded forward), the 0 / 1 target of every read,
    and ``owner`` (M,) the span question (0 … S−1 in the batch) each read belongs to. ``packed_from``: the sequences
    (``layout: shared``) are blocks in the batch's packed rows, prompts ``packed_from`` … of it, one more question
    of their state each; None: read in a forward pass of their own."""

    sequences: list[SpanSequence]
    targets: torch.Tensor  # (M,)
    owner: torch.Tensor  # (M,) long
    pad_id: int
    count: int  # span questions
    packed_from: int | None = None

    def to(self, device: torch.device) -> SpanBatch:
        targets, owner = self.targets.to(device), self.owner.to(device)
        return SpanBatch(self.sequences, targets, owner, self.pad_id, self.count, self.packed_from)


@dataclass
class TrainBatch:
    """``batch`` holds every prompt of the units (R rows); ``index`` (B, K) says where each unit's option logits
    are in the flattened (R·Kp prompt logits, then R yes − no values) view (:func:`question_logits`)."""

    batch: Batch | PackedBatch | None  # None: only span questions
    targets: torch.Tensor  # (B, K) target distributions in shown order
    is_score: torch.Tensor  # (B,)
    units: list[Unit]
    index: torch.Tensor | None = None  # (B, K) long; None when every unit is one letters prompt (rows = units)
    option_mask: torch.Tensor | None = None  # (B, K) bool; None: the batch's own option mask
    spans: SpanBatch | None = None  # the batch's span questions (``batch`` is None when it has only those)
    cumulative: torch.Tensor | None = None  # (B,) bool: threshold units, whose gathered reads are summed
    binomial: torch.Tensor | None = None  # (B,) bool: binomial units, whose one read is spread over the levels

    @property
    def questions(self) -> int:
        """Questions in the batch: units of every kind."""
        return len(self.units) + (self.spans.count if self.spans is not None else 0)

    @property
    def mask(self) -> torch.Tensor:
        """(B, K) the options of each unit."""
        if self.option_mask is not None:
            return self.option_mask
        assert self.batch is not None
        return self.batch.option_mask

    def to(self, device: torch.device) -> TrainBatch:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return TrainBatch(
            self.batch.to(device) if self.batch is not None else None,
            self.targets.to(device),
            self.is_score.to(device),
            self.units,
            move(self.index),
            move(self.option_mask),
            self.spans.to(device) if self.spans is not None else None,
            move(self.cumulative),
            move(self.binomial),
        )

    def logits(self, prompt_logits: torch.Tensor) -> torch.Tensor:
        """(B, K) unit logits from the (R, Kp) prompt logits of the forward pass."""
        if self.index is None:
            return prompt_logits
        return question_logits(prompt_logits, self.index, self.mask, self.cumulative, self.binomial)


def question_logits(
    prompt_logits: torch.Tensor,
    index: torch.Tensor,
    mask: torch.Tensor,
    cumulative: torch.Tensor | None = None,
    binomial: torch.Tensor | None = None,
) -> torch.Tensor:
    """Gather (B, K) option logits from (R, Kp) prompt logits: a letters unit takes its row, a per-option unit the
    yes − no log-odds (column 0 − column 1) of its K prompts, a threshold unit (``cumulative``) 0 then its K − 1
    reads' log-odds, summed along the levels (as ``scoring.plan.threshold_logits``), a binomial unit (``binomial``)
    its one read's log-odds s at every level j, made log C(K − 1, j) + j·s (as ``scoring.plan.binomial_logits``;
    K = the unit's ``mask``). Positions outside ``mask`` are −inf."""
    import torch

    finite = prompt_logits.masked_fill(~torch.isfinite(prompt_logits), 0.0)
    zero = finite.new_zeros(1)  # the last slot: level 0 of a threshold unit
    flat = torch.cat([finite.reshape(-1), finite[:, 0] - finite[:, 1], zero])  # (R·Kp + R + 1,)
    gathered = flat[index.clamp(min=0)]
    if cumulative is not None:
        gathered = torch.where(cumulative[:, None], gathered.cumsum(dim=1), gathered)
    if binomial is not None:
        gathered = torch.where(binomial[:, None], binomial_levels(gathered, mask), gathered)
    return gathered.masked_fill(~mask, float("-inf"))


def binomial_levels(reads: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, K) log C(K_i − 1, j) + j·s_ij for each row's K_i = ``mask`` count (0 outside it): ``reads`` holds a
    binomial unit's one log-odds s at every level. In float32 at least: log C reaches 16 at K = 26, too coarse in
    bf16."""
    import torch

    reads = reads.to(torch.promote_types(reads.dtype, torch.float32))
    j = torch.arange(reads.shape[1], device=reads.device, dtype=reads.dtype)
    k = mask.sum(dim=1, keepdim=True).to(reads.dtype)
    log_choose = torch.lgamma(k) - torch.lgamma(j + 1) - torch.lgamma((k - j).clamp(min=1))
    return torch.where(mask, log_choose + j * reads, torch.zeros_like(reads))


def _rng(seed: int, epoch: int, key: str) -> random.Random:
    digest = hashlib.sha256(f"{seed}:{epoch}:{key}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def shown_order(record: Record, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The option order of one record in one epoch.

    Choice options are shuffled (so no answer letter carries a prior); yes / no and score levels keep their order.
    """
    order = list(range(record.question.k))
    if shuffle and record.question.type == "choice":
        _rng(seed, epoch, record.id).shuffle(order)
    return order


def sampled_options(record: Record, order: Sequence[int], seed: int, epoch: int, size: int = GROUP_SIZE) -> list[int]:
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


def record_units(
    renderer: Renderer, record: Record, index: int, order: Sequence[int], *, seed: int = 0, epoch: int = 0
) -> list[Unit]:
    """The training units of one record, options in ``order``; a set → one yes/no unit per label; a yes / no choice
    or score → the noul's unit, its target in (yes, no) order (``scoring.yes_no``); a choice with
    more than 26 options → its gold among sampled distractors (:func:`sampled_options`, new every epoch); the
    per-option form → one unit of K yes / no prompts (canonical order: the form does not see an order); the
    threshold form → one unit of K − 1 yes / no prompts; the binomial form → one unit of one yes / no prompt."""
    q = record.question
    if q.type == "span":
        return [span_unit(renderer, record, index)]
    if q.type == "set":
        return [
            Unit((renderer.render(record.state, unit),), (p, 1.0 - p), False, index)
            for unit, p in zip(question_units(q), record.target, strict=True)
        ]
    view = yes_no_view(q)
    if view is not None:  # a yes / no question asked as a choice or score: shown as the noul it is
        noul, yes = view
        yes_first = (record.target[yes], record.target[1 - yes])
        return [Unit((renderer.render(record.state, noul),), yes_first, False, index)]
    form = renderer.form(q)
    if form == "thresholds":
        prompts = tuple(renderer.render_thresholds(record.state, q))
        return [Unit(prompts, tuple(record.target), True, index, True, cumulative=True)]
    if form == "binomial":
        prompt = renderer.render_binomial(record.state, q)
        return [Unit((prompt,), tuple(record.target), True, index, True, binomial=True)]
    per_option = form == "per_option"
    if q.k > GROUP_SIZE:
        shown = sampled_options(record, order if not per_option else range(q.k), seed, epoch)
        mass = sum(record.target[i] for i in shown)  # < 1 only when more than 26 options carry mass
        target = tuple(record.target[i] / mass for i in shown)
        if per_option:
            prompts = tuple(renderer.render_per_option(record.state, q, shown))
            return [Unit(prompts, target, False, index, True)]
        return [Unit((renderer.render(record.state, sub_question(q, shown)),), target, False, index)]
    if per_option:
        prompts = tuple(renderer.render_per_option(record.state, q))
        return [Unit(prompts, tuple(record.target), q.type == "score", index, True)]
    prompt = renderer.render(record.state, q, order)
    return [Unit((prompt,), tuple(record.target[i] for i in order), q.type == "score", index)]


def epoch_units(
    renderer: Renderer,
    records: Sequence[Record],
    seed: int,
    epoch: int,
    shuffle_options: bool,
    task_weights: Mapping[str, float] | None = None,
) -> list[Unit]:
    """Every record's units for one epoch, options in their :func:`shown_order`; with ``task_weights``, each record
    is shown as many times as :func:`showings` says (each showing its own order)."""
    units: list[Unit] = []
    counts = showings(records, task_weights or {}, seed, epoch)
    for index, record in enumerate(records):
        for copy in range(counts[index]):
            key = record if copy == 0 else replace(record, id=f"{record.id}\x1f{copy}")
            order = shown_order(key, seed, epoch, shuffle_options)
            made = record_units(renderer, key, index, order, seed=seed, epoch=epoch)
            units.extend(made if copy == 0 else [replace(u, copy=copy) for u in made])
    return units


def showings(records: Sequence[Record], task_weights: Mapping[str, float], seed: int, epoch: int) -> list[int]:
    """How many times each record is shown in epoch ``epoch``: a task of weight w shows round(w · n) records' worth,
    each of its n records ⌊w⌋ times and r of them once more. The r are the next slice of one seeded permutation of
    the task's records each epoch, so every epoch has the same size (the schedule counts updates from epoch 0) and
    every record gets its turn (weight 0.5: one half in even epochs, the other in odd ones). Weight 1: once each."""
    counts = [1] * len(records)
    by_task: dict[str, list[int]] = {}
    for index, record in enumerate(records):
        if record.task in task_weights:
            by_task.setdefault(record.task, []).append(index)
    for task, members in by_task.items():
        weight, n = task_weights[task], len(members)
        whole = math.floor(weight)
        more = min(n, max(0, round(weight * n) - whole * n))
        turn = _rng(seed, 0, f"showings:{task}").sample(members, n)
        start = epoch * more % n
        extra = set((turn + turn)[start : start + more])
        for index in members:
            counts[index] = whole + (index in extra)
    return counts


def plan_batches(
    units: Sequence[Unit], batch_size: int, seed: int, epoch: int, length_buckets: bool = True
) -> list[list[Unit]]:
    """Cut units into ⌈len(units) / batch_size⌉ batches of ``batch_size`` questions (the last one may be smaller).

    The units on one state are kept next to each other, so they share a batch, and the state's computation, unless
    a batch fills up inside them: then the state continues in the next batch (computed once more). Every epoch of
    the same units makes the same number of batches, whatever the order. With ``length_buckets`` the state groups
    are sorted by length inside windows of ``BUCKET_BATCHES`` batches, and the batches are then shuffled, so batches
    are homogeneous in length but their order is random. Deterministic in (seed, epoch).
    """
    rng = _rng(seed, epoch, "batches")
    groups: dict[tuple[int, tuple[int, ...]], list[Unit]] = {}
    for unit in units:
        groups.setdefault(unit.group, []).append(unit)
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
        ordered = [
            g
            for w in flat_windows
            for g in sorted(w, key=lambda g: len(g[0].prompt.prefix) + max(len(p.suffix) for u in g for p in u.prompts))
        ]
    flat = [unit for group in ordered for unit in group]
    batches = [flat[start : start + batch_size] for start in range(0, len(flat), batch_size)]
    rng.shuffle(batches)
    return batches


def make_batch(units: Sequence[Unit], pad_id: int, shared_prefix: bool, packing: str | None = None) -> TrainBatch:
    """Collate the units' prompts into one forward pass; per-option units get an index into its logits.

    ``shared_prefix`` with ``packing`` (``scoring.packed.packing_mode`` of the model: "attention" or "hybrid"): one
    packed row per state, a single forward call that gradient checkpointing can recompute; ``shared_prefix`` alone:
    the prefix once through a KV cache (:func:`mydecide.scoring.forward.last_hidden`); neither: one prompt per row.
    Span questions of ``layout: shared`` join their states' packed rows, a block per window; any other span
    sequence is read in a forward pass of its own.
    """
    import torch

    span_units = [u for u in units if isinstance(u, SpanUnit)]
    spans = None
    units = [u for u in units if not isinstance(u, SpanUnit)]
    prompts = [p for u in units for p in u.prompts]
    if span_units:
        reads = [(n, y) for n, u in enumerate(span_units) for y in u.target]
        sequences = [s for u in span_units for s in u.sequences]
        blocks = shared_prefix and packing is not None and all(s.root for s in sequences)
        spans = SpanBatch(
            sequences,
            torch.tensor([y for _, y in reads], dtype=torch.float32),
            torch.tensor([n for n, _ in reads], dtype=torch.long),
            pad_id,
            len(span_units),
            len(prompts) if blocks else None,
        )
        none = torch.zeros(0, 2, dtype=torch.bool)
        if not blocks and not units:
            return TrainBatch(None, torch.zeros(0, 2), torch.zeros(0, dtype=torch.bool), [], None, none, spans)
        if blocks:  # each block one more question of its state: the state's prefix is the root it continues
            prompts += [Prompt(s.ids[: s.root], s.ids[s.root :], (0, 1)) for s in sequences]
    batch: Batch | PackedBatch
    if shared_prefix and packing is not None:  # one row per state, each question's shared text once in it
        batch = pack(prompts, pad_id, segments=packing == "hybrid")
    else:
        batch = collate(prompts, pad_id, shared_prefix)
    if not units:  # only span blocks
        return TrainBatch(batch, torch.zeros(0, 2), torch.zeros(0, dtype=torch.bool), [], None, none, spans)
    asked = len(prompts) if spans is None or spans.packed_from is None else spans.packed_from
    k = max(u.k for u in units)
    targets = torch.zeros(len(units), k)
    for i, unit in enumerate(units):
        targets[i, : unit.k] = torch.tensor(unit.target)
    is_score = torch.tensor([u.is_score for u in units], dtype=torch.bool)
    if not any(u.yes_no for u in units):
        option_mask = batch.option_mask[:asked] if asked < len(prompts) else None  # without the span blocks' rows
        return TrainBatch(batch, targets, is_score, list(units), option_mask=option_mask, spans=spans)
    rows, width = asked, batch.option_mask.shape[1]
    index = torch.zeros(len(units), k, dtype=torch.long)
    mask = torch.zeros(len(units), k, dtype=torch.bool)
    row = 0
    for i, unit in enumerate(units):
        if unit.cumulative:  # level 0: the zero slot; level j: the yes − no value of the unit's j-th read
            index[i, 0] = rows * width + rows
            index[i, 1 : unit.k] = rows * width + torch.arange(row, row + unit.k - 1)
        elif unit.binomial:  # every level: the yes − no value of the unit's one read
            index[i, : unit.k] = rows * width + row
        elif unit.yes_no:  # option j's logit is the yes − no value of the unit's j-th prompt
            index[i, : unit.k] = rows * width + torch.arange(row, row + unit.k)
        else:  # the letters logits of the unit's one prompt
            index[i, : unit.k] = row * width + torch.arange(unit.k)
        mask[i, : unit.k] = True
        row += len(unit.prompts)
    cumulative = torch.tensor([u.cumulative for u in units]) if any(u.cumulative for u in units) else None
    binomial = torch.tensor([u.binomial for u in units]) if any(u.binomial for u in units) else None
    return TrainBatch(batch, targets, is_score, list(units), index, mask, spans, cumulative, binomial)
