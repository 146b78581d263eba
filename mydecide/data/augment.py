"""Augmentation of the train split (SPEC §4), applied after splitting so dev, test and held-out stay untouched.

Each augmentation adds a copy of an eligible row (the original stays), chosen by a stable hash of the row id
so a rerun makes the same copies. Copies carry their provenance in ``meta`` (``augmented``: what was done,
``source_id``: the original row). Option-order shuffling is not done here: the training collator reshuffles
choice options every epoch. Score levels are never reordered, renamed or dropped.

- ``anonymize_options``: choice option ids become ``option_1`` … ``option_K`` (shown order); descriptions stay
  (an option without a description gets its old id as description, so no meaning is lost); the target moves
  with its option.
- ``drop_distractors``: a choice question with more than two options loses 1 … K − 2 options that carry no
  target mass; the gold option and every option with mass stay.
- ``paraphrase_instructions``: the instructions are swapped for one of the recipe's variants for them.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from mydecide.data.split import unit_interval
from mydecide.records import Question, Record

AUGMENTATIONS = ("anonymize_options", "drop_distractors", "paraphrase_instructions")


def chosen(record: Record, kind: str, fraction: float, seed: int) -> bool:
    """Whether ``record`` gets a ``kind`` copy: a stable coin with probability ``fraction``."""
    return fraction > 0 and unit_interval(f"{kind}\x1f{record.task}\x1f{record.id}", seed) < fraction


def _rng(record: Record, kind: str, seed: int) -> random.Random:
    return random.Random(f"{seed}\x1f{kind}\x1f{record.task}\x1f{record.id}")


def _copy(record: Record, kind: str, question: Question, target: tuple[float, ...],
          details: Mapping[str, Any]) -> Record:
    meta = {**record.meta, "augmented": kind, "source_id": record.id, **details}
    return replace(record, question=question, target=target, id=f"{record.id}~{kind}", meta=meta)


def anonymize_options(record: Record) -> Record | None:
    """The copy with neutral option ids (choice only; None for other types)."""
    q = record.question
    if q.type != "choice":
        return None
    new_ids = tuple(f"option_{i + 1}" for i in range(q.k))
    descriptions = tuple(d if d.strip() else old for old, d in zip(q.options, q.descriptions, strict=True))
    question = Question(q.type, q.instructions, new_ids, descriptions)
    renamed = dict(zip(q.options, new_ids, strict=True))
    return _copy(record, "anonymize_options", question, record.target, {"renamed": renamed})


def drop_distractors(record: Record, rng: random.Random) -> Record | None:
    """The copy without some zero-mass options (choice with > 2 options and a droppable one; else None)."""
    q = record.question
    if q.type != "choice" or q.k <= 2:
        return None
    droppable = [i for i, p in enumerate(record.target) if p == 0.0]
    most = min(len(droppable), q.k - 2)
    if most < 1:
        return None
    dropped = set(rng.sample(droppable, rng.randint(1, most)))
    keep = [i for i in range(q.k) if i not in dropped]
    question = Question(q.type, q.instructions, tuple(q.options[i] for i in keep),
                        tuple(q.descriptions[i] for i in keep))
    target = tuple(record.target[i] for i in keep)
    return _copy(record, "drop_distractors", question, target,
                 {"dropped": [q.options[i] for i in sorted(dropped)]})


def paraphrase_instructions(record: Record, variants: Sequence[str], rng: random.Random) -> Record | None:
    """The copy asking the same question in other words (None when there is no different variant)."""
    q = record.question
    others = [v for v in variants if v.strip() and v != q.instructions]
    if not others:
        return None
    question = replace(q, instructions=rng.choice(others))
    return _copy(record, "paraphrase_instructions", question, record.target,
                 {"instructions_from": q.instructions})


@dataclass(frozen=True)
class AugmentSettings:
    anonymize_options: float = 0.0
    drop_distractors: float = 0.0
    paraphrase_instructions: float = 0.0
    paraphrases: Mapping[str, Sequence[str]] | None = None
    seed: int = 13


def copies(record: Record, settings: AugmentSettings) -> list[Record]:
    """The augmented copies of one train row (often none)."""
    made: list[Record | None] = []
    if chosen(record, "anonymize_options", settings.anonymize_options, settings.seed):
        made.append(anonymize_options(record))
    if chosen(record, "drop_distractors", settings.drop_distractors, settings.seed):
        made.append(drop_distractors(record, _rng(record, "drop_distractors", settings.seed)))
    variants = (settings.paraphrases or {}).get(record.question.instructions)
    if variants and chosen(record, "paraphrase_instructions", settings.paraphrase_instructions, settings.seed):
        made.append(paraphrase_instructions(record, variants, _rng(record, "paraphrase_instructions",
                                                                   settings.seed)))
    return [copy for copy in made if copy is not None]


def augment(records: Sequence[Record], settings: AugmentSettings) -> tuple[list[Record], dict[str, int]]:
    """The train rows with their augmented copies (each copy right after its original), and copies per kind."""
    out: list[Record] = []
    added = dict.fromkeys(AUGMENTATIONS, 0)
    for record in records:
        out.append(record)
        for copy in copies(record, settings):
            out.append(copy)
            added[str(copy.meta["augmented"])] += 1
    return out, added
