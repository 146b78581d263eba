"""Dev evaluation during training: the metrics, the collapse check and the line the loop logs.

``dev_metrics`` scores the dev records with the model as it is (no gradient), so under DDP the main process runs it
alone; under FSDP / ZeRO-3 every process must run it, since each forward pass gathers the sharded weights (the loop
decides which, see ``checkpoints.is_sharded``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mydecide.evaluation.baselines import LabelPrior, majority_accuracy
from mydecide.records import Record


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
    from mydecide.training.diagnostics import collapse_report

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


def replaces_best(losses: Sequence[float], best: dict[str, Any], margin: float) -> bool:
    """Whether the adapter whose dev ``losses`` (:func:`dev_metrics`) these are becomes the best, replacing ``best``
    (the loop's record of the kept adapter: ``log_loss``, ``update``, ``dev_losses``, the same terms, and ``lowest``,
    the same three for the adapter with the lowest dev log loss so far: :func:`kept_record`).

    An adapter evaluated later replaces the best unless its dev log loss is higher than the lowest so far by more
    than ``margin`` standard errors of the two adapters' paired differences, question by question. A few dozen dev
    questions cannot tell apart adapters whose losses differ by less than that, and the later one has been trained
    longer (at the end of a decaying schedule, on every record). The comparison is with the lowest, not with the
    adapter kept last, so that ties cannot chain: each within the noise of the one before, the kept adapter would
    drift away from the best one step at a time. ``margin`` 0, or a best saved without its terms (a checkpoint from
    before), keeps the plain rule: strictly lower only. A log loss that is not finite never replaces the best."""
    import numpy as np

    mean = float(np.mean(losses)) if len(losses) else 0.0
    if not np.isfinite(mean):
        return False
    reference = lowest_so_far(best)
    before = reference.get("dev_losses")
    tolerance = 0.0
    if margin > 0 and before is not None and len(before) == len(losses) > 1:
        difference = np.asarray(losses, dtype=float) - np.asarray(before, dtype=float)
        tolerance = margin * float(np.std(difference, ddof=1)) / len(difference) ** 0.5
    return mean < reference["log_loss"] + tolerance


def lowest_so_far(best: dict[str, Any]) -> dict[str, Any]:
    """The record of the adapter with the lowest dev log loss so far (``log_loss``, ``update``, ``dev_losses``): the
    best's ``lowest``, or for a best saved before it carried one, the kept adapter's own."""
    return best.get("lowest") or best


def kept_record(best: dict[str, Any], metrics: dict[str, Any], losses: Sequence[float], update: int) -> dict[str, Any]:
    """The loop's record of the best adapter once update ``update``'s (dev ``metrics`` and ``losses``) is kept in
    place of ``best``: its figures, and the lowest dev log loss so far (this one's, or the one it was within the
    noise of). It travels in every checkpoint (JSON)."""
    terms = [round(float(x), 7) for x in losses]
    this = {"log_loss": metrics["log_loss"], "update": update, "dev_losses": terms}
    lowest = lowest_so_far(best)
    if lowest.get("update") is None or metrics["log_loss"] < lowest["log_loss"]:
        lowest = this
    else:
        lowest = {key: lowest.get(key) for key in this}
    return {
        "log_loss": metrics["log_loss"],
        "accuracy": metrics["accuracy"],
        "majority_accuracy": metrics["majority_accuracy"],  # for close_run's collapse warning
        "update": update,
        "dev_losses": terms,  # the next comparisons' terms
        "lowest": lowest,
    }


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
