"""Baselines beside the model: the majority class per task, the one majority definition of the package.

The majority baseline predicts each task's label distribution (add-one smoothed), taken from the training split
when one sits beside the eval data, else from the eval data itself ("in-sample majority", said so in the report).
Evaluation reports it per task; training's dev metrics report its accuracy (:func:`majority_accuracy`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mydecide import metrics
from mydecide.evaluation.rows import MetricRow, question_rows
from mydecide.record_files import read_records
from mydecide.records import Record


@dataclass
class LabelPrior:
    """Label distributions per task, from which the majority baseline predicts (add-one smoothed).

    ``mass[(task, type)][option]`` sums the target mass of each option id; ``count`` the questions seen.
    """

    source: str
    mass: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    count: dict[tuple[str, str], int] = field(default_factory=dict)

    @classmethod
    def from_records(cls, records: Sequence[Record], source: str) -> LabelPrior:
        prior = cls(source)
        for r in records:
            key = (r.task, r.question.type)
            mass = prior.mass.setdefault(key, {})
            labels = r.question.options
            for n, y in enumerate(r.target):  # a span question: a row of labels per word
                mass[labels[n % len(labels)]] = mass.get(labels[n % len(labels)], 0.0) + y
            rows = len(r.target) // len(labels) if r.question.type == "span" else 1
            prior.count[key] = prior.count.get(key, 0) + rows
        return prior

    @classmethod
    def from_file(cls, path: str | Path) -> LabelPrior:
        """The label distribution of a training split file (rows that do not validate are skipped)."""
        return cls.from_records(read_records(path)[0], str(path))

    def knows(self, record: Record) -> bool:
        return (record.task, record.question.type) in self.count

    def predict(self, record: Record) -> np.ndarray:
        """The prior over this record's options; set → P(label) per label; span → P(label) per word × label cell
        (add-one smoothed)."""
        key = (record.task, record.question.type)
        mass, n = self.mass.get(key, {}), self.count.get(key, 0)
        counts = np.array([mass.get(o, 0.0) for o in record.question.options])
        if record.question.type == "span":
            return np.tile((counts + 1.0) / (n + 2.0), len(record.target) // record.question.k)
        if record.question.type == "set":
            return (counts + 1.0) / (n + 2.0)
        return (counts + 1.0) / (counts.sum() + len(counts))


def majority_rows(records: Sequence[Record], prior: LabelPrior | None) -> tuple[list[MetricRow], dict[str, Any]]:
    """Rows of the majority baseline and a description of where its label distribution came from.

    Tasks the training split does not have (held-out tasks), or every task when there is no training split,
    use the eval records' own label distribution: an "in-sample majority", said so in the report.
    """
    in_sample_tasks = sorted({r.task for r in records if prior is None or not prior.knows(r)})
    in_sample = LabelPrior.from_records([r for r in records if r.task in in_sample_tasks], "in-sample")
    rows: list[MetricRow] = []
    for n, record in enumerate(records):
        source = prior if prior is not None and prior.knows(record) else in_sample
        flipped = False if record.question.type == "choice" else None
        rows += question_rows(n, record, source.predict(record), flipped=flipped)
    info = {"source": prior.source if prior is not None else "in-sample majority", "in_sample_tasks": in_sample_tasks}
    if prior is not None and in_sample_tasks:
        info["note"] = "tasks absent from the training split use the in-sample majority of the eval data"
    return rows, info


def majority_accuracy(records: Sequence[Record], prior: LabelPrior | None) -> float:
    """Accuracy of the majority baseline (:func:`majority_rows`) on the records' single-answer questions; 0.0
    when every question is a set or a span."""
    single = [r for r in records if r.question.type not in ("set", "span")]
    if not single:
        return 0.0
    rows, _ = majority_rows(single, prior)
    return metrics.accuracy([r.probs for r in rows], [r.target for r in rows])
