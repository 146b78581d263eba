"""What runs on the Ray workers for the driver's steps in :mod:`mydecide.data.ray.steps`: a source read and validated
into blocks, the keys of exact dedup and duplicate ids and the actor that keeps each key's first row, a block's
removals with their ``rejects.jsonl`` lines, the cap's ranks, and a block split, augmented and rendered. Each is the
local rule (:mod:`mydecide.data.inputs`, :mod:`mydecide.data.split_augment`) called on one block.

A block is (rows, seqs): the rows and their (n,) places in the run, ascending; every order the local path takes on a
row's index (the first of a key, cap ties) is taken on its seq."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np

from mydecide.config import DataRecipe, SourceSpec
from mydecide.data import split as splitting
from mydecide.data.dedup import exact_key, state_text
from mydecide.data.inputs import converted, validated
from mydecide.data.ledger import Ledger, Row, reason_pattern
from mydecide.data.split import SPLITS
from mydecide.data.split_augment import augment_train, check_absent_labels
from mydecide.jsonl import json_line

Block = tuple[list[Row], np.ndarray]  # rows and their (n,) seqs, ascending


def read_source(spec: SourceSpec, index: int, label: str, block_rows: int) -> Iterator[Any]:
    """A source's converter and validation, yielding (rows, reject lines, counts) every ``block_rows`` rows read
    (and once at the end)."""
    rows: list[Row] = []
    lines: list[str] = []
    report = _read_report()
    for line, obj in enumerate(converted(spec, index), start=1):
        report["in"] += 1
        where, records, reason, raw = validated(obj, label, line)
        if records is None:
            lines.append(json_line({"step": "validate", "reason": reason, "source": label, "where": where, "raw": raw}))
            report["rejected"] += 1
            report["reasons"][reason_pattern(reason)] += 1
            report["first"] = report["first"] or (where, reason)
        else:
            rows.extend(Row(record, label, where) for record in records)
            report["exploded"] += len(records) - 1
            report["types"].update(record.question.type for record in records)
        if report["in"] >= block_rows:
            report["out"] = len(rows)
            yield rows
            yield "".join(line + "\n" for line in lines).encode("utf-8")
            yield report
            rows, lines, report = [], [], _read_report()
    report["out"] = len(rows)
    yield rows
    yield "".join(line + "\n" for line in lines).encode("utf-8")
    yield report


def _read_report() -> dict[str, Any]:
    return {"in": 0, "rejected": 0, "out": 0, "exploded": 0, "reasons": Counter(), "types": Counter(), "first": None}


def _block(block: Any, start: int) -> Block:
    """A block as (rows, seqs); a block fresh from the reader is its rows, numbered from ``start``."""
    if isinstance(block, list):
        return block, np.arange(start, start + len(block), dtype=np.int64)
    return block


def _digests(keys: list[bytes]) -> np.ndarray:
    """(n, 2) uint64 of 16-byte digests."""
    return np.frombuffer(b"".join(keys), dtype="<u8").reshape(-1, 2)


def keyed(block: Any, start: int, kind: str, reducers: int) -> tuple[Any, ...]:
    """The block with its seqs, then one share per reducer of its (keys, seqs, target hashes, refs): ``exact``
    keys are the exact-dedup digests (with the target, to count label conflicts), ``id`` keys the ids'."""
    rows, seqs = _block(block, start)
    if kind == "none":
        return (rows, seqs)
    if kind == "exact":
        keys = _digests([exact_key(row.record) for row in rows])
        targets = np.array([hash64(repr(row.record.target)) for row in rows], dtype=np.uint64)
    else:
        keys = _digests([hashlib.blake2b(row.record.id.encode("utf-8"), digest_size=16).digest() for row in rows])
        targets = np.zeros(len(rows), dtype=np.uint64)
    refs = [row.ref() for row in rows]
    share = (keys[:, 0] % np.uint64(reducers)).astype(np.int64)
    out: list[Any] = [(rows, seqs)]
    for r in range(reducers):
        mine = np.flatnonzero(share == r)
        out.append((keys[mine], seqs[mine], targets[mine], [refs[k] for k in mine.tolist()]))
    return tuple(out)


class FirstSeen:
    """A Ray actor holding one share of the keys seen so far (by key), with each key's first row's target hash and
    reference. Blocks arrive in block order and rows in seq order, so the first row seen of a key is its lowest seq."""

    def __init__(self) -> None:
        self.first: dict[bytes, tuple[int, Any]] = {}

    def add(self, *shares: tuple[np.ndarray, np.ndarray, np.ndarray, list[Any]]) -> tuple[Any, ...]:
        """Per block share (keys, seqs, target hashes, refs): the rows whose key an earlier row holds, as (seqs,
        the first row's ref, whether the targets differ)."""
        out = []
        for keys, seqs, targets, refs in shares:
            removed: list[int] = []
            matched: list[Any] = []
            conflicts: list[bool] = []
            for k in np.argsort(seqs, kind="stable").tolist():
                key = keys[k].tobytes()
                target = int(targets[k])
                held = self.first.get(key)
                if held is None:
                    self.first[key] = (target, refs[k])
                else:
                    removed.append(int(seqs[k]))
                    matched.append(held[1])
                    conflicts.append(held[0] != target)
            out.append((np.array(removed, dtype=np.int64), matched, np.array(conflicts, dtype=bool)))
        return tuple(out) if len(out) != 1 else out[0]


def drop_repeated(
    block: Block, step: str, reason: str, *shares: tuple[np.ndarray, list[Any], np.ndarray]
) -> tuple[Any, ...]:
    removals: dict[int, tuple[str, dict[str, Any] | None]] = {}
    conflicts = 0
    for seqs, matched, conflict in shares:
        for seq, ref in zip(seqs.tolist(), matched, strict=True):
            removals[seq] = (reason, ref)
        conflicts += int(conflict.sum())
    kept, lines, report = remove_rows(block, step, removals)
    report["conflicts"] = conflicts
    return kept, lines, report


def remove_rows(block: Block, step: str, removals: dict[int, tuple[str, dict[str, Any] | None]]) -> tuple[Any, ...]:
    """The block without the removed rows, their lines for rejects.jsonl (``Ledger.step``'s), and the counts."""
    rows, seqs = block
    keep = np.ones(len(rows), dtype=bool)
    lines: list[str] = []
    report: dict[str, Any] = {
        "removed": 0,
        "reasons": Counter(),
        "sources": Counter(),
        "types": Counter(),
        "tasks": Counter(),
        "files": Counter(),
    }
    for k, seq in enumerate(seqs.tolist()):
        found = removals.get(seq)
        if found is None:
            continue
        reason, matched = found
        row = rows[k]
        keep[k] = False
        entry: dict[str, Any] = {"step": step, "reason": reason, **row.ref(), "task": row.record.task}
        if matched is not None:
            entry["matched"] = matched
        entry["record"] = row.record.to_json()
        lines.append(json_line(entry))
        report["removed"] += 1
        report["reasons"][reason] += 1
        report["sources"][row.source] += 1
        report["types"][row.record.question.type] += 1
        report["tasks"][row.record.task] += 1
    kept = ([row for row, k in zip(rows, keep.tolist(), strict=True) if k], seqs[keep])
    return kept, "".join(line + "\n" for line in lines).encode("utf-8"), report


def hash64(text: str) -> int:
    """A stable 64-bit hash of ``text`` (the same in every worker process, unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def check_labels(block: Block, recipe: DataRecipe) -> None:
    """The local check of span labels declared absent, on one block's rows."""
    check_absent_labels(block[0], recipe)


def count_tasks(block: Block) -> Counter[str]:
    """The block's rows per task."""
    return Counter(row.record.task for row in block[0])


def cap_ranks(block: Block, cap_of: dict[str, int], seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per task over its cap: the (hash, seq) of at most ``cap`` of this block's rows with the lowest hash (the
    cap keeps the rows of lowest (hash, seq), :func:`split.capped`'s order)."""
    found: dict[str, tuple[list[float], list[int]]] = {}
    for row, seq in zip(block[0], block[1].tolist(), strict=True):
        task = row.record.task
        if task in cap_of:
            u, s = found.setdefault(task, ([], []))
            u.append(splitting.unit_interval(f"{task}\x1f{splitting.split_key(row.record)}", seed))
            s.append(seq)
    out = {}
    for task, (u, s) in found.items():
        uu, ss = np.array(u, dtype=np.float64), np.array(s, dtype=np.int64)
        order = np.lexsort((ss, uu))[: cap_of[task]]
        out[task] = (uu[order], ss[order])
    return out


def drop_over_cap(
    block: Block, last: dict[str, tuple[float, int]], cap_of: dict[str, int], seed: int
) -> tuple[Any, ...]:
    removals: dict[int, tuple[str, dict[str, Any] | None]] = {}
    for row, seq in zip(block[0], block[1].tolist(), strict=True):
        task = row.record.task
        if task in cap_of:
            u = splitting.unit_interval(f"{task}\x1f{splitting.split_key(row.record)}", seed)
            if (u, seq) > last[task]:
                removals[seq] = ("over the task cap", {"cap": cap_of[task]})
    return remove_rows(block, "cap_per_task", removals)


def split_render(block: Block, recipe: DataRecipe) -> tuple[Any, ...]:
    """The block split (held-out tasks whole, the rest by the state hash), train augmented, every split's lines
    (bytes) and the counts the split and augment steps and the manifest need."""
    cfg = recipe.split
    held = set(cfg.heldout_tasks)
    rows = block[0]
    splits: dict[str, list[Row]] = {name: [] for name in SPLITS}
    for row in rows:
        name = (
            "heldout"
            if row.record.task in held
            else splitting.assign(
                row.record, dev_fraction=cfg.dev_fraction, test_fraction=cfg.test_fraction, seed=cfg.seed
            )
        )
        splits[name].append(row)
    report: dict[str, Any] = {
        "splits": Counter({name: len(part) for name, part in splits.items()}),
        "by_task": {name: Counter(row.record.task for row in part) for name, part in splits.items()},
    }
    scratch = Ledger()
    splits["train"] = augment_train(splits["train"], recipe, scratch)
    report["added"] = Counter(scratch.steps[-1]["added"])
    report["soft_targets"] = scratch.steps[-1]["soft_targets"]
    report["stats"] = {}
    report["rendered"] = {}
    rendered = []
    for name in SPLITS:
        part = splits[name]
        report["stats"][name] = {
            "type": Counter(row.record.question.type for row in part),
            "lang": Counter(row.record.lang for row in part),
            "task": Counter(row.record.task for row in part),
            "option_count": Counter(row.record.question.k for row in part),
            "lengths": Counter(len(state_text(row.record.state)) for row in part),
        }
        report["rendered"][name] = len(part)
        rendered.append("".join(json_line(row.record.to_json()) + "\n" for row in part).encode("utf-8"))
    return (report, *rendered)
