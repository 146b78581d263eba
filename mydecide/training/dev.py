"""Dev evaluation during training: the metrics, the collapse check, the adapter kept, and the line the loop logs.

``dev_metrics`` scores the dev records with the model as it is (no gradient), so under DDP the main process runs it
alone; under FSDP / ZeRO-3 every process must run it, since each forward pass gathers the sharded weights (the loop
decides which, see ``checkpoints.is_sharded``).

A small model trained on few examples can learn "answer B" instead of the task: its dev accuracy then sits at the
class prior and its answers move with the option order. :func:`collapse_report` looks for that from the dev
predictions of one pass with shuffled options: the share of answers on the most frequent *letter* (compared with the
share of gold answers on that letter), the flip rate between canonical and shuffled order, and accuracy against the
majority-class baseline.

:class:`KeptAdapter` is the loop's record of RUN/adapter, the adapter best on dev: :func:`replaces_best` decides
whether a newer one takes its place, and it travels in every checkpoint.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mydecide.evaluation.baselines import LabelPrior, majority_accuracy
from mydecide.records import Record

LETTER_SHARE_LIMIT = 0.6  # warn when more answers than this go to one letter …
LETTER_EXCESS_LIMIT = 0.25  # … and that is this much more than the gold answers on that letter
FLIP_LIMIT = 0.5


def dev_metrics(model: Any, records: list[Record], majority: LabelPrior, seed: int, batch_size: int) -> dict[str, Any]:
    """Accuracy, log loss, ECE (canonical order) and the collapse check (one shuffled pass) on dev records.

    A set question counts one yes/no row per label in the metrics. Span questions are not in accuracy, Brier or ECE
    (their hundreds of word × label cells would outweigh every other question); each adds its mean cell log loss to
    ``log_loss`` as one question, so the best adapter is picked with every question weighing the same, as in
    training (``span_log_loss``: their mean alone). ``losses`` holds those terms one by one, in dev order (their
    mean is ``log_loss``), for :func:`replaces_best`; the loop does not write them to metrics.jsonl. The collapse
    check looks at single-answer questions read by letter only (for more than 26 options, the letter an option has
    in its group).
    """
    import numpy as np

    from mydecide.metrics import log_loss, log_losses, summarize
    from mydecide.scoring.engine import score_questions
    from mydecide.scoring.plan import shown_letter_index
    from mydecide.scoring.probabilities import answer_rows, to_probabilities
    from mydecide.training.batches import shown_order

    single = [r for r in records if r.question.type not in ("set", "span")]
    sets = [r for r in records if r.question.type in ("set", "span")]  # yes / no rows: per label, per word × label
    items = [(r.state, r.question) for r in single]
    logits = score_questions(model, items + [(r.state, r.question) for r in sets], batch_size=batch_size)
    set_logits = logits[len(single) :]
    logits = logits[: len(single)]
    # the collapse check's second pass: choice options in another order (yes / no and score are always in order)
    orders = [shown_order(r, seed, 10_000, shuffle=True) for r in single]
    reordered = [i for i, r in enumerate(single) if r.question.type == "choice"]
    shuffled = list(logits)
    if reordered:
        again = score_questions(
            model, [items[i] for i in reordered], orders=[orders[i] for i in reordered], batch_size=batch_size
        )
        for i, z in zip(reordered, again, strict=True):
            shuffled[i] = z
    per_question = [
        answer_rows(r.question.type, to_probabilities(r.question.type, z), r.target)
        for r, z in zip(single + sets, logits + set_logits, strict=True)
    ]
    counted = [(r, rows) for r, rows in zip(single + sets, per_question, strict=True) if r.question.type != "span"]
    rows = [row for _, rows in counted for row in rows]
    probs, targets = [p for p, _ in rows], [y for _, y in rows]
    summary: dict[str, Any] = (
        summarize(probs, targets, [r.question.type == "score" for r, q_rows in counted for _ in q_rows])
        if rows
        else {"n": 0, **dict.fromkeys(("accuracy", "chance_corrected", "brier", "ece"), None), "log_loss": 0.0}
    )
    spans = [rows for r, rows in zip(single + sets, per_question, strict=True) if r.question.type == "span"]
    losses = [float(x) for x in log_losses(probs, targets)] if rows else []
    if spans:  # each span question counts once in the log loss: the mean over its word x label cells
        span_losses = [log_loss([p for p, _ in q], [y for _, y in q]) for q in spans]
        summary["span_log_loss"] = float(np.mean(span_losses))
        losses += span_losses
        summary["log_loss"] = float(np.mean(losses))
    predicted_pos, gold_pos, flips = [], [], []
    letters_shuffled = False  # a choice question read by letter: its options were shuffled for this pass
    for r, z, zs, order in zip(single, logits, shuffled, orders, strict=True):
        if r.question.type == "choice":
            flips.append(int(np.argmax(z)) != int(np.argmax(zs)))
        renderer = getattr(model, "renderer", None)
        if renderer is not None and renderer.form(r.question) != "letters":
            continue  # read option by option or level by level: no answer letter to collapse onto
        position_of = {option: shown_letter_index(r.question.k, pos) for pos, option in enumerate(order)}
        letters_shuffled |= r.question.type == "choice"
        predicted_pos.append(position_of[int(np.argmax(zs))])
        gold_pos.append(position_of[r.gold_index])
    majority_acc = majority_accuracy(single, majority)
    out = {k: summary[k] for k in ("n", "accuracy", "chance_corrected", "log_loss", "brier", "ece")}
    if spans:
        out["span_questions"], out["span_log_loss"] = len(spans), summary["span_log_loss"]
    out["losses"] = losses
    if not single:
        return {
            **out,
            "flip_rate": 0.0,
            "majority_accuracy": majority_acc,
            "top_letter": "-",
            "top_letter_share": 0.0,
            "warnings": [],
        }
    report = collapse_report(
        predicted_pos, gold_pos, flips, float(summary["accuracy"]), majority_acc, letters_shuffled=letters_shuffled
    )
    return {
        **out,
        "flip_rate": report.flip_rate,
        "majority_accuracy": majority_acc,
        "top_letter": report.top_letter,
        "top_letter_share": report.top_letter_share,
        "warnings": report.warnings,
    }


@dataclass
class CollapseReport:
    top_letter: str
    top_letter_share: float
    gold_share_of_top_letter: float
    flip_rate: float
    accuracy: float
    majority_accuracy: float
    warnings: list[str] = field(default_factory=list)


def collapse_report(
    predicted_positions: Sequence[int],
    gold_positions: Sequence[int],
    flips: Sequence[bool],
    accuracy: float,
    majority_accuracy: float,
    *,
    letters_shuffled: bool = True,
) -> CollapseReport:
    """Positions are shown-order indices (0 = "A") of the predicted and gold options under shuffled order, of the
    questions read by letter only (none: no letter to collapse onto, and the letter check is skipped).
    ``letters_shuffled``: whether any of them had its options shuffled (choice questions). Without, every letter
    stands for one answer (yes / no questions: A is always yes), so one letter everywhere is one answer everywhere,
    not an answer position, and the warning says so."""
    top_letter, share, gold_share = "-", 0.0, 0.0
    if predicted_positions:
        top, count = Counter(predicted_positions).most_common(1)[0]
        top_letter, share = chr(ord("A") + top), count / len(predicted_positions)
        gold_share = sum(1 for g in gold_positions if g == top) / len(gold_positions)
    flip_rate = sum(flips) / len(flips) if flips else 0.0
    report = CollapseReport(top_letter, share, gold_share, flip_rate, accuracy, majority_accuracy)
    if share > LETTER_SHARE_LIMIT and share - gold_share > LETTER_EXCESS_LIMIT:
        cause = (
            "learning an answer position"
            if letters_shuffled
            else "giving one answer to most questions (each letter is one answer in these questions)"
        )
        report.warnings.append(
            f"{share:.0%} of dev answers are letter {report.top_letter} (gold: {gold_share:.0%}): the model is "
            f"{cause}, not the task"
        )
    if flip_rate > FLIP_LIMIT:
        report.warnings.append(f"{flip_rate:.0%} of dev answers change when the options are reordered")
    if accuracy <= majority_accuracy:
        report.warnings.append(
            f"dev accuracy {accuracy:.3f} does not beat the majority-class baseline {majority_accuracy:.3f}"
        )
    return report


@dataclass(frozen=True)
class DevLoss:
    """One adapter's dev log loss: the ``update`` it was evaluated at (None: no adapter yet), and ``dev_losses``, the
    terms whose mean it is, question by question (:func:`dev_metrics`' ``losses``, rounded)."""

    log_loss: float = math.inf
    update: int | None = None
    dev_losses: tuple[float, ...] = ()

    def to_json(self, *, terms: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"log_loss": self.log_loss, "update": self.update}
        return {**out, "dev_losses": list(self.dev_losses)} if terms else out


@dataclass(frozen=True)
class KeptAdapter(DevLoss):
    """The loop's record of RUN/adapter: its dev figures, and ``lowest``, the adapter with the lowest dev log loss so
    far (this one, or the one it was kept within the noise of: :func:`replaces_best`). The first, before any dev
    evaluation, has no update and an infinite log loss. It travels in every checkpoint (:meth:`to_json`) and ends in
    summary.json without its terms."""

    accuracy: float | None = None
    majority_accuracy: float | None = None  # for the loop's last collapse warning
    lowest: DevLoss = DevLoss()

    def after(self, metrics: dict[str, Any], losses: Sequence[float], update: int) -> KeptAdapter:
        """The record once update ``update``'s adapter (dev ``metrics`` and ``losses``) is kept in place of this."""
        this = DevLoss(metrics["log_loss"], update, tuple(round(float(x), 7) for x in losses))
        lowest = this if self.lowest.update is None or this.log_loss < self.lowest.log_loss else self.lowest
        figures = metrics["accuracy"], metrics["majority_accuracy"]
        return KeptAdapter(this.log_loss, this.update, this.dev_losses, *figures, lowest)

    def within_margin_note(self, log_loss: float, update: int, margin: float) -> str | None:
        """What the loop says when update ``update``'s adapter, dev ``log_loss``, is kept in place of this one though
        its log loss is not the lowest so far (None when it is)."""
        lowest = self.lowest
        if lowest.update is None or log_loss < lowest.log_loss:
            return None
        return (
            f"update {update} is kept as the best adapter: its dev log loss is within {margin:g} standard error(s) "
            f"of update {lowest.update}'s {lowest.log_loss:.4f}, the lowest so far (best_margin)"
        )

    def to_json(self, *, terms: bool = True) -> dict[str, Any]:
        own = super().to_json(terms=terms)
        figures = {"accuracy": self.accuracy, "majority_accuracy": self.majority_accuracy}
        return {"log_loss": self.log_loss, **figures, **own, "lowest": self.lowest.to_json(terms=terms)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KeptAdapter:
        """The record :meth:`to_json` wrote (a checkpoint's trainer state, whose format stamp vouches for its keys)."""
        lowest = data["lowest"]
        return cls(
            data["log_loss"],
            data["update"],
            tuple(data["dev_losses"]),
            data["accuracy"],
            data["majority_accuracy"],
            DevLoss(lowest["log_loss"], lowest["update"], tuple(lowest["dev_losses"])),
        )


def replaces_best(losses: Sequence[float], best: KeptAdapter, margin: float) -> bool:
    """Whether the adapter whose dev ``losses`` (:func:`dev_metrics`) these are becomes the best, replacing ``best``.

    An adapter evaluated later replaces the best unless its dev log loss is higher than the lowest so far by more
    than ``margin`` standard errors of the two adapters' paired differences, question by question. A few dozen dev
    questions cannot tell apart adapters whose losses differ by less than that, and the later one has been trained
    longer (at the end of a decaying schedule, on every record). The comparison is with the lowest, not with the
    adapter kept last, so that ties cannot chain: each within the noise of the one before, the kept adapter would
    drift away from the best one step at a time. ``margin`` 0, or terms that cannot be paired, keeps the plain rule:
    strictly lower only. A log loss that is not finite never replaces the best."""
    import numpy as np

    mean = float(np.mean(losses)) if len(losses) else 0.0
    if not np.isfinite(mean):
        return False
    before = best.lowest.dev_losses
    tolerance = 0.0
    if margin > 0 and len(before) == len(losses) > 1:
        difference = np.asarray(losses, dtype=float) - np.asarray(before, dtype=float)
        tolerance = margin * float(np.std(difference, ddof=1)) / len(difference) ** 0.5
    return mean < best.lowest.log_loss + tolerance


def collapsed_warning(best: KeptAdapter) -> str | None:
    """What to say when the kept adapter's dev accuracy does not beat always answering the majority class (None when
    it does, or when it has no accuracy: dev held only span questions)."""
    accuracy, majority = best.accuracy, best.majority_accuracy
    if accuracy is None or majority is None or accuracy > majority:
        return None
    return (
        f"the kept adapter's dev accuracy {accuracy:.3f} does not beat always answering the majority class "
        f"({majority:.3f}): training collapsed onto the class prior. A lower peak learning rate (optim.lr) or "
        "another seed may get past it (docs/training-small-models.md#when-training-collapses)"
    )


def dev_line(update: int, metrics: dict[str, Any]) -> str:
    """The one line the loop logs for a dev evaluation."""

    def num(key: str) -> str:
        return "-" if metrics.get(key) is None else f"{metrics[key]:.3f}"

    spans = f" (span questions: {num('span_log_loss')})" if metrics.get("span_questions") else ""
    return (
        f"dev @ update {update}: accuracy {num('accuracy')} (majority {num('majority_accuracy')}), log loss "
        f"{num('log_loss')}{spans}, ECE {num('ece')}, flip rate {metrics['flip_rate']:.2f}, top letter "
        f"{metrics['top_letter']} {metrics['top_letter_share']:.0%}"
    )
