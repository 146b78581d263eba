"""Splits by task: held-out tasks go out whole; the rest goes to train / dev / test by a stable hash.

The hash is taken over the seed and the normalised state text, not over a row's position, so adding rows to a
source never moves an old row to another split, and every question asked about one state lands in the same
split (a dev or test state is never seen in training under another question).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from mydecide.data.dedup import state_text
from mydecide.data.shingles import normalise
from mydecide.errors import UserError
from mydecide.records import Record

SPLITS = ("train", "dev", "test", "heldout")


def unit_interval(key: str, seed: int) -> float:
    """A stable pseudo-random number in [0, 1) for ``key`` (blake2b; the same on every run and machine)."""
    digest = hashlib.blake2b(f"{seed}\x1f{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def state_key(state: object) -> str:
    """A state as the split hashes it: its text, normalised (two states with one key always share a split)."""
    return normalise(state_text(state))


def split_key(record: Record) -> str:
    """What the train/dev/test hash is taken over: the normalised state."""
    return state_key(record.state)


def assign(record: Record, *, dev_fraction: float, test_fraction: float, seed: int) -> str:
    """``"dev"`` for hashes below ``dev_fraction``, ``"test"`` for the next ``test_fraction``, else ``"train"``."""
    u = unit_interval(split_key(record), seed)
    if u < dev_fraction:
        return "dev"
    if u < dev_fraction + test_fraction:
        return "test"
    return "train"


def split_records(
    records: Sequence[Record],
    *,
    heldout_tasks: Sequence[str] = (),
    dev_fraction: float = 0.05,
    test_fraction: float = 0.0,
    seed: int = 13,
) -> dict[str, list[int]]:
    """Indices of ``records`` per split (``train``, ``dev``, ``test``, ``heldout``), each in input order.

    A held-out task that no record has is an error naming the task and the tasks present (a typo would
    otherwise leak the task into training).
    """
    tasks = {r.task for r in records}
    missing = [t for t in heldout_tasks if t not in tasks]
    if missing:
        raise UserError(f"split.heldout_tasks: no records for task(s) {missing}; the tasks are {sorted(tasks)}")
    held = set(heldout_tasks)
    out: dict[str, list[int]] = {name: [] for name in SPLITS}
    for index, record in enumerate(records):
        name = (
            "heldout"
            if record.task in held
            else assign(record, dev_fraction=dev_fraction, test_fraction=test_fraction, seed=seed)
        )
        out[name].append(index)
    return out


def capped(records: Sequence[Record], caps: int | dict[str, int] | None, seed: int) -> dict[int, str]:
    """``{removed index: task}`` so that each task keeps at most its cap (``{task: cap}`` or one cap for all).

    The rows kept are those with the smallest stable hash of (task, state): a sample that does not depend on
    the input order (sources are often sorted by label) and stays mostly the same when rows are added.
    """
    if caps is None:
        return {}
    by_task: dict[str, list[int]] = {}
    for index, record in enumerate(records):
        by_task.setdefault(record.task, []).append(index)
    removed: dict[int, str] = {}
    for task, indices in by_task.items():
        cap = caps if isinstance(caps, int) else caps.get(task)
        if cap is None or len(indices) <= cap:
            continue
        ranked = sorted(indices, key=lambda i: (unit_interval(f"{task}\x1f{split_key(records[i])}", seed), i))
        for index in ranked[cap:]:
            removed[index] = task
    return removed
