"""Coherence laws (JevBench-style), each a violation rate over the questions it applies to.

1. a noul and its negation sum to about 1; 2. anonymised option ids keep the answer (where descriptions carry the
meaning); 3. an answer does not depend on the other questions scored with it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from mydecide.records import Question, Record
from mydecide.scoring.engine import QuestionScorer, score_records
from mydecide.scoring.probabilities import TemperatureLookup, calibrated_probabilities
from mydecide.scoring.render import render_state
from mydecide.scoring.yes_no import family

NEGATION_TEMPLATE = "Is it NOT the case that: {instructions}"
NEGATION_TOLERANCE = 0.05
"""A noul and its negation violate coherence when |P(yes) + P(yes | negated) − 1| exceeds this."""
CONTEXT_TOLERANCE = 0.01
"""An answer depends on its companions when a probability moves by more than this (bf16 noise is ~1e-3)."""


def negated(question: Question) -> Question:
    """The noul question with its instruction negated and its yes / no criteria swapped."""
    yes, no = question.descriptions
    return Question("noul", NEGATION_TEMPLATE.format(instructions=question.instructions), question.options, (no, yes))


def anonymised(question: Question) -> Question:
    """The choice question with its option ids replaced by option_1 … option_K (descriptions kept)."""
    ids = tuple(f"option_{i + 1}" for i in range(question.k))
    return Question(question.type, question.instructions, ids, question.descriptions)


def coherence_checks(
    scorer: QuestionScorer,
    records: Sequence[Record],
    logits: Sequence[np.ndarray],
    temperature: TemperatureLookup,
    *,
    progress: bool = True,
) -> dict[str, Any]:
    """JevBench-style coherence laws, each as a violation rate over the questions it applies to."""

    def probs(record: Record, z: np.ndarray) -> np.ndarray:
        q = record.question
        return calibrated_probabilities(family(q), q.k, z, temperature)

    out: dict[str, Any] = {}

    # 1. a noul and its negation sum to ~1
    nouls = [i for i, r in enumerate(records) if r.question.type == "noul"]
    neg, _ = score_records(
        scorer,
        [(records[i].state, negated(records[i].question)) for i in nouls],
        desc="coherence: negation",
        progress=progress,
    )
    gaps = [
        abs(probs(records[i], logits[i])[0] + calibrated_probabilities("noul", 2, z, temperature)[0] - 1.0)
        for i, z in zip(nouls, neg, strict=True)
    ]
    out["negation"] = {
        "n": len(gaps),
        "tolerance": NEGATION_TOLERANCE,
        "template": NEGATION_TEMPLATE,
        "violation_rate": float(np.mean([g > NEGATION_TOLERANCE for g in gaps])) if gaps else None,
        "mean_gap": float(np.mean(gaps)) if gaps else None,
    }

    # 2. anonymised option ids keep the answer (only where descriptions carry the meaning)
    choices = [i for i, r in enumerate(records) if r.question.type == "choice" and all(r.question.descriptions)]
    renamed, _ = score_records(
        scorer,
        [(records[i].state, anonymised(records[i].question)) for i in choices],
        desc="coherence: renaming",
        progress=progress,
    )
    changed = [int(np.argmax(z)) != int(np.argmax(logits[i])) for i, z in zip(choices, renamed, strict=True)]
    out["renaming"] = {
        "n": len(changed),
        "violation_rate": float(np.mean(changed)) if changed else None,
        "note": "choice questions whose options all have descriptions; ids → option_1 … option_K",
    }

    # 3. an answer does not depend on the other questions scored with it
    out["context"] = context_independence(scorer, records, temperature, progress=progress)
    return out


def context_independence(
    scorer: QuestionScorer,
    records: Sequence[Record],
    temperature: TemperatureLookup,
    *,
    companions: int = 2,
    progress: bool = True,
) -> dict[str, Any]:
    """Each question scored alone vs in one request with the other questions of its state.

    A state with a single question borrows ``companions`` questions from other records (different states) so
    the law is tested everywhere. Violation: a probability moves by more than ``CONTEXT_TOLERANCE``.
    """
    from tqdm import tqdm

    by_state: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        by_state.setdefault(render_state(r.state), []).append(i)
    diffs: list[float] = []
    argmax_changed: list[bool] = []
    bar = tqdm(
        total=len(records), desc="coherence: context", unit="q", file=sys.stderr, disable=not progress, leave=False
    )
    order = list(by_state.values())
    for g, members in enumerate(order):
        state = records[members[0]].state
        questions = [records[i].question for i in members]
        if len(members) == 1:
            # a span question's part may not exist in another state: companions are the other types
            others = [
                records[j[0]].question for j in order[g + 1 :] + order[:g] if records[j[0]].question.type != "span"
            ]
            others = others[:companions]
            questions += others
        together = scorer([(state, q) for q in questions], None)
        for pos, i in enumerate(members):
            q = records[i].question
            alone = scorer([(state, q)], None)[0]
            p_alone = calibrated_probabilities(family(q), q.k, alone, temperature)
            p_together = calibrated_probabilities(family(q), q.k, together[pos], temperature)
            diffs.append(float(np.max(np.abs(p_alone - p_together))))
            if q.type not in ("set", "span"):
                argmax_changed.append(int(np.argmax(p_alone)) != int(np.argmax(p_together)))
            bar.update(1)
    bar.close()
    return {
        "n": len(diffs),
        "tolerance": CONTEXT_TOLERANCE,
        "violation_rate": float(np.mean([d > CONTEXT_TOLERANCE for d in diffs])) if diffs else None,
        "argmax_change_rate": float(np.mean(argmax_changed)) if argmax_changed else None,
        "max_abs_diff": max(diffs) if diffs else None,
    }
