"""Exact and near-duplicate detection: normalised keys here; shingles, look-alikes and MinHash + LSH in
:mod:`mydecide.data.shingles`, :mod:`mydecide.data.lookalikes` and :mod:`mydecide.data.near_dedup`.

Exact duplicates share the normalised key (case-folded, whitespace-collapsed state + question type +
instructions + options). Near duplicates ask the same question about states whose character 5-gram sets have a
Jaccard similarity ≥ the threshold, short look-alikes with another slot value kept (docs/dedup.md).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from mydecide.data.shingles import normalise
from mydecide.records import Question, Record


def state_text(state: Any) -> str:
    """A record's state as one string: lists joined by newlines, objects as key-sorted JSON."""
    if isinstance(state, str):
        return state
    if isinstance(state, list):
        return "\n".join(str(s) for s in state)
    return json.dumps(state, sort_keys=True, ensure_ascii=False)


def question_key(question: Question) -> str:
    """Type + normalised instructions: records with the same key ask the same question (near-dedup groups)."""
    return f"{question.type}\x1f{normalise(question.instructions)}"


def exact_key(record: Record) -> bytes:
    """16-byte digest of the normalised state + type + instructions + options (options order-free)."""
    q = record.question
    options = sorted(f"{normalise(o)}\x1e{normalise(d)}" for o, d in zip(q.options, q.descriptions, strict=True))
    if q.type == "score":  # level order is part of the question
        options = [normalise(d) for d in q.descriptions]
    blob = "\x1f".join([normalise(state_text(record.state)), question_key(q), *options])
    return hashlib.blake2b(blob.encode("utf-8"), digest_size=16).digest()


def exact_duplicates(keys: Sequence[bytes]) -> dict[int, int]:
    """``{removed index: kept index}``: every row whose key was seen before maps to the first row with it."""
    first: dict[bytes, int] = {}
    removed: dict[int, int] = {}
    for index, key in enumerate(keys):
        kept = first.setdefault(key, index)
        if kept != index:
            removed[index] = kept
    return removed
