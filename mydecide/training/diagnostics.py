"""Training diagnostics: collapse detection from dev-set option logits, and the span cells' share against the prior.

A small model trained on few examples can learn "answer B" instead of the task: its dev accuracy then sits at the
class prior and its answers move with the option order. ``collapse_report`` looks for that from the dev predictions
of one pass with shuffled options: the share of answers on the most frequent *letter* (compared with the share of
gold answers on that letter), the flip rate between canonical and shuffled order, and accuracy against the
majority-class baseline.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

LETTER_SHARE_LIMIT = 0.6  # warn when more answers than this go to one letter …
LETTER_EXCESS_LIMIT = 0.25  # … and that is this much more than the gold answers on that letter
FLIP_LIMIT = 0.5


@dataclass
class CollapseReport:
    top_letter: str
    top_letter_share: float
    gold_share_of_top_letter: float
    flip_rate: float
    accuracy: float
    majority_accuracy: float
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def collapse_report(
    predicted_positions: Sequence[int],
    gold_positions: Sequence[int],
    flips: Sequence[bool],
    accuracy: float,
    majority_accuracy: float,
    *,
    check_majority: bool = True,
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
    if check_majority and accuracy <= majority_accuracy:
        report.warnings.append(
            f"dev accuracy {accuracy:.3f} does not beat the majority-class baseline {majority_accuracy:.3f}"
        )
    return report


def span_cells(records: Sequence[Any]) -> list[float]:
    """The 0 / 1 targets of every span question's word × label cells (1: inside a gold span)."""
    return [y for r in records if r.question.type == "span" for y in r.target]


def span_log_odds(records: Sequence[Any]) -> float:
    """The log-odds of the share of span questions' word × label cells inside a gold span (0 without any)."""
    cells = span_cells(records)
    share = min(max(sum(cells) / len(cells), 1e-4), 1 - 1e-4) if cells else 0.5
    return math.log(share / (1 - share))


def span_prior_note(records: Sequence[Any], prior: float | None) -> str | None:
    """The share of the span questions' word × label cells that are inside a gold span, against ``prompt.span.prior``
    (the share every span read starts from); with a warning when they differ more than twofold. None without span
    questions."""
    cells = span_cells(records)
    if not cells:
        return None
    share = sum(cells) / len(cells)
    offset = "no offset" if prior is None else f"prompt.span.prior {prior}"
    line = f"span questions: {share:.1%} of {len(cells):,} word × label cells are in a span ({offset})"
    if prior is not None and not prior / 2 <= share <= 2 * prior:
        line += f"; WARNING: set prompt.span.prior={share:.3g} so that span reads start near the data's share"
    return line
