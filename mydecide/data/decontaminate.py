"""Decontamination: drop training rows whose decision content overlaps an evaluation item.

Rows and eval items are compared by their :class:`~mydecide.data.near_dedup.Decisions` texts: the state, or the
state and the question where the question is content (asked of at most ``CONTENT_ROWS`` rows, or items, of its
type: yes/no trivia, claims to verify), so an eval item whose content is in its question is found in a training
row asking it. Checks on that text, strongest first: exact match after normalisation (case-folded, whitespace
collapsed), near match (shingle Jaccard ≥ a threshold with dedup's shingles, by default character 5-grams, so a
short eval item copied with an edit is found; candidates from an LSH index, verified on the exact shingle sets, short
look-alikes with another slot value kept), a shared word 13-gram (the n-gram overlap test of evaluation
harnesses), and, for texts shorter than 13 words, containment: a short eval item found whole inside a training
row, or a short row found whole inside an eval item. With ``short_edits``, two more for the short items those
miss: a 5-7-word item inside a row when the phrase is rare in the rows, and a row that is a 3-12-word item with
one word inserted, left out or misspelt, or with a greeting or sign-off around it. Every match names the eval
file and the eval item's id.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mydecide.data.dedup import state_text
from mydecide.data.lookalikes import different_slots, misspelt
from mydecide.data.near_dedup import (
    Decisions,
    Progress,
    Verifier,
    band_keys,
    candidate_threshold,
    estimated_jaccard,
    lsh_index,
    sharing_a_band,
    signature_matrix,
    sketch,
)
from mydecide.data.shingles import Shingles, Shingling, Words, normalise, shingle, tokens, words
from mydecide.errors import UserError
from mydecide.jsonl import iter_jsonl

if TYPE_CHECKING:
    from datasketch import MinHash


EDIT_MIN_WORDS = 3  # shorter eval items are matched exactly or by Jaccard only
AFFIX_WORDS = 6  # words a greeting or sign-off may add around a short eval item
PHRASE_MIN_WORDS = 5  # eval items this long and under whole_min_words are found inside rows when not common
COMMON_ROWS = 3  # ... in at most this many rows


@dataclass(frozen=True)
class EvalItem:
    file: str  # the eval file as named in the recipe
    id: str  # the item's id, or ``<file name>:<line>`` when it has none
    text: str  # the state as one string
    question: str = ""  # the question's instructions ("" when the item has none)
    type: str = ""  # the question's type


def question_of(obj: dict[str, Any]) -> tuple[str, str]:
    """(instructions, type) of a raw eval line's ``question``, or ("", "") when it has none usable (a line with
    several ``questions`` asks them about one state: its state is the item)."""
    question = obj.get("question")
    if isinstance(question, dict) and isinstance(question.get("instructions"), str):
        return question["instructions"], str(question.get("type") or "")
    return "", ""


@dataclass(frozen=True)
class Contamination:
    method: str  # "exact" | "near" | "ngram" | "contained" | "edit"
    file: str
    item_id: str
    similarity: float | None = None  # near: estimated Jaccard
    shared: str | None = None  # ngram / contained: the shared words (normalised); edit: what changed

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "eval_file": self.file, "eval_id": self.item_id}
        if self.similarity is not None:
            out["similarity"] = round(self.similarity, 4)
        if self.shared is not None:
            out["edit" if self.method == "edit" else "shared_ngram"] = self.shared
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
    for where, obj, error in iter_jsonl(path):
        if error is not None:
            problems.append(f"{where}: {error}")
            continue
        state = obj.get("state") if isinstance(obj, dict) else None
        if state in (None, "", [], {}):
            problems.append(f"{where}: no state")
            continue
        item_id = obj.get("id")
        name = str(item_id) if item_id not in (None, "") else where
        items.append(EvalItem(str(path), name, state_text(state), *question_of(obj)))
    if not items:
        raise UserError(f"{path}: no eval item with a state to decontaminate against")
    return items, problems


class EvalIndex:
    """The eval items indexed for the checks; :meth:`match` finds the first contamination per text."""

    def __init__(
        self,
        items: Sequence[EvalItem],
        *,
        exact: bool = True,
        near: bool = True,
        threshold: float = 0.7,
        num_perm: int = 128,
        shingling: Shingling | None = None,
        seed: int = 1,
        overlap_words: int = 13,
        whole_min_words: int = 5,
        keep_slot_changes: bool = True,
        short_edits: bool = True,
    ):
        self.items = list(items)
        self.exact = exact
        self.near = near
        self.threshold = threshold
        self.num_perm = num_perm
        self.shingling = shingling or Shingling()
        self.seed = seed
        self.overlap_words = overlap_words
        self.whole_min_words = whole_min_words
        self.keep_slot_changes = keep_slot_changes
        self.short_edits = short_edits
        decisions = Decisions.of([item.text for item in self.items], [(i.type, i.question) for i in self.items])
        texts = self.texts = decisions.texts  # the state, or state and question when the question is content
        self._content = decisions.content

        self._exact: dict[str, int] = {}
        if exact:
            for index, text in enumerate(texts):
                self._exact.setdefault(normalise(text), index)

        self._words = words(texts)
        if near and self.items:
            sketches = self._sketch(texts, self._words)
            self._sigs = signature_matrix(sketches)
            self._lsh = lsh_index(sketches, threshold=candidate_threshold(threshold))

        # sorted distinct n-gram hashes, with the first eval item holding each
        self._grams = np.empty(0, dtype=np.uint64)
        self._gram_owner = np.empty(0, dtype=np.int64)
        if overlap_words > 0 and self.items:
            self._grams, self._gram_owner = _owned(shingle(self._words, overlap_words, short="skip"))

        # short items (EDIT_MIN_WORDS to overlap_words - 1 words) by their words, and with each word left out
        self._short_words: list[tuple[str, ...]] = []
        self._whole: dict[tuple[str, ...], int] = {}
        self._left_out: dict[tuple[str, ...], list[tuple[int, int]]] = {}
        if short_edits:
            self._short_words = [tuple(tokens(text)) for text in texts]
            for index, item_words in enumerate(self._short_words):
                if EDIT_MIN_WORDS <= len(item_words) < max(overlap_words, EDIT_MIN_WORDS + 1):
                    self._whole.setdefault(item_words, index)
                    for p, width in _gaps(len(item_words)):
                        left_out = item_words[:p] + item_words[p + width :]
                        self._left_out.setdefault(left_out, []).append((index, p if width == 1 else -1))

    def _sketch(self, texts: Sequence[str], tokenised: Words) -> list[MinHash]:
        return sketch(
            tokenised if self.shingling.unit == "word" else texts,
            num_perm=self.num_perm,
            ngram=self.shingling.n,
            seed=self.seed,
            unit=self.shingling.unit,
        )

    def match(
        self,
        texts: Sequence[str],
        progress: Progress | None = None,
        *,
        tokenised: Words | None = None,
        sketches: Sequence[MinHash] | None = None,
        phrase_rows: np.ndarray | None = None,
    ) -> list[Contamination | None]:
        """One entry per text: the first check it fails (exact, near, n-gram, contained, edit), or None if clean.

        ``tokenised`` (the texts' :class:`Words`) and ``sketches`` (their MinHash with this index's num_perm,
        shingling and seed) may be passed when the caller has them already; ``phrase_rows`` (:meth:`phrase_rows`
        summed over all rows) when these texts are only a part of the rows.
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
                    sketches = self._sketch(texts, text_words)
                self._match_near(texts, sketches, found)
            if self.overlap_words > 0 and len(self._grams):
                self._match_ngrams(texts, text_words, found)
            if self.overlap_words > 0 and self.whole_min_words > 0:
                self._match_contained(texts, text_words, found)
            if self.short_edits and self.whole_min_words > PHRASE_MIN_WORDS:
                self._match_rare_phrases(texts, text_words, found, phrase_rows)
        if self._whole:
            self._match_short_edits(texts, tokenised, found)
        if progress is not None:
            progress(len(texts))
        return found

    def _hit(
        self, method: str, index: int, similarity: float | None = None, shared: str | None = None
    ) -> Contamination:
        item = self.items[index]
        return Contamination(method, item.file, item.id, similarity, shared)

    def _match_near(self, texts: Sequence[str], sketches: Sequence[MinHash], found: list[Contamination | None]) -> None:
        verify = Verifier(
            texts, self.shingling, self.threshold, others=self.texts, keep_slot_changes=self.keep_slot_changes
        )
        lsh_threshold = candidate_threshold(self.threshold)
        linked = sharing_a_band(
            band_keys(signature_matrix(sketches), lsh_threshold), band_keys(self._sigs, lsh_threshold)
        )
        for i, one in enumerate(sketches):
            if found[i] is not None or not linked[i]:
                continue
            candidates = sorted(self._lsh.query(one))
            if not candidates:
                continue
            match = verify.best(i, candidates, estimated_jaccard(one.hashvalues, self._sigs[candidates]))
            if match is not None:
                found[i] = self._hit("near", match.kept, similarity=match.similarity)

    def _look_alike(self, text: str, index: int) -> bool:
        """Whether a row that shares words with an eval item whose question is content is a look-alike of it: the
        shared words of a short state and question (a generic state, a question template) are not a copy when
        another number, name or negation makes it another question. Items of states alone keep the word checks
        as they were."""
        return self.keep_slot_changes and bool(self._content[index]) and different_slots(text, self.texts[index])

    def _match_ngrams(self, texts: Sequence[str], tokenised: Words, found: list[Contamination | None]) -> None:
        todo = [i for i in range(len(texts)) if found[i] is None]
        if not todo:
            return
        parts = tokenised.split()
        grams = shingle(Words.join([parts[i] for i in todo]), self.overlap_words, short="skip")
        for row, slot, owner in _shared(grams, self._grams, self._gram_owner):
            if self._look_alike(texts[todo[row]], owner):
                continue
            start = slot - int(grams.offsets[row])
            shared = tokens(texts[todo[row]])[start : start + self.overlap_words]
            found[todo[row]] = self._hit("ngram", owner, shared=" ".join(shared))

    def _match_contained(self, texts: Sequence[str], tokenised: Words, found: list[Contamination | None]) -> None:
        """Texts shorter than the n-gram: a short eval item whole inside a row, or a short row inside an item.

        For each length m (whole_min_words ≤ m < overlap_words) the whole-text hashes of the m-word texts of one
        side are looked up among the m-grams of the other side (hashes of the same polynomial).
        """
        parts = tokenised.split()
        item_parts = self._words.split()
        item_lengths = np.diff(self._words.offsets)
        for m in range(self.whole_min_words, self.overlap_words):
            todo = [i for i in range(len(texts)) if found[i] is None]
            if not todo:
                return
            short_items = np.flatnonzero(item_lengths == m)
            if len(short_items):  # an m-word eval item among the rows' m-grams
                wholes, owner = _owned(shingle(Words.join([item_parts[k] for k in short_items]), m, short="skip"))
                grams = shingle(Words.join([parts[i] for i in todo]), m, short="skip")
                for row, slot, k in _shared(grams, wholes, owner):
                    if self._look_alike(texts[todo[row]], int(short_items[k])):
                        continue
                    start = slot - int(grams.offsets[row])
                    shared = tokens(texts[todo[row]])[start : start + m]
                    found[todo[row]] = self._hit("contained", int(short_items[k]), shared=" ".join(shared))
            short_rows = [i for i in todo if found[i] is None and len(parts[i]) == m]
            if short_rows:  # an m-word row among the eval items' m-grams
                item_grams, item_owner = _owned(shingle(self._words, m, short="skip"))
                wholes_of_rows = shingle(Words.join([parts[i] for i in short_rows]), m, short="skip")
                for row, _slot, k in _shared(wholes_of_rows, item_grams, item_owner):
                    if self._look_alike(texts[short_rows[row]], k):
                        continue
                    found[short_rows[row]] = self._hit("contained", k, shared=" ".join(tokens(texts[short_rows[row]])))

    def phrase_rows(self, tokenised: Words) -> np.ndarray:
        """(E,) in how many of these texts each eval item of PHRASE_MIN_WORDS to whole_min_words - 1 words is found
        whole. The rare-phrase check counts over all rows, so an engine that matches the rows a partition at a
        time adds these up over its partitions and passes the sum to :meth:`match` (``phrase_rows``)."""
        counts = np.zeros(len(self.items), dtype=np.int64)
        for _m, short_items, _grams, pairs, _slots in self._phrase_hits(tokenised):
            np.add.at(counts, short_items[pairs[:, 0]], 1)
        return counts

    def _phrase_hits(self, tokenised: Words) -> Iterator[tuple[int, np.ndarray, Shingles, np.ndarray, np.ndarray]]:
        """Per phrase length: (m, the m-word eval items, the texts' m-grams, distinct (item among them, text) pairs
        of an item found whole in a text, the flat m-gram slot of each pair's first occurrence)."""
        item_parts = self._words.split()
        item_lengths = np.diff(self._words.offsets)
        for m in range(PHRASE_MIN_WORDS, self.whole_min_words):
            short_items = np.flatnonzero(item_lengths == m)
            if not len(short_items):
                continue
            wholes, owner = _owned(shingle(Words.join([item_parts[k] for k in short_items]), m, short="skip"))
            grams = shingle(tokenised, m, short="skip")
            slots = np.flatnonzero(np.isin(grams.hashes, wholes))
            if not len(slots):
                continue
            rows = np.searchsorted(grams.offsets, slots, side="right") - 1
            items = owner[np.searchsorted(wholes, grams.hashes[slots])]
            pairs, first = np.unique(np.stack([items, rows], axis=1), axis=0, return_index=True)
            yield m, short_items, grams, pairs, slots[first]

    def _match_rare_phrases(
        self,
        texts: Sequence[str],
        tokenised: Words,
        found: list[Contamination | None],
        phrase_rows: np.ndarray | None = None,
    ) -> None:
        """An eval item of PHRASE_MIN_WORDS to whole_min_words - 1 words found whole inside a row, unless the
        phrase is common: inside more than COMMON_ROWS rows (of these texts, or ``phrase_rows`` when given), it is
        a turn of phrase ("thank you so much for your help"), not a copied item."""
        for m, short_items, grams, pairs, slots in self._phrase_hits(tokenised):
            if phrase_rows is None:
                per_item = np.bincount(pairs[:, 0], minlength=len(short_items))
            else:
                per_item = phrase_rows[short_items]
            for (k, row), slot in zip(pairs.tolist(), slots.tolist(), strict=True):
                if (
                    found[row] is None
                    and per_item[k] <= COMMON_ROWS
                    and not self._look_alike(texts[row], short_items[k])
                ):
                    start = slot - int(grams.offsets[row])
                    shared = tokens(texts[row])[start : start + m]
                    found[row] = self._hit("contained", int(short_items[k]), shared=" ".join(shared))

    def _match_short_edits(
        self, texts: Sequence[str], tokenised: Words | None, found: list[Contamination | None]
    ) -> None:
        """Short eval items that the Jaccard and n-gram checks cannot see: a row that is a short item with one
        word inserted, one word left out, one word misspelt, or a few words (a greeting, a sign-off) around it.
        A look-alike with another slot value (:func:`different_slots`) stays."""
        longest = max(map(len, self._whole)) + AFFIX_WORDS
        if tokenised is not None:
            lengths = np.diff(tokenised.offsets)
            todo = [i for i in np.flatnonzero(lengths <= longest).tolist() if found[i] is None]
        else:
            todo = [i for i in range(len(texts)) if found[i] is None]
        for i in todo:
            row = tuple(tokens(texts[i]))
            if EDIT_MIN_WORDS <= len(row) <= longest:
                hit = self._short_edit(texts[i], row)
                if hit is not None:
                    found[i] = hit

    def _short_edit(self, text: str, row: tuple[str, ...]) -> Contamination | None:
        n = len(row)
        candidates: list[tuple[int, str]] = []  # (eval item, what changed)
        for m in range(n, max(EDIT_MIN_WORDS, n - AFFIX_WORDS) - 1, -1):  # the item whole, a few words around
            for start in range(n - m + 1):
                index = self._whole.get(row[start : start + m])
                if index is not None:
                    candidates.append((index, "words around it" if m < n else "same words"))
        for index, _p in self._left_out.get(row, []):  # a word left out
            candidates.append((index, "one word left out"))
        for p, width in _gaps(n):
            shorter = row[:p] + row[p + width :]
            index = self._whole.get(shorter)
            if index is not None:  # a word inserted
                candidates.append((index, "one word inserted"))
            if width == 1:
                for index, q in self._left_out.get(shorter, []):  # a word misspelt
                    if q == p and misspelt(row[p], self._short_words[index][p]):
                        candidates.append((index, "one word misspelt"))
        for index, edit in candidates:
            if not (self.keep_slot_changes and different_slots(text, self.texts[index])):
                return self._hit("edit", index, shared=edit)
        return None


def _gaps(n: int) -> list[tuple[int, int]]:
    """(position, width) of every run of one or two words a text of ``n`` words can lose: one written word can
    be two tokens ("Tsai's", "item[42]")."""
    return [(p, width) for width in (1, 2) for p in range(n - width + 1) if n - width >= EDIT_MIN_WORDS]


def _owned(grams: Shingles) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct shingle hashes, the first text holding each)."""
    owner = np.repeat(np.arange(len(grams)), np.diff(grams.offsets))  # (S,)
    distinct, first = np.unique(grams.hashes, return_index=True)
    return distinct, owner[first]


def _shared(grams: Shingles, index: np.ndarray, owner: np.ndarray) -> list[tuple[int, int, int]]:
    """(text, flat slot of its first shingle found in the sorted ``index``, the owner of that shingle) per text
    that shares one."""
    slots = np.flatnonzero(np.isin(grams.hashes, index))
    if not len(slots):
        return []
    text_of_slot = np.searchsorted(grams.offsets, slots, side="right") - 1
    rows, first = np.unique(text_of_slot, return_index=True)
    firsts = slots[first]
    owners = owner[np.searchsorted(index, grams.hashes[firsts])]
    return list(zip(rows.tolist(), firsts.tolist(), owners.tolist(), strict=True))
