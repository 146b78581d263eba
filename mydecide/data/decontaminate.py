"""Decontamination: drop training rows whose state text overlaps an evaluation item.

Three checks on the state text, strongest first: exact match after normalisation (case-folded, whitespace
collapsed), MinHash near match (word-shingle Jaccard ≥ a threshold, candidates from an LSH index), and a shared
word 13-gram (the n-gram overlap test used by evaluation harnesses; states shorter than n words have no n-gram
and are judged by the first two checks only). Every match names the eval file and the eval item's id.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mydecide.data.dedup import (
    Progress,
    Words,
    estimated_jaccard,
    lsh_index,
    normalise,
    shingle,
    signature_matrix,
    sketch,
    state_text,
    tokens,
    words,
)

if TYPE_CHECKING:
    from datasketch import MinHash


@dataclass(frozen=True)
class EvalItem:
    file: str  # the eval file as named in the recipe
    id: str  # the item's id, or ``<file name>:<line>`` when it has none
    text: str  # the state as one string


@dataclass(frozen=True)
class Contamination:
    method: str  # "exact" | "near" | "ngram"
    file: str
    item_id: str
    similarity: float | None = None  # near: estimated Jaccard
    shared: str | None = None  # ngram: the shared n-gram (normalised words)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "eval_file": self.file, "eval_id": self.item_id}
        if self.similarity is not None:
            out["similarity"] = round(self.similarity, 4)
        if self.shared is not None:
            out["shared_ngram"] = self.shared
        return out


def read_eval_jsonl(path: str | Path) -> tuple[list[EvalItem], list[str]]:
    """Eval items (state + id) from a JSONL file of records or wire-format cases; also the unreadable lines.

    Only the state matters here, so a line is usable when it is a JSON object with a non-empty ``state``; the
    others are returned as ``"file:line: reason"`` for the manifest. A file with no usable line is an error.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such eval file (decontaminate_against)")
    items: list[EvalItem] = []
    problems: list[str] = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path.name}:{number}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                problems.append(f"{where}: invalid JSON ({err.msg})")
                continue
            state = obj.get("state") if isinstance(obj, dict) else None
            if state in (None, "", [], {}):
                problems.append(f"{where}: no state")
                continue
            item_id = obj.get("id")
            items.append(EvalItem(str(path), str(item_id) if item_id not in (None, "") else where,
                                  state_text(state)))
    if not items:
        raise ValueError(f"{path}: no eval item with a state to decontaminate against")
    return items, problems


class EvalIndex:
    """The eval items indexed for the three checks; :meth:`match` finds the first contamination per text."""

    def __init__(self, items: Sequence[EvalItem], *, exact: bool = True, near: bool = True,
                 threshold: float = 0.8, num_perm: int = 128, shingle_words: int = 5, seed: int = 1,
                 overlap_words: int = 13):
        self.items = list(items)
        self.exact = exact
        self.near = near
        self.threshold = threshold
        self.num_perm = num_perm
        self.shingle_words = shingle_words
        self.seed = seed
        self.overlap_words = overlap_words
        texts = [item.text for item in self.items]

        self._exact: dict[str, int] = {}
        if exact:
            for index, text in enumerate(texts):
                self._exact.setdefault(normalise(text), index)

        tokenised = words(texts)
        if near and self.items:
            sketches = sketch(tokenised, num_perm=num_perm, ngram=shingle_words, seed=seed)
            self._sigs = signature_matrix(sketches)
            self._lsh = lsh_index(sketches, threshold=threshold)

        # sorted distinct n-gram hashes, with the first eval item holding each
        self._grams = np.empty(0, dtype=np.uint64)
        self._gram_owner = np.empty(0, dtype=np.int64)
        if overlap_words > 0 and self.items:
            grams = shingle(tokenised, overlap_words, short="skip")
            owner = np.repeat(np.arange(len(texts)), np.diff(grams.offsets))  # (S,)
            self._grams, first = np.unique(grams.hashes, return_index=True)
            self._gram_owner = owner[first]

    def match(self, texts: Sequence[str], progress: Progress | None = None, *, tokenised: Words | None = None,
              sketches: Sequence[MinHash] | None = None) -> list[Contamination | None]:
        """One entry per text: the first check it fails (exact, then near, then n-gram), or None if clean.

        ``tokenised`` (the texts' :class:`Words`) and ``sketches`` (their MinHash with this index's num_perm,
        shingle length and seed) may be passed when the caller has them already.
        """
        found: list[Contamination | None] = [None] * len(texts)
        if not self.items or not texts:
            return found
        if self.exact:
            for i, text in enumerate(texts):
                index = self._exact.get(normalise(text))
                if index is not None:
                    found[i] = self._hit("exact", index)
        if self.near or self.overlap_words > 0:
            text_words = tokenised if tokenised is not None else words(texts)
            if self.near:
                if sketches is None:
                    sketches = sketch(text_words, num_perm=self.num_perm, ngram=self.shingle_words, seed=self.seed)
                self._match_near(sketches, found)
            if self.overlap_words > 0 and len(self._grams):
                self._match_ngrams(texts, text_words, found)
        if progress is not None:
            progress(len(texts))
        return found

    def _hit(self, method: str, index: int, similarity: float | None = None,
             shared: str | None = None) -> Contamination:
        item = self.items[index]
        return Contamination(method, item.file, item.id, similarity, shared)

    def _match_near(self, sketches: Sequence[MinHash], found: list[Contamination | None]) -> None:
        for i, one in enumerate(sketches):
            if found[i] is not None:
                continue
            candidates = sorted(self._lsh.query(one))
            if not candidates:
                continue
            similarity = estimated_jaccard(one.hashvalues, self._sigs[candidates])
            best = int(np.argmax(similarity))
            if similarity[best] >= self.threshold:
                found[i] = self._hit("near", candidates[best], similarity=float(similarity[best]))

    def _match_ngrams(self, texts: Sequence[str], tokenised: Words, found: list[Contamination | None]) -> None:
        todo = [i for i in range(len(texts)) if found[i] is None]
        if not todo:
            return
        parts = tokenised.split()
        grams = shingle(Words.join([parts[i] for i in todo]), self.overlap_words, short="skip")
        slots = np.flatnonzero(np.isin(grams.hashes, self._grams))  # n-grams also in some eval item
        if not len(slots):
            return
        text_of_slot = np.searchsorted(grams.offsets, slots, side="right") - 1
        rows, first = np.unique(text_of_slot, return_index=True)  # first shared n-gram of each text
        for row, slot in zip(rows.tolist(), slots[first].tolist(), strict=True):
            owner = int(self._gram_owner[np.searchsorted(self._grams, grams.hashes[slot])])
            start = slot - int(grams.offsets[row])
            words = tokens(texts[todo[row]])[start:start + self.overlap_words]
            found[todo[row]] = self._hit("ngram", owner, shared=" ".join(words))
