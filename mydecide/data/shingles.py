"""Shingles of texts, vectorised: case-folded words (CJK: single characters), their hashes, and the word or
character n-grams near dedup and decontamination compare.

The default shingles are the character 5-grams of the normalised text (case-folded words, punctuation and quotes
dropped, single spaces): one changed word in a 12-word text removes 5 of its 8 word 5-grams but only about a
fifth of its character 5-grams, so character shingles keep short texts comparable (docs/dedup.md says why;
docs/LOG.md#dedup-character-5-grams-and-short-edits has the benchmark behind the choice). Shingles are hashed for
the whole corpus at once with numpy (characters as UTF-32 code points, words hashed once per distinct word; n-grams
combined as a polynomial).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

# CJK ideographs, kana and hangul syllables are words of one character (these scripts write no spaces);
# everything else is a run of letters and digits.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
TOKEN = re.compile(rf"[{_CJK}]|[^\W_{_CJK}]+")
_MASK64 = (1 << 64) - 1
POLY = np.uint64(0x9E3779B97F4A7C15)  # odd multiplier of the n-gram polynomial hash
CHAR_MIX = np.uint64(0xBF58476D1CE4E5B9)  # odd multiplier spreading code points (splitmix64's)


def normalise(text: str) -> str:
    """Case-folded, whitespace-collapsed text (the form exact matching compares)."""
    return " ".join(text.casefold().split())


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
        pseudo = [
            int.from_bytes(hashlib.blake2b(normalise(texts[i]).encode("utf-8"), digest_size=8).digest(), "little")
            for i in empty.tolist()
        ]
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
        return self.hashes[self.offsets[index] : self.offsets[index + 1]]


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
    tokenised = texts if isinstance(texts, Words) else words(texts)
    return _ngrams(tokenised.hashes, tokenised.offsets, n, short)


def shingle_text(text: str) -> str:
    """The form character shingles are cut from: case-folded words (CJK: characters) joined by single spaces.

    Punctuation, quotes and symbols are dropped, so edits of case, punctuation, whitespace or quotes leave the
    form unchanged; a text without any word keeps its normalised characters.
    """
    return " ".join(tokens(text)) or normalise(text)


def char_shingle(texts: Sequence[str], n: int) -> Shingles:
    """Hash the character n-grams of every text's :func:`shingle_text` in one pass (a shorter text: one shingle).

    Code points are read as one UTF-32 array, spread by a multiply-xorshift (so that neighbouring characters do
    not give neighbouring hashes) and combined with the same polynomial as word n-grams.
    """
    forms = [shingle_text(text) for text in texts]
    lengths = np.fromiter(map(len, forms), dtype=np.int64, count=len(forms))
    offsets = np.zeros(len(forms) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    codes = np.frombuffer("".join(forms).encode("utf-32-le"), dtype="<u4").astype(np.uint64)
    codes *= CHAR_MIX
    codes ^= codes >> np.uint64(29)
    return _ngrams(codes, offsets, n, "whole")


def _ngrams(values: np.ndarray, offsets: np.ndarray, n: int, short: str) -> Shingles:
    """Polynomial hashes of the n-grams of (T,) ``values`` within each text's ``offsets`` slice."""
    if n < 1:
        raise ValueError(f"n-gram length must be at least 1, got {n}")
    if short not in ("whole", "skip"):
        raise ValueError(f"short must be 'whole' or 'skip', got {short!r}")
    lengths = np.diff(offsets)  # (N,)
    total = len(values)
    long_text = lengths >= n
    starts = total - n + 1  # flat positions an n-gram can start at
    if starts > 0:
        # acc[p] = hash of the n values starting at flat position p; kept when they all belong to one text,
        # i.e. unless p is one of the last n - 1 positions of its text
        acc = values[:starts].copy()
        for j in range(1, n):
            acc *= POLY
            acc += values[j : starts + j]
        crossing = (offsets[1:, None] - np.arange(1, n)[None, :]).ravel()  # (N * (n - 1),)
        own_start = np.repeat(offsets[:-1], n - 1)
        valid = np.ones(starts, dtype=bool)
        valid[crossing[(crossing >= own_start) & (crossing < starts)]] = False
        long_hashes = acc[valid]
    else:
        long_hashes = np.empty(0, dtype=np.uint64)

    counts = np.where(long_text, lengths - n + 1, 0 if short == "skip" else 1)
    shingle_offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(counts, out=shingle_offsets[1:])
    if long_text.all():
        return Shingles(long_hashes, shingle_offsets)
    hashes = np.empty(int(shingle_offsets[-1]), dtype=np.uint64)
    slot_long = np.repeat(long_text, counts)
    hashes[slot_long] = long_hashes
    if short == "whole":
        hashes[~slot_long] = np.asarray(
            [_polynomial(values[offsets[i] : offsets[i + 1]].tolist()) for i in np.flatnonzero(~long_text).tolist()],
            dtype=np.uint64,
        )
    return Shingles(hashes, shingle_offsets)


@dataclass(frozen=True)
class Shingling:
    """What a text's shingles are: ``unit`` ``"char"`` (n-grams of the characters of :func:`shingle_text`) or
    ``"word"`` (n-grams of :func:`tokens`); a text shorter than ``n`` is one shingle of all of it."""

    unit: str = "char"
    n: int = 5

    def __post_init__(self) -> None:
        if self.unit not in ("char", "word"):
            raise ValueError(f"shingle unit must be 'char' or 'word', got {self.unit!r}")
        if self.n < 1:
            raise ValueError(f"n-gram length must be at least 1, got {self.n}")

    def hashes(self, texts: Sequence[str] | Words) -> Shingles:
        """The hashed shingles of every text, vectorised (word shingles also take ready :class:`Words`)."""
        if self.unit == "word":
            return shingle(texts, self.n)
        if isinstance(texts, Words):
            raise TypeError("character shingles need the texts, not their word hashes")
        return char_shingle(texts, self.n)

    def set(self, text: str) -> set[Any]:
        """The exact shingle set of one text (what a candidate pair is verified on)."""
        units: Sequence[Any] = shingle_text(text) if self.unit == "char" else tokens(text)
        if self.unit == "word" and not units:
            units = [normalise(text)]
        n = min(self.n, len(units)) or 1
        if self.unit == "char":
            return {units[i : i + n] for i in range(max(1, len(units) - n + 1))}
        return {tuple(units[i : i + n]) for i in range(max(1, len(units) - n + 1))}

    def describe(self) -> dict[str, Any]:
        """How the manifest names this shingling."""
        text = (
            "case-folded words joined by single spaces, punctuation and quotes dropped"
            if self.unit == "char"
            else "case-folded words, punctuation dropped"
        )
        return {"unit": self.unit, "n": self.n, "of": text}


def jaccard(a: set[Any], b: set[Any]) -> float:
    """|a ∩ b| / |a ∪ b| (1.0 for two empty sets)."""
    union = len(a | b)
    return len(a & b) / union if union else 1.0
