"""What ``prepare`` carries between its steps: each validated row with where it came from, and the ledger that counts
every step's rows in and out and keeps each row that left (for the manifest and rejects.jsonl)."""

from __future__ import annotations

import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from mydecide.config import NearDedupConfig
from mydecide.data import near_dedup, shingles
from mydecide.data.dedup import state_text
from mydecide.records import Record

if TYPE_CHECKING:
    from datasketch import MinHash


@dataclass
class Row:
    """A validated record, where it came from, and its state's words and MinHash once a step needed them."""

    record: Record
    source: str  # the source's label in the recipe (its name, or its kind)
    where: str  # "file:line" in the source
    words: np.ndarray | None = None  # (L,) word hashes of the state (shingles.words)
    sketch: MinHash | None = None  # MinHash of the state with dedup.near's settings

    @property
    def text(self) -> str:
        return state_text(self.record.state)

    def ref(self) -> dict[str, Any]:
        return {"id": self.record.id, "source": self.source, "where": self.where}


def tokenised(rows: Sequence[Row]) -> shingles.Words:
    """The rows' state words, tokenising (once, together) the rows that have none yet."""
    todo = [row for row in rows if row.words is None]
    if todo:
        for row, words in zip(todo, shingles.words([row.text for row in todo]).split(), strict=True):
            row.words = words
    return shingles.Words.join([row.words for row in rows if row.words is not None])


def release(rows: Sequence[Row]) -> None:
    """Drop the words and sketches once no later step needs them (they are most of the memory)."""
    for row in rows:
        row.words = row.sketch = None


def shingling(near: NearDedupConfig) -> shingles.Shingling:
    return shingles.Shingling(near.shingle, near.ngram)


def sketched(rows: Sequence[Row], near: NearDedupConfig) -> list[MinHash]:
    """The rows' MinHash sketches (dedup.near's num_perm, shingling and seed), computing missing ones."""
    todo = [row for row in rows if row.sketch is None]
    if todo:
        texts = tokenised(todo) if near.shingle == "word" else [row.text for row in todo]
        sketches = near_dedup.sketch(texts, num_perm=near.num_perm, ngram=near.ngram, seed=near.seed, unit=near.shingle)
        for row, one in zip(todo, sketches, strict=True):
            row.sketch = one
    return [row.sketch for row in rows if row.sketch is not None]


def decisions(rows: Sequence[Row]) -> near_dedup.Decisions:
    """What near dedup and decontamination compare of each row (its state, or state and question)."""
    questions = [(row.record.question.type, row.record.question.instructions) for row in rows]
    return near_dedup.Decisions.of([row.text for row in rows], questions)


def decision_sketches(rows: Sequence[Row], found: near_dedup.Decisions, near: NearDedupConfig) -> list[Any]:
    """MinHash of each row's decision text: the rows' cached state sketches, and new ones where the question is
    part of the content."""
    out: list[Any] = [None] * len(rows)
    plain = np.flatnonzero(~found.content).tolist()
    for k, one in zip(plain, sketched([rows[k] for k in plain], near), strict=True):
        out[k] = one
    content = np.flatnonzero(found.content).tolist()
    if content:
        texts = [found.texts[k] for k in content]
        made = near_dedup.sketch(texts, num_perm=near.num_perm, ngram=near.ngram, seed=near.seed, unit=near.shingle)
        for k, one in zip(content, made, strict=True):
            out[k] = one
    return out


def decision_words(rows: Sequence[Row], found: near_dedup.Decisions) -> shingles.Words:
    """The words of each row's decision text (the cached state words where the question is not content)."""
    if not found.content.any():
        return tokenised(rows)
    plain = np.flatnonzero(~found.content).tolist()
    parts: list[Any] = [None] * len(rows)
    for k, one in zip(plain, tokenised([rows[k] for k in plain]).split(), strict=True):
        parts[k] = one
    content = np.flatnonzero(found.content).tolist()
    for k, one in zip(content, shingles.words([found.texts[k] for k in content]).split(), strict=True):
        parts[k] = one
    return shingles.Words.join(parts)


@dataclass
class Ledger:
    """What every step did: counts for the manifest and the rows that left, for rejects.jsonl."""

    steps: list[dict[str, Any]] = field(default_factory=list)
    dropped: list[dict[str, Any]] = field(default_factory=list)
    rows_read: int = 0
    exploded_extra: int = 0  # extra records from multi-question rows (one row → n records)
    rejected: int = 0
    removed: int = 0
    augmented: int = 0  # copies added to train (not input rows)
    near_pairs: list[dict[str, Any]] = field(default_factory=list)  # near_dedup's removals, for near_pairs.jsonl
    clock: float = field(default_factory=time.perf_counter)  # end of the previous step

    def lap(self) -> float:
        """Seconds since the previous step ended."""
        now = time.perf_counter()
        seconds, self.clock = now - self.clock, now
        return round(seconds, 3)

    def reject(self, step: str, source: str, where: str, reason: str, raw: Any) -> None:
        self.rejected += 1
        self.dropped.append({"step": step, "reason": reason, "source": source, "where": where, "raw": raw})

    def step(
        self,
        name: str,
        rows_in: Sequence[Row],
        kept: Sequence[Row],
        removed: Sequence[tuple[Row, str, dict[str, Any] | None]],
        **extra: Any,
    ) -> list[Row]:
        """Record one filtering step and return ``kept``; each removal is (row, reason, what it matched)."""
        if len(rows_in) != len(kept) + len(removed):
            raise RuntimeError(f"step {name}: {len(rows_in)} rows in but {len(kept)} kept + {len(removed)} removed")
        self.removed += len(removed)
        for row, reason, matched in removed:
            entry: dict[str, Any] = {"step": name, "reason": reason, **row.ref(), "task": row.record.task}
            if matched is not None:
                entry["matched"] = matched
            entry["record"] = row.record.to_json()
            self.dropped.append(entry)
        self.steps.append(
            {
                "step": name,
                "in": len(rows_in),
                "out": len(kept),
                "removed": len(removed),
                "reasons": dict(Counter(reason for _, reason, _ in removed).most_common()),
                "by_source": in_out(rows_in, kept, lambda r: r.source),
                "by_type": in_out(rows_in, kept, lambda r: r.record.question.type),
                "removed_by_task": dict(sorted(Counter(row.record.task for row, _, _ in removed).items())),
                **extra,
                "seconds": self.lap(),
            }
        )
        return list(kept)


def in_out(rows_in: Sequence[Row], kept: Sequence[Row], key: Callable[[Row], str]) -> dict[str, dict[str, int]]:
    before, after = Counter(map(key, rows_in)), Counter(map(key, kept))
    return {k: {"in": before[k], "out": after[k]} for k in sorted(before)}


def reason_pattern(reason: str) -> str:
    """A rejection reason with its quoted values and numbers masked, so the manifest counts kinds of problems."""
    return re.sub(r"'[^']*'|\"[^\"]*\"|\[[^\]]*\]|\b\d+(?:\.\d+)?\b", "…", reason)


def short_reasons(step: dict[str, Any]) -> str:
    reasons = step.get("reasons") or {}
    return "; ".join(f"{reason}: {n}" for reason, n in list(reasons.items())[:3])


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass


@contextmanager
def progress_bar(enabled: bool, desc: str, total: int | None = None) -> Iterator[Any]:
    """A tqdm progress bar on stderr when ``enabled`` (tqdm comes with ``datasets``), else a no-op."""
    if not enabled:
        yield _NoBar()
        return
    from tqdm import tqdm

    with tqdm(total=total, desc=desc, unit=" rows", file=sys.stderr, leave=False, mininterval=0.5) as bar:
        yield bar
