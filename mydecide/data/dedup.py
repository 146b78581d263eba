"""Exact and near-duplicate detection: normalised keys, word n-gram shingles, MinHash + LSH.

Exact duplicates share the normalised key (case-folded, whitespace-collapsed state + question type +
instructions + options). Near duplicates ask the same question (same type and instructions) about states whose
word n-gram shingle sets have an estimated Jaccard similarity ≥ the threshold; candidates come from a datasketch
``MinHashLSH`` index and are verified on the signatures. Of each duplicate cluster the first row is kept, and
every removal records which kept row it matched.

Speed: shingles are hashed for the whole corpus at once with numpy (each distinct word hashed once, n-grams
combined as a polynomial over the word hashes), and the MinHash permutations (datasketch's ``affine32`` scheme,
the same ``a`` and ``b``) are applied to blocks of shingles as one (S, P) array, so the signatures equal those of
``datasketch.MinHash.update_batch`` fed the same 32-bit shingle hashes, at a fraction of the per-record cost.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Any

import numpy as np

from mydecide.records import Question, Record

if TYPE_CHECKING:
    from datasketch import MinHash, MinHashLSH

# CJK ideographs, kana and hangul syllables are words of one character (these scripts write no spaces);
# everything else is a run of letters and digits.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
TOKEN = re.compile(rf"[{_CJK}]|[^\W_{_CJK}]+")
_MASK64 = (1 << 64) - 1
POLY = np.uint64(0x9E3779B97F4A7C15)  # odd multiplier of the n-gram polynomial hash
MAX_HASH32 = np.uint32(0xFFFFFFFF)

Progress = Callable[[int], None]  # called with the number of items just finished


# ------------------------------------------------------------------------------------------------ exact keys


def normalise(text: str) -> str:
    """Case-folded, whitespace-collapsed text (the form exact matching compares)."""
    return " ".join(text.casefold().split())


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


# -------------------------------------------------------------------------------------------------- shingles


def tokens(text: str) -> list[str]:
    """Case-folded words (CJK: single characters), punctuation dropped."""
    return TOKEN.findall(text.casefold())


def _flat(parts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate per-text arrays into (flat values, (N + 1,) offsets)."""
    lengths = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(parts) if len(parts) else np.empty(0, dtype=np.uint64)
    return flat.astype(np.uint64, copy=False), offsets


@dataclass(frozen=True)
class Words:
    """Word hashes of many texts: text i's words are ``hashes[offsets[i]:offsets[i + 1]]``.

    Every text has at least one word: a text without any (only punctuation or symbols) gets one pseudo-word,
    the hash of its normalised characters, so it still has a shingle and only matches the same characters.
    Tokenising is the slow part of shingling; a pipeline tokenises once and reuses the words (``split`` /
    ``join``) for near dedup and decontamination.
    """

    hashes: np.ndarray  # (T,) uint64
    offsets: np.ndarray  # (N + 1,) int64

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def split(self) -> list[np.ndarray]:
        """One (L_i,) array per text (views into ``hashes``)."""
        return np.split(self.hashes, self.offsets[1:-1]) if len(self) else []

    @classmethod
    def join(cls, parts: Sequence[np.ndarray]) -> Words:
        return cls(*_flat(parts))


def words(texts: Sequence[str]) -> Words:
    """Tokenise and hash every text; each distinct word is hashed once (blake2b: stable across runs)."""
    per_text = [TOKEN.findall(text.casefold()) for text in texts]
    flat = list(chain.from_iterable(per_text))
    vocabulary = dict.fromkeys(flat)
    index = dict(zip(vocabulary, range(len(vocabulary)), strict=True))
    ids = np.fromiter(map(index.__getitem__, flat), dtype=np.int64, count=len(flat))
    hashes = _word_hashes(list(vocabulary))[ids] if len(ids) else np.empty(0, dtype=np.uint64)
    lengths = np.fromiter(map(len, per_text), dtype=np.int64, count=len(texts))
    starts = np.cumsum(lengths) - lengths
    empty = np.flatnonzero(lengths == 0)
    if len(empty):
        pseudo = [int.from_bytes(hashlib.blake2b(normalise(texts[i]).encode("utf-8"), digest_size=8).digest(),
                                 "little") for i in empty.tolist()]
        hashes = np.insert(hashes, starts[empty], np.asarray(pseudo, dtype=np.uint64))
        lengths[empty] = 1
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return Words(hashes, offsets)


@dataclass(frozen=True)
class Shingles:
    """Hashed word n-grams of many texts: text i owns ``hashes[offsets[i]:offsets[i + 1]]``."""

    hashes: np.ndarray  # (S,) uint64
    offsets: np.ndarray  # (N + 1,) int64

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def of(self, index: int) -> np.ndarray:
        return self.hashes[self.offsets[index]:self.offsets[index + 1]]


def _word_hashes(vocabulary: Sequence[str]) -> np.ndarray:
    """(V,) uint64: a stable 64-bit hash per distinct word (blake2b, so runs and machines agree)."""
    digests = b"".join(hashlib.blake2b(w.encode("utf-8"), digest_size=8).digest() for w in vocabulary)
    return np.frombuffer(digests, dtype="<u8").astype(np.uint64)


def _polynomial(values: Iterable[int]) -> int:
    """The n-gram hash of a short text in plain Python (same formula as the vectorised path)."""
    acc = 0
    for value in values:
        acc = (acc * int(POLY) + value) & _MASK64
    return acc


def shingle(texts: Sequence[str] | Words, n: int, *, short: str = "whole") -> Shingles:
    """Hash the word n-grams of every text (or of already tokenised :class:`Words`) in one pass.

    ``short`` says what a text with fewer than ``n`` words contributes: ``"whole"`` one shingle made of all its
    words, ``"skip"`` none (n-gram overlap checks, where a short text has no n-gram to share).
    """
    if n < 1:
        raise ValueError(f"n-gram length must be at least 1, got {n}")
    if short not in ("whole", "skip"):
        raise ValueError(f"short must be 'whole' or 'skip', got {short!r}")
    tokenised = texts if isinstance(texts, Words) else words(texts)
    word_hash, offsets = tokenised.hashes, tokenised.offsets
    lengths = np.diff(offsets)  # (N,)
    total = len(word_hash)
    long_text = lengths >= n
    if total >= n:
        # acc[p] = hash of the n words starting at flat position p; kept when they all belong to one text
        acc = word_hash[: total - n + 1].copy()
        for j in range(1, n):
            acc = acc * POLY + word_hash[j: total - n + 1 + j]
        owner_end = np.repeat(offsets[1:], lengths)[: total - n + 1]
        long_hashes = acc[np.arange(total - n + 1) + n <= owner_end]
    else:
        long_hashes = np.empty(0, dtype=np.uint64)

    counts = np.where(long_text, lengths - n + 1, 0 if short == "skip" else 1)
    shingle_offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(counts, out=shingle_offsets[1:])
    hashes = np.empty(int(shingle_offsets[-1]), dtype=np.uint64)
    slot_long = np.repeat(long_text, counts)
    hashes[slot_long] = long_hashes
    if short == "whole" and not long_text.all():
        hashes[~slot_long] = np.asarray(
            [_polynomial(word_hash[offsets[i]:offsets[i + 1]].tolist()) for i in np.flatnonzero(~long_text).tolist()],
            dtype=np.uint64)
    return Shingles(hashes, shingle_offsets)


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


def signatures(shingles: Shingles, *, num_perm: int = 128, seed: int = 1, block: int = 8192,
               progress: Progress | None = None) -> np.ndarray:
    """(N, P) uint32 MinHash signatures; a text without shingles keeps the empty signature (all 2^32 − 1).

    Shingles are permuted ``block`` at a time as one (block, P) array (a few MB, so it stays in cache) and
    reduced per text with ``np.minimum.reduceat``; a text larger than a block is reduced over several blocks.
    """
    a, b = permutations(num_perm, seed)
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
                phv = h[start:min(hi, start + block), None] * a  # (s, P)
                phv += b
                np.minimum(sig[i], phv.min(axis=0), out=sig[i])
        elif hi > lo:
            phv = h[lo:hi, None] * a  # (s, P): the P permutations of every shingle in the block
            phv += b
            nonempty = np.flatnonzero(offsets[i + 1:j + 1] > offsets[i:j]) + i
            sig[nonempty] = np.minimum.reduceat(phv, offsets[nonempty] - lo, axis=0)
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


def sketch(texts: Sequence[str] | Words, *, num_perm: int = 128, ngram: int = 5, seed: int = 1) -> list[MinHash]:
    """MinHash sketches of the word ``ngram`` shingles of each text (the fast path, end to end)."""
    return minhashes(signatures(shingle(texts, ngram), num_perm=num_perm, seed=seed), seed)


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


def signature_matrix(sketches: Sequence[MinHash]) -> np.ndarray:
    """(N, P) hash values of the sketches."""
    return np.vstack([one.hashvalues for one in sketches]) if sketches else np.empty((0, 0), dtype=np.uint32)


# ------------------------------------------------------------------------------------------------ near dedup


@dataclass(frozen=True)
class NearMatch:
    kept: int  # index of the kept row this one duplicates
    similarity: float  # estimated Jaccard of their shingle sets


def near_duplicates(texts: Sequence[str] | Words, *, threshold: float = 0.8, num_perm: int = 128, ngram: int = 5,
                    seed: int = 1, groups: Sequence[str] | None = None,
                    progress: Progress | None = None) -> dict[int, NearMatch]:
    """``{removed index: NearMatch}`` for texts that nearly repeat an earlier *kept* text of the same group.

    Rows are visited in order; a row is removed when some earlier kept row of its group (``groups[i]``, e.g.
    the question key) has an estimated Jaccard ≥ ``threshold``; it records the most similar such row. Matching
    only kept rows keeps one representative per cluster and never chains a removal through another removal.
    """
    sketches = sketch(texts, num_perm=num_perm, ngram=ngram, seed=seed)
    return near_duplicates_of(sketches, threshold=threshold, groups=groups, progress=progress)


def near_duplicates_of(sketches: Sequence[MinHash], *, threshold: float, groups: Sequence[str] | None = None,
                       progress: Progress | None = None) -> dict[int, NearMatch]:
    """:func:`near_duplicates` on ready sketches (a pipeline computes them once for several steps)."""
    if groups is not None and len(groups) != len(sketches):
        raise ValueError(f"groups has {len(groups)} entries for {len(sketches)} texts")
    lsh = lsh_index(sketches, threshold=threshold)
    sigs = signature_matrix(sketches)
    removed: dict[int, NearMatch] = {}
    for i, one in enumerate(sketches):
        candidates = [j for j in lsh.query(one)
                      if j < i and j not in removed and (groups is None or groups[j] == groups[i])]
        if candidates:
            candidates.sort()
            similarity = estimated_jaccard(sigs[i], sigs[candidates])
            best = int(np.argmax(similarity))  # first of the most similar (candidates are sorted)
            if similarity[best] >= threshold:
                removed[i] = NearMatch(candidates[best], float(similarity[best]))
        if progress is not None and i % 1000 == 999:
            progress(1000)
    if progress is not None:
        progress(len(sketches) % 1000)
    return removed
