"""Exact and near-duplicate detection: normalised keys, character (or word) n-gram shingles, MinHash + LSH.

Exact duplicates share the normalised key (case-folded, whitespace-collapsed state + question type +
instructions + options). Near duplicates ask the same question (same type and instructions) about states whose
shingle sets have a Jaccard similarity ≥ the threshold. The default shingles are the character 5-grams of the
normalised text (case-folded words, punctuation and quotes dropped, single spaces): one changed word in a
12-word text removes 5 of its 8 word 5-grams but only about a fifth of its character 5-grams, so character
shingles keep short texts comparable (docs/dedup.md has the benchmark behind the choice). Candidates come from a
datasketch ``MinHashLSH`` index, are pre-filtered on their signatures and verified on their exact shingle sets;
short look-alikes that differ in a number, a named entity or a negation ("set an alarm for 7 am" / "... 9 pm")
are kept (:func:`different_slots`). Of each duplicate cluster the first row is kept, and every removal records
which kept row it matched and their similarity.

Speed: shingles are hashed for the whole corpus at once with numpy (characters as UTF-32 code points, words
hashed once per distinct word; n-grams combined as a polynomial), and the MinHash permutations (datasketch's
``affine32`` scheme, the same ``a`` and ``b``) are applied to blocks of shingles as one (S, P) array, so the
signatures equal those of ``datasketch.MinHash.update_batch`` fed the same 32-bit shingle hashes, at a fraction
of the per-record cost.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
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
CHAR_MIX = np.uint64(0xBF58476D1CE4E5B9)  # odd multiplier spreading code points (splitmix64's)
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


# ------------------------------------------------------------------------------------------------ look-alikes

SLOT_WORDS = 24  # texts up to this many words are checked for a changed slot
NEGATIONS = frozenset(
    {"not", "no", "never", "none", "nothing", "nobody", "nowhere", "neither", "nor", "without", "cannot", "t"}
)  # "t": the tokens of "don't" are "don", "t"
SWITCHES = frozenset({"on", "off", "yes", "no", "open", "close", "closed", "up", "down"})  # count when swapped
TIME_WORDS = frozenset(
    {
        "am",
        "pm",
        "noon",
        "midnight",
        "today",
        "tonight",
        "tomorrow",
        "yesterday",
        "morning",
        "afternoon",
        "evening",
        "night",
        "week",
        "weekend",
        "month",
        "year",
        "hour",
        "hours",
        "minute",
        "minutes",
        "day",
        "days",
    }
)
_TYPO = 0.7  # two words at least this similar (difflib ratio) are one word misspelt, not two entities


def different_slots(a: str, b: str) -> bool:
    """Whether two short, similar texts differ in what a decision hangs on, so both must be kept.

    True when both have at most ``SLOT_WORDS`` words and, in the word-level diff of the two (case-folded), a
    replaced span holds on both sides a number ("for 7 am" / "for 9 am"), a time word ("7 am" / "7 pm",
    "tonight" / "tomorrow") or a named entity (a capitalised word that does not start a sentence, and not a
    misspelling of the other: "the capital of France" / "of Germany"), or a changed span adds or drops a number
    ("at 6 am" / "at 6:30 am"), or adds, drops or swaps a negation ("I like it" / "I don't like it"), or swaps
    one switch word for another ("turn the lights on" / "off"). Edits of case, punctuation, a typo, an added
    greeting or a changed common word are not slot changes: those copies stay duplicates.
    """
    if max(len(a.split()), len(b.split())) > 2 * SLOT_WORDS:  # cheap bound before reading words
        return False
    wa, wb = _surface_words(a), _surface_words(b)
    if not wa or not wb or max(len(wa), len(wb)) > SLOT_WORDS:
        return False
    fa, fb = [w.casefold() for w, _ in wa], [w.casefold() for w, _ in wb]
    if fa == fb:  # the same words: case, punctuation or spacing changed
        return False
    from difflib import SequenceMatcher

    for op, i1, i2, j1, j2 in SequenceMatcher(None, fa, fb, autojunk=False).get_opcodes():
        if op == "equal":
            continue
        if set(fa[i1:i2] + fb[j1:j2]) & NEGATIONS:
            return True
        if op != "replace":  # a number added or dropped ("for 2" / "for 2 or 3", "at 6 am" / "at 6:30 am")
            if any(map(_is_number, fa[i1:i2] + fb[j1:j2])):
                return True
            continue
        if any(map(_is_number, fa[i1:i2])) and any(map(_is_number, fb[j1:j2])):
            return True
        if set(fa[i1:i2]) & TIME_WORDS and set(fb[j1:j2]) & TIME_WORDS:
            return True
        if set(fa[i1:i2]) & SWITCHES and set(fb[j1:j2]) & SWITCHES:
            return True
        names_a = [w for w, (_, entity) in zip(fa[i1:i2], wa[i1:i2], strict=True) if entity]
        names_b = [w for w, (_, entity) in zip(fb[j1:j2], wb[j1:j2], strict=True) if entity]
        if names_a and names_b and all(SequenceMatcher(None, x, y).ratio() < _TYPO for x in names_a for y in names_b):
            return True
    return False


def _is_number(word: str) -> bool:
    return any(c.isdigit() for c in word)


_SENTENCE_END = re.compile(r"[.!?:;\n\"“(\[]\s*$")


@lru_cache(maxsize=1 << 16)  # a short text is compared with each of its candidates
def _surface_words(text: str) -> tuple[tuple[str, bool], ...]:
    """(word, is it entity-like: capitalised, not all capitals, not the first word of a sentence)."""
    out: list[tuple[str, bool]] = []
    for match in TOKEN.finditer(text):
        word, start = match.group(), match.start()
        starts_sentence = not out or bool(_SENTENCE_END.search(text[max(0, start - 3) : start]))
        out.append((word, word[0].isupper() and not word.isupper() and not starts_sentence))
    return tuple(out)


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


# ------------------------------------------------------------------------------------------------ near dedup


@dataclass(frozen=True)
class NearMatch:
    kept: int  # index of the kept row this one duplicates
    similarity: float  # Jaccard of their shingle sets (exact when verified on the texts, else the MinHash estimate)


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
) -> dict[int, NearMatch]:
    """``{removed index: NearMatch}`` for texts that nearly repeat an earlier *kept* text of the same group.

    Rows are visited in order; a row is removed when some earlier kept row of its group (``groups[i]``, e.g.
    the question key) has a shingle Jaccard ≥ ``threshold`` and is not a look-alike with another slot value
    (:func:`different_slots`); it records the most similar such row. Matching only kept rows keeps one
    representative per cluster and never chains a removal through another removal.
    """
    sketches = sketch(texts, num_perm=num_perm, ngram=ngram, seed=seed, unit=unit)
    return near_duplicates_of(
        sketches,
        threshold=threshold,
        groups=groups,
        progress=progress,
        texts=texts,
        shingling=Shingling(unit, ngram),
        keep_slot_changes=keep_slot_changes,
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
) -> dict[int, NearMatch]:
    """:func:`near_duplicates` on ready sketches (a pipeline computes them once for several steps).

    With ``texts`` (and the ``shingling`` the sketches were made with), candidates whose MinHash estimate is
    within ``SIGNATURE_MARGIN`` of the threshold are verified on their exact shingle sets and checked for a
    changed slot; without, the estimate alone decides (as datasketch's LSH would).
    """
    if groups is not None and len(groups) != len(sketches):
        raise ValueError(f"groups has {len(groups)} entries for {len(sketches)} texts")
    if texts is not None and len(texts) != len(sketches):
        raise ValueError(f"texts has {len(texts)} entries for {len(sketches)} sketches")
    verify = (
        Verifier(texts, shingling or Shingling(), threshold, keep_slot_changes=keep_slot_changes)
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
    """Checks candidate pairs on their exact shingle sets (cached per text) and for a changed slot."""

    def __init__(
        self,
        texts: Sequence[str],
        shingling: Shingling,
        threshold: float,
        *,
        others: Sequence[str] | None = None,
        keep_slot_changes: bool = True,
    ):
        self.texts = texts
        self.keep_slot_changes = keep_slot_changes
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
            if (
                similarity >= self.threshold
                and (best is None or similarity > best.similarity)
                and not (self.keep_slot_changes and different_slots(self.texts[i], self.others[j]))
            ):
                best = NearMatch(j, similarity)
                if similarity == 1.0:
                    break
        return best
