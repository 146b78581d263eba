"""Augmentation of the train split, applied after splitting so dev, test and held-out stay untouched.

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
- ``reword_instructions``: the instructions are wrapped in one of a few generic rewordings (``REWORDINGS``:
  "Task: …", "Based on the state: …"), for any question type, so that no one wording carries the task.

Span questions' labels are resampled the same way, so that a span head learns to read the labels it is asked for
(not a fixed list), and a label set it never saw at training is still read by its name and description:

- ``drop_span_labels``: a span question with two or more labels loses 1 … L − 1 of them, with their gold spans
  (the grid is recomputed for the labels left).
- ``rename_span_labels``: label names become random neutral codes (``field-3fa2`` …); descriptions stay (a label
  without one keeps its old name as description) and every gold span keeps its label under the new name.
- ``paraphrase_span_labels``: each label the recipe lists paraphrases for (``span_label_paraphrases``, by label
  name) gets one of them as its description; names and gold spans stay. There is no built-in rewording: a template
  around a description ("mark …") says nothing new, and only a person knows what else a label may be called.
- ``add_absent_span_labels``: 1 … n labels the recipe declares absent from the data (``absent_span_labels``: name →
  description) are asked for too, at random places among the labels, with no gold spans, never past
  ``MAX_SPAN_LABELS``. Gold spans stay.

``schema_resampling`` in the recipe turns on anonymised ids, dropped distractors, reworded instructions and the
span label copies at once (the ways Vela 2.0 resamples a question's schema so that a model learns to read the
options it is shown); paraphrased and absent labels only where the recipe lists them. A label is only ever *added*
with no gold spans when the user declares it absent: a label that is merely not marked in a text is not known to be
absent from it (the bundled PII texts hold postal addresses that no span marks).

Consistency copies (JevBench's coherence laws, taught by example):

- ``negate_noul``: a noul question asked the other way round (one of ``negation_templates``), its yes / no
  criteria swapped and its target complemented (P(yes) becomes 1 − P(yes)). The copy sits right after its
  original and shares its state, so the two usually land in one training batch: a paired example that a noul and
  its negation sum to 1.
- ``rename_options``: choice option ids replaced by random neutral codes (``opt-3fa2`` …; descriptions stay, an
  option without one keeps its old id as description), target attached to its option: the answer must follow
  the meaning, not the name.

The default negation templates and the code form differ on purpose from the ones ``mydecide evaluate
--coherence`` probes with (jevbench's three negation wrappers, ``option_1`` …), so the evaluation measures whether
consistency generalises to a phrasing the model was not trained on.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from mydecide.data.split import unit_interval
from mydecide.records import Question, Record
from mydecide.spans import MAX_SPAN_LABELS, Span, grid_target

AUGMENTATIONS = (
    "anonymize_options",
    "drop_distractors",
    "paraphrase_instructions",
    "reword_instructions",
    "negate_noul",
    "rename_options",
    "drop_span_labels",
    "rename_span_labels",
    "paraphrase_span_labels",
    "add_absent_span_labels",
)
REWORDINGS = (
    "Task: {instructions}",
    "Based on the state: {instructions}",
    "{instructions} Judge from the state alone.",
    "Read the state, then decide. {instructions}",
)
NEGATION_TEMPLATES = (
    "Is the answer to the following question no? {instructions}",
    "Answer the opposite: would it be wrong to say yes to this question? {instructions}",
    "Negated question (yes means the original answer is no): {instructions}",
)


def chosen(record: Record, kind: str, fraction: float, seed: int) -> bool:
    """Whether ``record`` gets a ``kind`` copy: a stable coin with probability ``fraction``."""
    return fraction > 0 and unit_interval(f"{kind}\x1f{record.task}\x1f{record.id}", seed) < fraction


def _rng(record: Record, kind: str, seed: int) -> random.Random:
    return random.Random(f"{seed}\x1f{kind}\x1f{record.task}\x1f{record.id}")


def _copy(
    record: Record, kind: str, question: Question, target: tuple[float, ...], details: Mapping[str, Any]
) -> Record:
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
    question = Question(
        q.type, q.instructions, tuple(q.options[i] for i in keep), tuple(q.descriptions[i] for i in keep)
    )
    target = tuple(record.target[i] for i in keep)
    return _copy(record, "drop_distractors", question, target, {"dropped": [q.options[i] for i in sorted(dropped)]})


def paraphrase_instructions(record: Record, variants: Sequence[str], rng: random.Random) -> Record | None:
    """The copy asking the same question in other words (None when there is no different variant)."""
    q = record.question
    others = [v for v in variants if v.strip() and v != q.instructions]
    if not others:
        return None
    question = replace(q, instructions=rng.choice(others))
    return _copy(record, "paraphrase_instructions", question, record.target, {"instructions_from": q.instructions})


def reword_instructions(record: Record, templates: Sequence[str], rng: random.Random) -> Record | None:
    """The copy whose instructions are wrapped in one generic rewording (any question type)."""
    if not templates:
        return None
    template = rng.choice(list(templates))
    question = replace(record.question, instructions=template.format(instructions=record.question.instructions))
    return _copy(record, "reword_instructions", question, record.target, {"template": template})


def negate_noul(record: Record, templates: Sequence[str], rng: random.Random) -> Record | None:
    """The copy asking the negated noul question with the complementary target (None for other types)."""
    q = record.question
    if q.type != "noul" or not templates:
        return None
    template = rng.choice(list(templates))
    yes, no = q.descriptions
    question = Question("noul", template.format(instructions=q.instructions), q.options, (no, yes))
    target = (record.target[1], record.target[0])  # P(yes | negated) = P(no)
    return _copy(record, "negate_noul", question, target, {"negation_of": q.instructions, "template": template})


def _neutral_codes(question: Question, prefix: str, rng: random.Random) -> list[str]:
    """K distinct random codes ``PREFIX-3fa2`` that are none of the question's option names."""
    codes: list[str] = []
    while len(codes) < question.k:
        code = f"{prefix}-{rng.randrange(16**4):04x}"
        if code not in codes and code not in question.options:
            codes.append(code)
    return codes


def _kept_descriptions(question: Question) -> tuple[str, ...]:
    """The descriptions a renamed question keeps: an option without one keeps its old name as its description."""
    return tuple(d if d.strip() else old for old, d in zip(question.options, question.descriptions, strict=True))


def rename_options(record: Record, rng: random.Random) -> Record | None:
    """The copy with random neutral option codes (choice only; None for other types)."""
    q = record.question
    if q.type != "choice":
        return None
    codes = _neutral_codes(q, "opt", rng)
    question = Question(q.type, q.instructions, tuple(codes), _kept_descriptions(q))
    renamed = dict(zip(q.options, codes, strict=True))
    return _copy(record, "rename_options", question, record.target, {"renamed": renamed})


def _span_copy(
    record: Record, kind: str, question: Question, spans: tuple[Span, ...], details: Mapping[str, Any]
) -> Record:
    copy = _copy(record, kind, question, grid_target(record.state, question, spans), details)
    return replace(copy, spans=spans)


def drop_span_labels(record: Record, rng: random.Random) -> Record | None:
    """The copy of a span question without 1 … L − 1 of its labels and their gold spans (None for other types or a
    single label)."""
    q = record.question
    if q.type != "span" or q.k < 2:
        return None
    dropped = set(rng.sample(range(q.k), rng.randint(1, q.k - 1)))
    keep = [i for i in range(q.k) if i not in dropped]
    question = replace(
        q, options=tuple(q.options[i] for i in keep), descriptions=tuple(q.descriptions[i] for i in keep)
    )
    spans = tuple(s for s in record.spans if s.label in question.options)
    return _span_copy(record, "drop_span_labels", question, spans, {"dropped": [q.options[i] for i in sorted(dropped)]})


def rename_span_labels(record: Record, rng: random.Random) -> Record | None:
    """The copy of a span question whose labels are random neutral codes, descriptions kept (None for other
    types)."""
    q = record.question
    if q.type != "span":
        return None
    codes = _neutral_codes(q, "field", rng)
    renamed = dict(zip(q.options, codes, strict=True))
    question = replace(q, options=tuple(codes), descriptions=_kept_descriptions(q))
    spans = tuple(sorted(replace(s, label=renamed[s.label]) for s in record.spans))
    return _span_copy(record, "rename_span_labels", question, spans, {"renamed": renamed})


def paraphrase_span_labels(
    record: Record, paraphrases: Mapping[str, Sequence[str]], rng: random.Random
) -> Record | None:
    """The copy of a span question whose labels with listed paraphrases (label name → descriptions) take one of
    them as description, gold spans kept (None for other types, or when no label has a paraphrase that differs from
    its description)."""
    q = record.question
    if q.type != "span":
        return None
    descriptions = list(q.descriptions)
    replaced: dict[str, str] = {}
    for i, label in enumerate(q.options):
        others = [v for v in paraphrases.get(label, ()) if v.strip() and v != q.descriptions[i]]
        if others:
            descriptions[i] = rng.choice(others)
            replaced[label] = q.descriptions[i]
    if not replaced:
        return None
    question = replace(q, descriptions=tuple(descriptions))
    return _span_copy(record, "paraphrase_span_labels", question, record.spans, {"descriptions_from": replaced})


def add_absent_span_labels(record: Record, absent: Mapping[str, str], rng: random.Random) -> Record | None:
    """The copy of a span question that also asks for 1 … n of the labels declared absent from the data (label name
    → description), each at a random place, with no gold spans (None for other types, for a question already at
    ``MAX_SPAN_LABELS``, or when every declared label is one of its own, in any case)."""
    q = record.question
    if q.type != "span":
        return None
    own = {label.casefold() for label in q.options}
    candidates = [label for label in absent if label.casefold() not in own]
    most = min(len(candidates), MAX_SPAN_LABELS - q.k)
    if most < 1:
        return None
    added = rng.sample(candidates, rng.randint(1, most))
    options, descriptions = list(q.options), list(q.descriptions)
    for label in added:
        at = rng.randint(0, len(options))
        options.insert(at, label)
        descriptions.insert(at, absent[label])
    question = replace(q, options=tuple(options), descriptions=tuple(descriptions))
    return _span_copy(record, "add_absent_span_labels", question, record.spans, {"absent_labels": added})


def absent_label_clash(record: Record, absent: Mapping[str, str]) -> tuple[str, str] | None:
    """``(declared, own)`` for the first label declared absent that ``record`` (a span question) asks for itself,
    compared in any case; None when there is none."""
    if record.question.type != "span":
        return None
    own = {label.casefold(): label for label in record.question.options}
    return next(((label, own[label.casefold()]) for label in absent if label.casefold() in own), None)


@dataclass(frozen=True)
class AugmentSettings:
    anonymize_options: float = 0.0
    drop_distractors: float = 0.0
    paraphrase_instructions: float = 0.0
    paraphrases: Mapping[str, Sequence[str]] | None = None
    reword_instructions: float = 0.0
    rewordings: Sequence[str] = REWORDINGS
    negate_noul: float = 0.0
    rename_options: float = 0.0
    drop_span_labels: float = 0.0
    rename_span_labels: float = 0.0
    paraphrase_span_labels: float = 0.0
    span_label_paraphrases: Mapping[str, Sequence[str]] | None = None
    add_absent_span_labels: float = 0.0
    absent_span_labels: Mapping[str, str] | None = None
    negation_templates: Sequence[str] = NEGATION_TEMPLATES
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
        made.append(paraphrase_instructions(record, variants, _rng(record, "paraphrase_instructions", settings.seed)))
    if chosen(record, "reword_instructions", settings.reword_instructions, settings.seed):
        made.append(
            reword_instructions(record, settings.rewordings, _rng(record, "reword_instructions", settings.seed))
        )
    if record.question.type == "noul" and chosen(record, "negate_noul", settings.negate_noul, settings.seed):
        made.append(negate_noul(record, settings.negation_templates, _rng(record, "negate_noul", settings.seed)))
    if record.question.type == "choice" and chosen(record, "rename_options", settings.rename_options, settings.seed):
        made.append(rename_options(record, _rng(record, "rename_options", settings.seed)))
    if record.question.type == "span":
        paraphrases, absent = settings.span_label_paraphrases or {}, settings.absent_span_labels or {}
        for kind, fraction, make in (
            ("drop_span_labels", settings.drop_span_labels, drop_span_labels),
            ("rename_span_labels", settings.rename_span_labels, rename_span_labels),
            (
                "paraphrase_span_labels",
                settings.paraphrase_span_labels,
                lambda r, rng: paraphrase_span_labels(r, paraphrases, rng),
            ),
            (
                "add_absent_span_labels",
                settings.add_absent_span_labels,
                lambda r, rng: add_absent_span_labels(r, absent, rng),
            ),
        ):
            if chosen(record, kind, fraction, settings.seed):
                made.append(make(record, _rng(record, kind, settings.seed)))
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
