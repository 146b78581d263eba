"""``prepare`` on Ray: near dedup and decontamination run as Ray tasks over partitions of the rows, with the
answer of the local path.

The pipeline (:func:`mydecide.data.prepare.prepare`) keeps its table of contents and its ledger; this module is
its :class:`RayEngine`, which takes over the two heavy steps (near dedup and decontamination, nine tenths of a
local run) and keeps their rules, reusing the local functions:

- near dedup: each partition's MinHash signatures of the rows' decision texts (the local
  :class:`~mydecide.data.near_dedup.Decisions`, shingling and :func:`~mydecide.data.near_dedup.signatures`) and
  one key per LSH band (the band's hash mixed with the band number and the row's group) are computed by one task;
  the keys are shuffled by value to reducer tasks, so a bucket shared by rows of different partitions meets in
  one place, and each reducer returns the small (key, row) tuples of its shared buckets. The driver turns them
  into candidate pairs; tasks check each pair with the local :class:`~mydecide.data.near_dedup.Verifier` (same
  band, MinHash estimate, exact shingle Jaccard, changed slot, and for records whose question is content the
  question and state rule). The keep rule then runs in the driver on the verified (row, kept row, similarity)
  tuples, in row order: a row goes when an earlier *kept* row of its group matches it, and names the most
  similar one (first on ties), exactly as :func:`~mydecide.data.near_dedup.near_duplicates_of` does.
- decontamination: the :class:`~mydecide.data.decontaminate.EvalIndex` is built once and shared through the
  object store; each partition is matched by :meth:`EvalIndex.match`. The one check that counts over all rows (a
  short eval phrase is common when it is inside more than three rows) gets the counts summed over the partitions
  first (:meth:`EvalIndex.phrase_rows`).

Nothing depends on how the rows are cut: the answer is the same for any partition count and on every run. A task
whose worker dies is retried by Ray (three times by default). Conversion, validation, exact dedup, caps, splits
and augmentation stay in the driver (a tenth of a local run), and the outputs are written by the pipeline's own
atomic writer, so `train` reads them as it reads a local run's.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from mydecide.config import DataRecipe, NearDedupConfig, RayEngineConfig
from mydecide.data.decontaminate import Contamination, EvalIndex
from mydecide.data.ledger import Row, decisions
from mydecide.data.near_dedup import (
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
from mydecide.data.shingles import POLY, Shingling, Words, words
from mydecide.recipe_parsing import RecipeError

# ------------------------------------------------------------------------------------------------- the engine

# Ray settings of a local Ray that a run starts (a cluster the run joins keeps its own; start it with these):
# - every task result goes to the object store: a result under Ray's inline limit (100 KiB) would otherwise stay in
#   the driver's own memory until read, and the streaming path's shuffles make many;
# - every spilled object gets a file of its own: Ray otherwise fuses objects into files of 100 MB and deletes a file
#   only when every object in it is freed, so a few long-lived objects (reject lines, near pairs, a block's
#   signatures) kept whole files of freed blocks on disk: 42 GB of spill files at 3M rows filled this machine's
#   disk, against 3 MiB left at the end when unfused (docs/distributed-prepare.md).
LOCAL_RAY_SETTINGS = {"max_direct_call_object_size": 1, "max_fused_object_count": 1}


@contextmanager
def ray_engine(settings: RayEngineConfig, *, log: Callable[[str], None] | None = None) -> Iterator[RayEngine]:
    """A :class:`RayEngine` on the Ray this process is connected to, else on ``settings.address`` (or
    ``$RAY_ADDRESS``), else on a local Ray with ``settings.num_workers`` CPUs started for the run (and shut down
    after it)."""
    try:
        import ray
    except ImportError:
        raise RecipeError(
            "engine: ray needs the ray package (pip install -e '.[distributed]'; requirements.lock pins its version)"
        ) from None
    started = not ray.is_initialized()
    if started:
        address = settings.address or os.environ.get("RAY_ADDRESS") or None
        options: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING, "log_to_driver": False}
        if address is None:  # a local Ray, set for the streaming path (docs/distributed-prepare.md):
            ray.init(num_cpus=settings.num_workers, _system_config=LOCAL_RAY_SETTINGS, **options)
        else:  # the cluster's workers import mydecide from the copy this run ships
            package = str(Path(__file__).resolve().parents[1])
            try:
                ray.init(address=address, runtime_env={"py_modules": [package]}, **options)
            except (ConnectionError, ValueError, RuntimeError) as err:
                where = "ray.address" if settings.address else "$RAY_ADDRESS"
                raise RecipeError(f"{where} {address!r}: cannot connect to a Ray cluster ({err})") from None
    try:
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        engine = RayEngine(settings.partitions or 2 * cpus)
        if log is not None:
            log(f"engine ray: {cpus} CPUs, {engine.partitions} partitions")
        yield engine
    finally:
        if started:
            ray.shutdown()


class RayEngine:
    """Near dedup and decontamination as Ray tasks over ``partitions`` slices of the rows (module docstring)."""

    def __init__(self, partitions: int):
        self.partitions = partitions
        # near dedup's rows, their partitions, each partition's signatures (object refs) and the texts signed,
        # which decontamination reuses for the rows that are left (same MinHash settings, same decision texts)
        self._signed: tuple[list[Row], list[tuple[int, int]], list[Any], list[str]] | None = None

    def cut(self, n: int) -> list[tuple[int, int]]:
        """(start, stop) of each partition: consecutive rows, sizes differing by at most one."""
        bounds = np.linspace(0, n, min(self.partitions, max(n, 1)) + 1).round().astype(int).tolist()
        return list(itertools.pairwise(bounds))

    # ------------------------------------------------------------------------------------------ near dedup

    def near_matches(self, rows: list[Row], recipe: DataRecipe, bar: Any) -> dict[int, NearMatch]:
        import ray

        near = recipe.dedup.near
        found = decisions(rows)
        texts, groups = found.texts, found.groups
        parts = self.cut(len(rows))
        reducers = len(parts)
        sign: Any = ray.remote(num_returns=1 + reducers)(_sign)
        # each partition: its (B, P) signatures and its band keys cut into one share per reducer
        signed = [sign.remote(texts[a:b], groups[a:b], a, near, reducers) for a, b in parts]
        gather([refs[0] for refs in signed], bar, [b - a for a, b in parts])
        self._signed = (rows, parts, [refs[0] for refs in signed], texts)
        shared = ray.remote(_shared_buckets)
        buckets = ray.get([shared.remote(*[refs[1 + r] for refs in signed]) for r in range(reducers)])
        pairs = candidate_pairs(buckets, groups)
        if not len(pairs):
            return {}
        linked = np.unique(pairs)
        pick = ray.remote(_pick)
        picked = ray.get(
            [
                pick.remote(refs[0], linked[(linked >= a) & (linked < b)] - a)
                for refs, (a, b) in zip(signed, parts, strict=True)
            ]
        )
        payload = ray.put((linked, np.concatenate(picked), found.take(linked)))
        check = ray.remote(_verify_pairs)
        chunks = np.array_split(pairs, min(self.partitions, len(pairs)))
        matches = np.concatenate(ray.get([check.remote(payload, chunk, near) for chunk in chunks]))
        return keep_rule(matches)

    # -------------------------------------------------------------------------------------- decontamination

    def contamination(
        self, rows: list[Row], index: EvalIndex, recipe: DataRecipe, bar: Any
    ) -> list[Contamination | None]:
        import ray

        if not rows:
            return []
        near = recipe.dedup.near if recipe.decontamination.near else None
        decision_texts = decisions(rows).texts
        signed, sigs = self.signed_parts(rows, decision_texts) if near is not None else (None, None)
        parts: list[tuple[int, int, np.ndarray | None]] = [(a, b, None) for a, b in self.cut(len(rows))]
        if signed is not None:
            parts = list(signed)
        texts = [ray.put(decision_texts[a:b]) for a, b, _ in parts]
        tokenise: Any = ray.remote(words)
        tokenised = [tokenise.remote(part) for part in texts]  # once, for both passes
        shared = ray.put(index)
        phrase_rows = None
        if index.short_edits:  # the rare-phrase check counts over all rows: sum the partitions' counts first
            count = ray.remote(_phrase_rows)
            phrase_rows = np.sum(ray.get([count.remote(shared, part) for part in tokenised]), axis=0)
        match = ray.remote(_matched)
        counts = ray.put(phrase_rows)
        tasks = [
            match.remote(shared, text, word, near, counts, None if sigs is None else sigs[k], picked)
            for k, (text, word, (_, _, picked)) in enumerate(zip(texts, tokenised, parts, strict=True))
        ]
        found = gather(tasks, bar, [b - a for a, b, _ in parts])
        self._signed = None  # the last step that reads the signatures: the object store may free them
        return [hit for part in found for hit in part]

    def signed_parts(
        self, rows: list[Row], texts: list[str]
    ) -> tuple[list[tuple[int, int, np.ndarray]] | None, list[Any] | None]:
        """The rows cut along near dedup's partitions, with the positions of their signatures in each partition's
        signatures (rows left after near dedup, in order); (None, None) when these rows were not signed, or not
        all with these decision ``texts`` (a question asked of more rows before near dedup than after it can be
        an instruction there and content here)."""
        if self._signed is None:
            return None, None
        signed_rows, signed_parts, sigs, signed_texts = self._signed
        position = {id(row): k for k, row in enumerate(signed_rows)}
        found = np.fromiter((position.get(id(row), -1) for row in rows), dtype=np.int64, count=len(rows))
        if (found < 0).any() or any(signed_texts[k] != text for k, text in zip(found.tolist(), texts, strict=True)):
            return None, None
        parts = []
        for a, b in signed_parts:
            lo, hi = np.searchsorted(found, [a, b]).tolist()
            parts.append((lo, hi, found[lo:hi] - a))
        return parts, sigs


# ----------------------------------------------------------------------------------- the driver's small steps


def gather(refs: list[Any], bar: Any, rows: list[int]) -> list[Any]:
    """``ray.get(refs)``, moving the progress bar by each task's rows as it finishes."""
    import ray

    pending = dict(zip(refs, rows, strict=True))
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            bar.update(pending.pop(ref))
    return ray.get(refs)


def candidate_pairs(buckets: list[tuple[np.ndarray, np.ndarray]], groups: np.ndarray) -> np.ndarray:
    """(M, 2) distinct (row, earlier row) pairs of one group that share an LSH bucket, from the reducers' (key,
    row) tuples of the keys seen more than once (every key of a bucket reaches the same reducer, whichever
    partition its rows are in). A 64-bit key collision only adds a candidate, which verification drops (it
    compares the bands themselves)."""
    n = len(groups)
    found = [np.empty(0, dtype=np.int64)]
    for keys, members in buckets:
        order = np.lexsort((members, keys))  # buckets together, each in ascending rows
        keys, members = keys[order], members[order]
        first = np.r_[True, keys[1:] != keys[:-1]] if len(keys) else np.empty(0, dtype=bool)
        start = np.maximum.accumulate(np.where(first, np.arange(len(keys)), 0))  # (L,) where each bucket starts
        before = np.arange(len(keys)) - start  # (L,) earlier rows in the same bucket
        later = np.repeat(np.arange(len(keys)), before)  # one entry per pair, by its later row
        k = np.arange(len(later)) - np.repeat(np.cumsum(before) - before, before)  # 0 .. before - 1
        found.append(members[later] * n + members[start[later] + k])  # (row, earlier row) as one number
    pairs = np.unique(np.concatenate(found))
    pairs = np.stack([pairs // n, pairs % n], axis=1)
    return pairs[groups[pairs[:, 0]] == groups[pairs[:, 1]]]


def keep_rule(matches: np.ndarray) -> dict[int, NearMatch]:
    """``{removed row: NearMatch}`` from verified (row, earlier row, similarity) pairs: :func:`kept_by`'s table as
    a dict."""
    return {int(i): NearMatch(int(j), float(s)) for i, j, s in kept_by(matches).tolist()}


def kept_by(matches: np.ndarray) -> np.ndarray:
    """(k, 3) float64 (removed row, kept row, similarity), ascending by removed row, from verified (m, 3) (row,
    earlier row, similarity) pairs, visiting rows in order: a row is removed by the most similar earlier row that
    is still kept (the first of the most similar on ties), the rule of
    :func:`~mydecide.data.near_dedup.near_duplicates_of`. Arrays only (no object per pair): the streaming driver
    runs it on every verified pair of the run."""
    if not len(matches):
        return np.zeros((0, 3))
    order = np.lexsort((matches[:, 1], matches[:, 0]))  # by row, then earlier row: ties go to the first
    rows, earlier, similarity = (
        matches[order, 0].astype(np.int64),
        matches[order, 1].astype(np.int64),
        matches[order, 2],
    )
    ids = np.unique(np.concatenate([rows, earlier]))
    removed = np.zeros(len(ids), dtype=bool)  # (U,) over the rows in any pair
    at_row, at_earlier = np.searchsorted(ids, rows), np.searchsorted(ids, earlier)
    starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
    ends = np.r_[starts[1:], len(rows)]
    out = np.zeros((len(starts), 3))
    n = 0
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):  # one row's pairs, ascending by earlier row
        alive = np.where(removed[at_earlier[a:b]], -np.inf, similarity[a:b])
        k = int(np.argmax(alive))  # the first of the most similar still-kept rows
        if alive[k] == -np.inf:
            continue
        removed[at_row[a]] = True
        out[n] = (rows[a], earlier[a + k], similarity[a + k])
        n += 1
    return out[:n]


# ------------------------------------------------------------------------------ what runs on the Ray workers


def _sign(texts: list[str], groups: np.ndarray, start: int, near: NearDedupConfig, reducers: int) -> tuple[Any, ...]:
    """A partition's (B, P) signatures, then its (key, row) band tuples cut into one share per reducer by key.

    A row's key in band k is the band's hash mixed with k and the row's group (:class:`Decisions`)."""
    shingles = Shingling(near.shingle, near.ngram).hashes(texts)
    sigs = signatures(shingles, num_perm=near.num_perm, seed=near.seed)
    keys = band_keys(sigs, candidate_threshold(near.threshold))  # (B, b)
    bands = keys.shape[1]
    keys = keys * POLY + np.arange(1, bands + 1, dtype=np.uint64)[None, :]
    keys = (keys * POLY + groups.astype(np.uint64)[:, None]).ravel()  # row-major: row 0's b keys, row 1's ...
    members = np.repeat(np.arange(start, start + len(texts), dtype=np.int64), bands)
    share = (keys % np.uint64(reducers)).astype(np.int64)
    return (sigs, *((keys[share == r], members[share == r]) for r in range(reducers)))


def _shared_buckets(*shares: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The (key, row) tuples of the keys that more than one row holds (one reducer's share of every partition)."""
    keys = np.concatenate([k for k, _ in shares])
    members = np.concatenate([m for _, m in shares])
    _, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    keep = counts[inverse] > 1
    return keys[keep], members[keep]


def _pick(sigs: np.ndarray, rows: np.ndarray) -> np.ndarray:
    return sigs[rows]


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


def _phrase_rows(index: EvalIndex, words: Words) -> np.ndarray:
    """(E,): how many of the partition's rows hold each short eval phrase whole."""
    return index.phrase_rows(words)


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
