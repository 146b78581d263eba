"""What runs on the Ray workers for near dedup and decontamination (:mod:`mydecide.data.ray.near_steps`), each the
local rule called on one block or one shuffle partition:

- which questions are content (asked of at most ``CONTENT_ROWS`` rows) is a count by question over all rows
  (:func:`question_keys`, :class:`KeyCounts`); a block's decision texts and question groups then follow
  :meth:`Decisions.of <mydecide.data.near_dedup.Decisions.of>` (:func:`block_decisions`);
- near dedup: each block signs its decision texts and sends one key per LSH band to a reducer
  (:func:`sign_block`), which turns shared buckets into candidate pairs (:func:`band_pairs`); each pair goes to the
  verification group of its later row's block, each block sends each group the rows its pairs need
  (:func:`pick_rows`), and the group verifies them by the local :class:`~mydecide.data.near_dedup.Verifier`
  (:func:`verify_group`); each block then drops the rows the driver's keep rule removed (:func:`drop_near`);
- decontamination: the rare-phrase counts per block (:func:`count_phrase_rows`), then :meth:`EvalIndex.match
  <mydecide.data.decontaminate.EvalIndex.match>` per block, reusing near dedup's signatures where the decision
  text is unchanged (:func:`drop_contaminated`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from mydecide.config import NearDedupConfig
from mydecide.data.decontaminate import Contamination, EvalIndex
from mydecide.data.filtering import near_pairs
from mydecide.data.ledger import Row
from mydecide.data.near_dedup import (
    CONTENT_ROWS,
    Decisions,
    NearMatch,
    Verifier,
    band_keys,
    candidate_threshold,
    estimated_jaccard,
    lsh_bands,
    minhashes,
    signatures,
)
from mydecide.data.ray.tasks import Block, hash64, remove_rows
from mydecide.data.shingles import POLY, Shingling, Words, shingle_text, words
from mydecide.jsonl import json_line


def _question_forms(rows: list[Row]) -> tuple[list[tuple[Any, str]], np.ndarray]:
    """Each row's (question type, instructions) and the (n,) uint64 key of its type and shingle form (0 for a
    question with no form, which is never content)."""
    questions = [(row.record.question.type, row.record.question.instructions) for row in rows]
    forms: dict[tuple[str, str], int] = {}
    keys = np.zeros(len(rows), dtype=np.uint64)
    for k, (kind, text) in enumerate(questions):
        key = forms.get((kind, text))
        if key is None:
            form = shingle_text(text)
            key = forms[kind, text] = hash64(f"{kind}\x1f{form}") if form else 0
        keys[k] = key
    return questions, keys


def question_keys(block: Block, reducers: int) -> tuple[Any, ...]:
    _, keys = _question_forms(block[0])
    keys = keys[keys != 0]
    share = (keys % np.uint64(reducers)).astype(np.int64)
    out = tuple(keys[share == r] for r in range(reducers))
    return out if reducers != 1 else out[0]


class KeyCounts:
    """A Ray actor adding up one share of the question keys (by key) over the blocks sent to it."""

    def __init__(self) -> None:
        self.counts: Counter[int] = Counter()

    def add(self, *shares: np.ndarray) -> None:
        keys, counts = np.unique(np.concatenate([np.zeros(0, dtype=np.uint64), *shares]), return_counts=True)
        self.counts.update(dict(zip(keys.tolist(), counts.tolist(), strict=True)))

    def frequent(self) -> np.ndarray:
        """The keys that more than CONTENT_ROWS rows hold, sorted."""
        return np.array(sorted(k for k, n in self.counts.items() if n > CONTENT_ROWS), dtype=np.uint64)


def block_decisions(rows: list[Row], frequent: np.ndarray) -> Decisions:
    """:meth:`Decisions.of` for a block, with the question counts of all rows (``frequent``: the keys of the
    questions asked of more than CONTENT_ROWS rows); groups are hashes of the local group keys."""
    questions, keys = _question_forms(rows)
    content = (keys != 0) & ~np.isin(keys, frequent)
    ids: dict[tuple[str, ...], int] = {}
    groups = np.zeros(len(rows), dtype=np.uint64)
    for k, ((kind, text), c) in enumerate(zip(questions, content.tolist(), strict=True)):
        group = ("content", kind) if c else ("question", kind, shingle_text(text))
        found = ids.get(group)
        if found is None:
            found = ids[group] = hash64("\x1f".join(group))
        groups[k] = found
    states = [row.text for row in rows]
    instructions = [text for _kind, text in questions]
    texts = [
        f"{state}\n{question}" if c else state
        for state, question, c in zip(states, instructions, content.tolist(), strict=True)
    ]
    return Decisions(texts, states, instructions, content, groups.view(np.int64))


@dataclass
class Signed:
    seqs: np.ndarray  # (n,)
    sigs: np.ndarray  # (n, P) uint32
    decisions: Decisions


def sign_block(block: Block, frequent: np.ndarray, near: NearDedupConfig, reducers: int) -> tuple[Any, ...]:
    """The block's signatures, then one share per reducer of its (band key, seq) tuples."""
    rows, seqs = block
    found = block_decisions(rows, frequent)
    signed = _band_shares(found.texts, found.groups, near, reducers)
    shares = [(keys, seqs[members]) for keys, members in signed[1:]]
    return (Signed(seqs, signed[0], found), *shares)


def _band_shares(texts: list[str], groups: np.ndarray, near: NearDedupConfig, reducers: int) -> tuple[Any, ...]:
    """The texts' (B, P) signatures, then their (band key, row) tuples cut into one share per reducer by key.

    A row's key in band k is the band's hash mixed with k and the row's group (:class:`Decisions`)."""
    shingles = Shingling(near.shingle, near.ngram).hashes(texts)
    sigs = signatures(shingles, num_perm=near.num_perm, seed=near.seed)
    keys = band_keys(sigs, candidate_threshold(near.threshold))  # (B, b)
    bands = keys.shape[1]
    keys = keys * POLY + np.arange(1, bands + 1, dtype=np.uint64)[None, :]
    keys = (keys * POLY + groups.astype(np.uint64)[:, None]).ravel()  # row-major: row 0's b keys, row 1's ...
    members = np.repeat(np.arange(len(texts), dtype=np.int64), bands)
    share = (keys % np.uint64(reducers)).astype(np.int64)
    return (sigs, *((keys[share == r], members[share == r]) for r in range(reducers)))


def band_pairs(starts: np.ndarray, group_of: np.ndarray, *shares: tuple[np.ndarray, np.ndarray]) -> tuple[Any, ...]:
    """One reducer: the (row, earlier row) pairs that share one of its buckets, per verification group of the row's
    block (``group_of``: (blocks,) each block's group), then the rows each block must send, as seq * groups + group
    per block holding the seq."""
    blocks, groups = len(starts), int(group_of.max()) + 1
    keys = np.concatenate([np.zeros(0, dtype=np.uint64), *[k for k, _ in shares]])
    members = np.concatenate([np.zeros(0, dtype=np.int64), *[m for _, m in shares]])
    _, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    shared = counts[inverse] > 1
    keys, members = keys[shared], members[shared]
    order = np.lexsort((members, keys))  # buckets together, each in ascending rows
    keys, members = keys[order], members[order]
    first = np.r_[True, keys[1:] != keys[:-1]] if len(keys) else np.zeros(0, dtype=bool)
    start = np.maximum.accumulate(np.where(first, np.arange(len(keys)), 0))
    before = np.arange(len(keys)) - start  # earlier rows in the same bucket
    later = np.repeat(np.arange(len(keys)), before)
    k = np.arange(len(later)) - np.repeat(np.cumsum(before) - before, before)
    pairs = np.stack([members[later], members[start[later] + k]], axis=1).reshape(-1, 2)
    pairs = np.unique(pairs, axis=0) if len(pairs) else pairs
    group = group_of[np.searchsorted(starts, pairs[:, 0], side="right") - 1]
    by_group = [pairs[group == g] for g in range(groups)]
    # requests: each pair's two rows, to the group that verifies it (the later row's block's)
    wanted = np.unique(np.concatenate([pairs[:, 0], pairs[:, 1]]) * groups + np.concatenate([group, group]))
    held = np.searchsorted(starts, wanted // groups, side="right") - 1
    requests = [wanted[held == c] for c in range(blocks)]
    return (*by_group, *requests)


@dataclass
class Picked:
    seqs: np.ndarray
    sigs: np.ndarray
    decisions: Decisions
    rows: list[Row]


def pick_rows(block: Block, signed: Signed, groups: int, *requests: np.ndarray) -> tuple[Any, ...]:
    """The rows of this block that each of the ``groups`` verification groups asked for (``requests``: one share
    per reducer, of seq * groups + group codes), with their signatures."""
    rows, seqs = block
    wanted = np.unique(np.concatenate([np.zeros(0, dtype=np.int64), *requests]))
    out = []
    for g in range(groups):
        mine = wanted[wanted % groups == g] // groups
        at = np.searchsorted(seqs, mine)
        out.append(Picked(mine, signed.sigs[at], signed.decisions.take(at), [rows[k] for k in at.tolist()]))
    return tuple(out) if groups != 1 else out[0]  # type: ignore[return-value]


def _joined(picked: tuple[Picked, ...]) -> Picked:
    """The picked rows of all blocks as one table, ascending by seq (blocks hold ascending, disjoint seqs)."""
    parts = [p for p in picked if len(p.seqs)]
    if not parts:
        empty = Decisions([], [], [], np.zeros(0, dtype=bool), np.zeros(0, dtype=np.int64))
        return Picked(np.zeros(0, dtype=np.int64), np.zeros((0, 0), dtype=np.uint32), empty, [])
    d = [p.decisions for p in parts]
    decisions = Decisions(
        [t for x in d for t in x.texts],
        [s for x in d for s in x.states],
        [q for x in d for q in x.questions],
        np.concatenate([x.content for x in d]),
        np.concatenate([x.groups for x in d]),
    )
    return Picked(
        np.concatenate([p.seqs for p in parts]),
        np.vstack([p.sigs for p in parts]),
        decisions,
        [row for p in parts for row in p.rows],
    )


def verify_group(near: NearDedupConfig, reducers: int, *shares: Any) -> tuple[np.ndarray, tuple[np.ndarray, list[Row]]]:
    """One verification group: (m, 3) (row, earlier row, similarity) of its candidate pairs (``shares``: one
    share of pairs per reducer, then the picked rows of every block) that pass the local verification, and the
    rows of those pairs as (seqs, rows), which the group's blocks need for their reject and near_pairs lines."""
    pairs = np.concatenate([np.zeros((0, 2), dtype=np.int64), *shares[:reducers]])
    if not len(pairs):
        return np.zeros((0, 3)), (np.zeros(0, dtype=np.int64), [])
    pairs = np.unique(pairs, axis=0)
    table = _joined(shares[reducers:])
    at = np.searchsorted(table.seqs, pairs)
    pairs = pairs[table.decisions.groups[at[:, 0]] == table.decisions.groups[at[:, 1]]]
    found = np.asarray(_verify_pairs((table.seqs, table.sigs, table.decisions), pairs, near)).reshape(-1, 3)
    involved = np.unique(found[:, :2].astype(np.int64))
    return found, (involved, [table.rows[k] for k in np.searchsorted(table.seqs, involved).tolist()])


def _verify_pairs(shared: tuple[np.ndarray, np.ndarray, Decisions], pairs: np.ndarray, near: NearDedupConfig) -> Any:
    """(m, 3) (row, earlier row, similarity) of the pairs that share a band and pass the local verification."""
    linked, sigs, decisions = shared
    bands, width = lsh_bands(candidate_threshold(near.threshold), near.num_perm)
    shingling = Shingling(near.shingle, near.ngram)
    verify = Verifier(
        decisions.texts, shingling, near.threshold, keep_slot_changes=near.keep_slot_changes, decisions=decisions
    )
    out = []
    for a, b in np.searchsorted(linked, pairs).tolist():
        one, other = sigs[a], sigs[b]
        same_band = (one[: bands * width] == other[: bands * width]).reshape(bands, width).all(axis=1).any()
        if not same_band:
            continue
        match = verify.best(a, [b], estimated_jaccard(one, other[None, :]))
        if match is not None:
            out.append((float(linked[a]), float(linked[b]), match.similarity))
    return np.asarray(out, dtype=np.float64).reshape(-1, 3)


def drop_near(
    block: Block, removed: np.ndarray, per_range: int, ranges: int, involved: tuple[np.ndarray, list[Row]]
) -> tuple[Any, ...]:
    """The block without its near duplicates (``removed``: (m, 4) row, kept row, similarity, rank in
    near_pairs.jsonl; ``involved``: the (seqs, rows) of its group's verified pairs), their reject lines, the
    counts, then its near_pairs.jsonl lines per range of ranks."""
    by_seq = dict(zip(involved[0].tolist(), involved[1], strict=True))
    matches = {int(i): NearMatch(int(j), float(s)) for i, j, s, _ in removed.tolist()}
    removals: dict[int, tuple[str, dict[str, Any] | None]] = {
        i: ("near duplicate", {**by_seq[m.kept].ref(), "similarity": round(m.similarity, 4)})
        for i, m in matches.items()
    }
    kept, lines, report = remove_rows(block, "near_dedup", removals)
    rank = {int(i): int(r) for i, _, _, r in removed.tolist()}
    shares: list[list[tuple[int, bytes]]] = [[] for _ in range(ranges)]
    for i, pair in zip(
        sorted(matches, key=lambda i: (matches[i].similarity, i)), near_pairs(by_seq, matches), strict=True
    ):
        shares[rank[i] // per_range].append((rank[i], (json_line(pair) + "\n").encode("utf-8")))
    return (kept, lines, report, *shares)


def count_phrase_rows(index: EvalIndex, block: Block, frequent: np.ndarray) -> np.ndarray:
    return index.phrase_rows(words(block_decisions(block[0], frequent).texts))


def drop_contaminated(
    block: Block,
    signed: Signed | None,
    frequent: np.ndarray,
    index: EvalIndex,
    near: NearDedupConfig | None,
    phrase_rows: np.ndarray | None,
) -> tuple[Any, ...]:
    """The block without the rows that overlap an eval item, their reject lines and the counts."""
    rows, seqs = block
    texts = block_decisions(rows, frequent).texts
    tokenised = words(texts)
    sigs = None
    if near is not None:  # near dedup's signatures where the decision text is the one it signed
        sigs = np.zeros((len(rows), near.num_perm), dtype=np.uint32)
        fresh = np.ones(len(rows), dtype=bool)
        if signed is not None and len(signed.seqs):
            at = np.minimum(np.searchsorted(signed.seqs, seqs), len(signed.seqs) - 1)
            same = signed.seqs[at] == seqs
            same &= np.array(
                [signed.decisions.texts[a] == t for a, t in zip(at.tolist(), texts, strict=True)], dtype=bool
            )
            sigs[same] = signed.sigs[at[same]]
            fresh = ~same
        todo = np.flatnonzero(fresh)
        if len(todo):
            shingles = Shingling(near.shingle, near.ngram).hashes([texts[k] for k in todo.tolist()])
            sigs[todo] = signatures(shingles, num_perm=near.num_perm, seed=near.seed)
    found = _matched(index, texts, tokenised, near, phrase_rows, sigs, None if sigs is None else np.arange(len(rows)))
    removals: dict[int, tuple[str, dict[str, Any] | None]] = {
        seq: (f"eval overlap ({hit.method})", hit.to_json())
        for seq, hit in zip(seqs.tolist(), found, strict=True)
        if hit is not None
    }
    kept, lines, report = remove_rows(block, "decontaminate", removals)
    report["files"] = Counter(hit.file for hit in found if hit is not None)
    return kept, lines, report


def _matched(
    index: EvalIndex,
    texts: list[str],
    words: Words,
    near: NearDedupConfig | None,
    phrase_rows: np.ndarray | None,
    sigs: np.ndarray | None,
    picked: np.ndarray | None,
) -> list[Contamination | None]:
    """Each row's first eval overlap (None when clean), with the rare-phrase counts of all rows; the signatures
    are near dedup's (``sigs[picked]``) when given, else computed."""
    sketches = None
    if near is not None:
        if sigs is None or picked is None:
            shingles = Shingling(near.shingle, near.ngram).hashes(words if near.shingle == "word" else texts)
            sigs, picked = signatures(shingles, num_perm=near.num_perm, seed=near.seed), np.arange(len(texts))
        sketches = minhashes(sigs[picked], near.seed)
    return index.match(texts, tokenised=words, sketches=sketches, phrase_rows=phrase_rows)
