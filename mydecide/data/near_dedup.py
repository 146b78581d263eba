"""Near duplicates: MinHash signatures of shingle sets, datasketch ``MinHashLSH`` candidates, verification.

Near duplicates are records whose decision content (:class:`Decisions`) has shingle sets
(:mod:`mydecide.data.shingles`) with a Jaccard similarity ≥ the threshold. A question asked of many records is an
instruction: those records are compared by their states, among records asking the same question up to case and
punctuation. A question asked of at most ``CONTENT_ROWS`` records is part of their content (yes/no trivia, claims
to verify, a short state and a question per record): those records are compared by state and question together,
and a pair must also ask nearly the same question about nearly the same state. Candidates come from a datasketch
``MinHashLSH`` index, are pre-filtered on their signatures and verified on their exact shingle sets; short
look-alikes that differ in a number, a named entity or a negation, in the state or in the question, are kept
(:func:`mydecide.data.lookalikes.different_slots`). Of each duplicate cluster the first row is kept, and every
removal records which kept row it matched and their similarity.

Speed: the MinHash permutations (datasketch's ``affine32`` scheme, the same ``a`` and ``b``) are applied to
blocks of shingles as one (P, block) array, so the signatures equal those of ``datasketch.MinHash.update_batch``
fed the same 32-bit shingle hashes, at a fraction of the per-record cost.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from mydecide.data.lookalikes import QUESTION_SLOT_WORDS, different_slots, small_edit
from mydecide.data.shingles import POLY, Shingles, Shingling, Words, jaccard, shingle_text

if TYPE_CHECKING:
    from datasketch import MinHash, MinHashLSH

MAX_HASH32 = np.uint32(0xFFFFFFFF)

Progress = Callable[[int], None]  # called with the number of items just finished


# ------------------------------------------------------------------------------------------------- signatures


def fold32(hashes: np.ndarray) -> np.ndarray:
    """64-bit shingle hashes → the 32-bit values MinHash permutes (high half xor low half)."""
    return ((hashes >> np.uint64(32)) ^ hashes).astype(np.uint32)


def fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finalizer (datasketch's affine32 pre-mix); uint32 arithmetic wraps mod 2^32."""
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def permutations(num_perm: int, seed: int) -> np.ndarray:
    """(2, P) uint32 ``a`` and ``b`` of datasketch's affine32 MinHash with this ``num_perm`` and ``seed``."""
    from datasketch import MinHash

    return MinHash(num_perm=num_perm, seed=seed, scheme="affine32").permutations


def signatures(
    shingles: Shingles, *, num_perm: int = 128, seed: int = 1, block: int = 8192, progress: Progress | None = None
) -> np.ndarray:
    """(N, P) uint32 MinHash signatures; a text without shingles keeps the empty signature (all 2^32 − 1).

    Shingles are permuted ``block`` at a time as one (P, block) array (a few MB, so it stays in cache; each
    permutation a contiguous row, so the per-text minimum runs along memory) and reduced per text with
    ``np.minimum.reduceat``; a text larger than a block is reduced over several blocks.
    """
    a, b = permutations(num_perm, seed)
    a, b = a[:, None], b[:, None]  # (P, 1)
    h = fmix32(fold32(shingles.hashes))  # (S,)
    offsets = shingles.offsets
    n = len(shingles)
    sig = np.full((n, num_perm), MAX_HASH32, dtype=np.uint32)
    i = 0
    while i < n:
        # texts i..j-1 hold at most `block` shingles together (at least one text per step)
        j = max(int(np.searchsorted(offsets, offsets[i] + block, side="right")) - 1, i + 1)
        lo, hi = int(offsets[i]), int(offsets[j])
        if j == i + 1:
            for start in range(lo, hi, block):
                phv = h[None, start : min(hi, start + block)] * a  # (P, s)
                phv += b
                np.minimum(sig[i], phv.min(axis=1), out=sig[i])
        elif hi > lo:
            phv = h[None, lo:hi] * a  # (P, s): the P permutations of every shingle in the block
            phv += b
            nonempty = np.flatnonzero(offsets[i + 1 : j + 1] > offsets[i:j]) + i
            sig[nonempty] = np.minimum.reduceat(phv, offsets[nonempty] - lo, axis=1).T
        if progress is not None:
            progress(j - i)
        i = j
    return sig


def estimated_jaccard(signature: np.ndarray, others: np.ndarray) -> np.ndarray:
    """(M,) fraction of equal MinHash values between one (P,) signature and (M, P) others."""
    return (others == signature).mean(axis=1)


def minhashes(sigs: np.ndarray, seed: int) -> list[MinHash]:
    """datasketch ``MinHash`` objects for (N, P) signatures (sharing one permutation array)."""
    from datasketch import MinHash

    perms = permutations(sigs.shape[1], seed)
    return [MinHash(seed=seed, hashvalues=row, permutations=perms, scheme="affine32") for row in sigs]


def sketch(
    texts: Sequence[str] | Words, *, num_perm: int = 128, ngram: int = 5, seed: int = 1, unit: str = "char"
) -> list[MinHash]:
    """MinHash sketches of the ``ngram`` shingles (``unit``: characters or words) of each text (the fast path)."""
    shingles = Shingling(unit, ngram).hashes(texts)
    return minhashes(signatures(shingles, num_perm=num_perm, seed=seed), seed)


def lsh_bands(threshold: float, num_perm: int, recall: float = 0.95) -> tuple[int, int]:
    """(bands b, rows per band r) so that a pair at exactly ``threshold`` becomes a candidate with
    probability 1 − (1 − t^r)^b ≥ ``recall``, using the largest r that does (fewest false candidates).

    datasketch's own optimiser balances false positives against false negatives, which leaves a pair at the
    threshold a candidate only about 40% of the time; here every candidate is verified on its signature, so a
    false candidate costs one comparison while a missed one costs recall. (A pair at exactly the threshold is
    also verified above it only half of the time; pairs 0.05 above it are candidates with p > 0.99.)
    """
    best = (num_perm, 1)
    for r in range(1, num_perm + 1):
        b = num_perm // r
        if b < 2:
            break
        if 1.0 - (1.0 - threshold**r) ** b >= recall:
            best = (b, r)
    return best


def lsh_index(sketches: Sequence[MinHash], *, threshold: float, keys: Sequence[Any] | None = None) -> MinHashLSH:
    """A ``MinHashLSH`` over the sketches, filled through an insertion session (keys: row indices)."""
    from datasketch import MinHashLSH

    num_perm = len(sketches[0]) if sketches else 128
    lsh = MinHashLSH(num_perm=num_perm, params=lsh_bands(threshold, num_perm))
    with lsh.insertion_session(buffer_size=len(sketches) + 1) as session:
        for index, one in enumerate(sketches):
            session.insert(index if keys is None else keys[index], one, check_duplication=False)
    return lsh


def band_keys(sigs: np.ndarray, threshold: float) -> np.ndarray:
    """(N, b) uint64: a hash of each LSH band of each (N, P) signature, for the bands ``lsh_index`` uses at this
    threshold (two signatures share a bucket of band k exactly when their keys in column k are equal)."""
    bands, rows = lsh_bands(threshold, sigs.shape[1])
    s = sigs[:, : bands * rows].astype(np.uint64).reshape(len(sigs), bands, rows)
    keys = s[:, :, 0].copy()
    for j in range(1, rows):
        keys *= POLY
        keys += s[:, :, j]
    return keys


def sharing_a_band(keys: np.ndarray, others: np.ndarray | None = None) -> np.ndarray:
    """(N,) bool: which rows share some band key with another row (or, given ``others``, with a row of those).

    A row that shares no band has no LSH candidate and is nobody's candidate, so the Python-speed LSH is only
    filled and asked for the rows this marks (in most data a small share), with the same candidates as before.
    """
    shared = np.zeros(len(keys), dtype=bool)
    for band in range(keys.shape[1]):
        column = keys[:, band]
        if others is not None:
            shared |= np.isin(column, others[:, band])
        else:
            _, inverse, counts = np.unique(column, return_inverse=True, return_counts=True)
            shared |= counts[inverse] > 1
    return shared


def candidate_threshold(threshold: float) -> float:
    """The similarity the LSH bands are set for when candidates are verified on exact shingle sets: a pair at
    the threshold is then a candidate with p > 0.99 (the bands' 0.95 holds 0.05 below it)."""
    return max(0.05, threshold - 0.05)


def signature_matrix(sketches: Sequence[MinHash]) -> np.ndarray:
    """(N, P) hash values of the sketches."""
    return np.vstack([one.hashvalues for one in sketches]) if sketches else np.empty((0, 0), dtype=np.uint32)


# ------------------------------------------------------------------------------------------- decision content

CONTENT_ROWS = 3  # a question asked of at most this many records (of its type) is part of their content


@dataclass(frozen=True)
class Decisions:
    """What near dedup and decontamination compare of each record: ``texts[i]``, its state alone, or its state
    and its question when the question is part of the content (``content[i]``), and the ``groups`` compared
    within.

    A question (type and instructions, the instructions as their shingle text: case and punctuation dropped)
    asked of more than ``CONTENT_ROWS`` records is an instruction: its records are compared by state, within the
    group of that question, as before questions were compared. One asked of at most ``CONTENT_ROWS`` records
    carries content (a copy of a trivia record has its original's question, or nearly): the records of such
    questions form one group per question type and are compared by state and question together.
    """

    texts: list[str]  # what is shingled: the state, or state + "\n" + question
    states: list[str]
    questions: list[str]  # the instructions
    content: np.ndarray  # (N,) bool: the question is part of the content
    groups: np.ndarray  # (N,) int64: rows are compared within a group only

    def __len__(self) -> int:
        return len(self.texts)

    @classmethod
    def of(cls, states: Sequence[str], questions: Sequence[tuple[str, str]], *, limit: int = CONTENT_ROWS) -> Decisions:
        """From each record's state text and (question type, instructions); ``limit``: ``CONTENT_ROWS``."""
        if len(states) != len(questions):
            raise ValueError(f"{len(states)} states for {len(questions)} questions")
        forms: dict[str, str] = {}
        keys = [(kind, forms.get(text) or forms.setdefault(text, shingle_text(text))) for kind, text in questions]
        asked = Counter(keys)
        content = np.fromiter(
            (bool(form) and asked[kind, form] <= limit for kind, form in keys), dtype=bool, count=len(keys)
        )
        ids: dict[tuple[str, ...], int] = {}
        groups = np.fromiter(
            (
                ids.setdefault(("content", kind) if c else ("question", kind, form), len(ids))
                for (kind, form), c in zip(keys, content.tolist(), strict=True)
            ),
            dtype=np.int64,
            count=len(keys),
        )
        instructions = [text for _kind, text in questions]
        texts = [
            f"{state}\n{question}" if c else state
            for state, question, c in zip(states, instructions, content.tolist(), strict=True)
        ]
        return cls(texts, list(states), instructions, content, groups)

    def take(self, rows: Sequence[int] | np.ndarray) -> Decisions:
        """These rows only, in this order."""
        picked = np.asarray(rows, dtype=np.int64)
        return Decisions(
            [self.texts[k] for k in picked.tolist()],
            [self.states[k] for k in picked.tolist()],
            [self.questions[k] for k in picked.tolist()],
            self.content[picked],
            self.groups[picked],
        )


# ------------------------------------------------------------------------------------------------ near dedup


@dataclass(frozen=True)
class NearMatch:
    kept: int  # index of the kept row this one duplicates
    similarity: float  # Jaccard of their shingle sets (exact when verified on the texts, else the MinHash estimate)


# records whose question is content: their states share at least this much of their shingles (or are a small edit)
STATE_SHARE = 0.5

# an estimate this close to the threshold is checked on the exact shingle sets (2.5σ of the estimate at P=128)
SIGNATURE_MARGIN = 0.1


def near_duplicates(
    texts: Sequence[str],
    *,
    threshold: float = 0.7,
    num_perm: int = 128,
    ngram: int = 5,
    unit: str = "char",
    seed: int = 1,
    groups: Sequence[str] | None = None,
    progress: Progress | None = None,
    keep_slot_changes: bool = True,
    decisions: Decisions | None = None,
) -> dict[int, NearMatch]:
    """``{removed index: NearMatch}`` for texts that nearly repeat an earlier *kept* text of the same group.

    Rows are visited in order; a row is removed when some earlier kept row of its group (``groups[i]``, e.g.
    the question key) has a shingle Jaccard ≥ ``threshold`` and is not a look-alike with another slot value
    (:func:`different_slots`); it records the most similar such row. Matching only kept rows keeps one
    representative per cluster and never chains a removal through another removal. With ``decisions``, the
    texts and groups are theirs (``texts`` and ``groups`` are ignored) and a pair of records whose question is
    content must also ask nearly the same question about nearly the same state (:meth:`Verifier.distinct`).
    """
    if decisions is not None:
        texts, groups = decisions.texts, decisions.groups.tolist()
    sketches = sketch(texts, num_perm=num_perm, ngram=ngram, seed=seed, unit=unit)
    return near_duplicates_of(
        sketches,
        threshold=threshold,
        groups=groups,
        progress=progress,
        texts=texts,
        shingling=Shingling(unit, ngram),
        keep_slot_changes=keep_slot_changes,
        decisions=decisions,
    )


def near_duplicates_of(
    sketches: Sequence[MinHash],
    *,
    threshold: float,
    groups: Sequence[str] | None = None,
    progress: Progress | None = None,
    texts: Sequence[str] | None = None,
    shingling: Shingling | None = None,
    keep_slot_changes: bool = True,
    decisions: Decisions | None = None,
) -> dict[int, NearMatch]:
    """:func:`near_duplicates` on ready sketches (a pipeline computes them once for several steps).

    With ``texts`` (and the ``shingling`` the sketches were made with), candidates whose MinHash estimate is
    within ``SIGNATURE_MARGIN`` of the threshold are verified on their exact shingle sets and checked for a
    changed slot; without, the estimate alone decides (as datasketch's LSH would). With ``decisions`` (the
    sketches then being of ``decisions.texts``), its texts and groups are used.
    """
    if decisions is not None:
        texts, groups = decisions.texts, decisions.groups.tolist()
    if groups is not None and len(groups) != len(sketches):
        raise ValueError(f"groups has {len(groups)} entries for {len(sketches)} texts")
    if texts is not None and len(texts) != len(sketches):
        raise ValueError(f"texts has {len(texts)} entries for {len(sketches)} sketches")
    verify = (
        Verifier(texts, shingling or Shingling(), threshold, keep_slot_changes=keep_slot_changes, decisions=decisions)
        if texts is not None
        else None
    )
    lsh_threshold = candidate_threshold(threshold) if verify else threshold
    sigs = signature_matrix(sketches)
    linked = sharing_a_band(band_keys(sigs, lsh_threshold)) if len(sketches) else np.zeros(0, dtype=bool)
    rows = np.flatnonzero(linked).tolist()
    lsh = lsh_index([sketches[i] for i in rows], threshold=lsh_threshold, keys=rows)
    removed: dict[int, NearMatch] = {}
    for i, one in enumerate(sketches):
        if not linked[i]:
            candidates = []
        else:
            candidates = [
                j for j in lsh.query(one) if j < i and j not in removed and (groups is None or groups[j] == groups[i])
            ]
        if candidates:
            candidates.sort()
            similarity = estimated_jaccard(sigs[i], sigs[candidates])
            if verify is None:
                best = int(np.argmax(similarity))  # first of the most similar (candidates are sorted)
                if similarity[best] >= threshold:
                    removed[i] = NearMatch(candidates[best], float(similarity[best]))
            else:
                match = verify.best(i, candidates, similarity)
                if match is not None:
                    removed[i] = match
        if progress is not None and i % 1000 == 999:
            progress(1000)
    if progress is not None:
        progress(len(sketches) % 1000)
    return removed


class Verifier:
    """Checks candidate pairs on their exact shingle sets (cached per text) and for a changed slot; with
    ``decisions`` (near dedup: ``texts`` are theirs), pairs whose question is content for another question or
    state (:meth:`distinct`)."""

    def __init__(
        self,
        texts: Sequence[str],
        shingling: Shingling,
        threshold: float,
        *,
        others: Sequence[str] | None = None,
        keep_slot_changes: bool = True,
        decisions: Decisions | None = None,
    ):
        self.texts = texts
        self.keep_slot_changes = keep_slot_changes
        self.decisions = decisions
        self.others = texts if others is None else others  # what candidates index into (eval items, or texts)
        self.shingling = shingling
        self.threshold = threshold
        self._sets: dict[tuple[bool, int], set[Any]] = {}

    def _set(self, index: int, other: bool) -> set[Any]:
        key = (other and self.others is not self.texts, index)
        found = self._sets.get(key)
        if found is None:
            if len(self._sets) > 20_000:  # bounded: rows are visited in order, old ones are rarely asked again
                self._sets.clear()
            found = self._sets[key] = self.shingling.set((self.others if other else self.texts)[index])
        return found

    def best(self, i: int, candidates: Sequence[int], estimates: np.ndarray) -> NearMatch | None:
        """The most similar candidate at or above the threshold that is not a look-alike (first on ties).

        An estimate within ``SIGNATURE_MARGIN`` of the threshold is replaced by the exact Jaccard of the two
        shingle sets; one further away decides alone (its error is below 1% at 128 permutations).
        """
        best: NearMatch | None = None
        for k in np.flatnonzero(estimates >= self.threshold - SIGNATURE_MARGIN).tolist():
            j = candidates[k]  # candidates are sorted: the first of the most similar wins
            similarity = float(estimates[k])
            if similarity < self.threshold + SIGNATURE_MARGIN:
                similarity = jaccard(self._set(i, False), self._set(j, True))
            better = best is None or similarity > best.similarity
            if similarity >= self.threshold and better and not self.distinct(i, j):
                best = NearMatch(j, similarity)
                if similarity == 1.0:
                    break
        return best

    def distinct(self, i: int, j: int) -> bool:
        """Whether a pair at or above the threshold is still two decisions: a look-alike with another slot value
        (:func:`different_slots`) or, for records whose question is content, another question or another state.

        Such a pair asks nearly the same question when the questions have the same words (case and punctuation
        aside), share ``threshold`` of their shingles (a long question) or are a small edit of one another that
        inserts, leaves out or misspells words or adds a phrase, but replaces none (:func:`small_edit`: "Is it
        red?" / "Is it blue?" are two questions). Their states must share ``STATE_SHARE`` of their shingles or be
        a small edit of one another (replacements allowed), so a long question cannot carry two different short
        states. Slots are checked in the state and in the question (questions up to
        ``QUESTION_SLOT_WORDS`` words: "Is it above 5?" / "Is it above 50?", a name, a negation).
        """
        d = self.decisions
        if d is None or not d.content[i]:
            return self.keep_slot_changes and different_slots(self.texts[i], self.others[j])
        (state_a, state_b), (question_a, question_b) = (d.states[i], d.states[j]), (d.questions[i], d.questions[j])
        if not self._near(question_a, question_b, self.threshold, replaced=False):
            return True
        if not self._near(state_a, state_b, STATE_SHARE, replaced=True):
            return True
        return self.keep_slot_changes and (
            different_slots(state_a, state_b) or different_slots(question_a, question_b, QUESTION_SLOT_WORDS)
        )

    def _near(self, a: str, b: str, share: float, *, replaced: bool) -> bool:
        if shingle_text(a) == shingle_text(b):
            return True
        return jaccard(self.shingling.set(a), self.shingling.set(b)) >= share or small_edit(a, b, replaced=replaced)
