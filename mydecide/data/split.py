"""Splits by task: held-out tasks go out whole; the rest goes to train / dev / test by a stable hash.

The hash is taken over the seed and the normalised state text, not over a row's position, so adding rows to a
source never moves an old row to another split, and every question asked about one state lands in the same
split (a dev or test state is never seen in training under another question).

:func:`protected_split` says why a file must not be used to calibrate (or, for evaluation, why its numbers are
in-sample): it is a training, test or held-out split, a renamed copy of one, or it holds training rows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from mydecide.data.dedup import state_text
from mydecide.data.shingles import normalise
from mydecide.errors import UserError
from mydecide.manifest import MANIFEST, SPLIT_FILES, recorded_as, split_dir, split_path
from mydecide.recipe_parsing import RecipeError, read_yaml
from mydecide.record_files import load_records, read_records
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


# ------------------------------------------------------------------------------------- protected splits

PROTECTED_SPLITS = {
    "train.jsonl": ("train", "training"),
    "test.jsonl": ("test", "test"),
    "heldout_tasks.jsonl": ("heldout", "held-out test"),
}
"""Prepare outputs that calibration must never see (fitting there would leak into training or testing), and that
evaluation warns about when they hold training rows."""


def state_digest(record: Record) -> str:
    """sha256 of a record's normalised state: the text the split is keyed on (:func:`split_key`)."""
    return hashlib.sha256(split_key(record).encode()).hexdigest()


def train_split_of(path: Path) -> Path | None:
    """The training split of the prepare output that holds ``path`` (the file or partitioned split beside it; for a
    part file of a partitioned split, beside that split), or None when there is none or it holds ``path``."""
    directory = path.parent
    if path.is_file() and directory.name in {split_dir(split) for split in SPLIT_FILES}:  # dev/part-00000.jsonl
        directory = directory.parent
    train = split_path(directory, "train")
    if not train.exists() or train.resolve() == path.resolve() or train.resolve() in path.resolve().parents:
        return None
    return train


def adapter_train_split(adapter: str | Path | None) -> Path | None:
    """The training split ``adapter`` was trained on, read from its run's recipe.yaml (``RUN/adapter`` and
    ``RUN/last`` sit beside it, whose ``data`` is the prepare output), or None when that is not known or not there:
    a copy of the training split placed away from it is then still told apart by its content."""
    if adapter is None:
        return None
    try:
        data = read_yaml(Path(adapter).parent / "recipe.yaml").get("data")
    except (RecipeError, OSError, UnicodeDecodeError):  # no run recipe beside it (a copied adapter), or unreadable
        return None
    if not isinstance(data, str):
        return None
    train = split_path(data, "train")
    return train if train.exists() else None


def training_rows_in(path: Path, adapter: str | Path | None = None) -> str | None:
    """How many rows of ``path`` are training rows, when any are: rows whose state (by :func:`state_digest`) is a
    state of the training split beside it or of the one ``adapter`` was trained on (:func:`adapter_train_split`),
    with or without its row id (a copied row keeps both; prepare keeps every question on one state in one split, so
    a shared state is one the model saw in training). A row that shares only an id with a training row is not
    counted: hand-written files reuse ids such as 1, 2, 3."""
    beside, trained_on = train_split_of(path), adapter_train_split(adapter)
    splits = [(beside, "the training split")] if beside is not None else []
    if trained_on is not None and (beside is None or trained_on.resolve() != beside.resolve()):
        splits.append((trained_on, f"the training split that {adapter} was trained on,"))
    rows: list[Record] | None = None
    for train, what in splits:
        trained, _ = read_records(train)  # lenient: a training row prepare would have rejected is not one
        states = {state_digest(r): r.id for r in trained}
        ids = {r.id for r in trained}
        rows = load_records(path) if rows is None else rows
        shared = [r for r in rows if state_digest(r) in states]
        if shared:
            with_id = sum(r.id in ids for r in shared)
            return (
                f"{len(shared)} of its {len(rows)} rows are rows of {what} {train} ({with_id} by row id and "
                f"state, {len(shared) - with_id} by state alone: the sha256 of the normalised state)"
            )
    return None


def protected_split(path: str | Path, adapter: str | Path | None = None) -> str | None:
    """Why ``path`` must not be used for calibration (of ``adapter``), or None.

    Refused: a file named like prepare's train, test or held-out split, a renamed copy of one (a file with the
    sha256 that the ``manifest.json`` beside it records for one of those splits), and a file that holds rows of the
    training split beside it or of the adapter's own (a copy with changes, a concatenation, wherever it is placed:
    :func:`training_rows_in`).
    """
    path = Path(path)
    if path.name in PROTECTED_SPLITS:
        return f"{path} is named like the {PROTECTED_SPLITS[path.name][1]} split written by prepare"
    if path.is_dir():  # a partitioned split: train/, test/, heldout_tasks/
        named = f"{path.name}.jsonl"
        if named in PROTECTED_SPLITS:
            return f"{path} is named like the {PROTECTED_SPLITS[named][1]} split written by prepare"
        return training_rows_in(path, adapter)
    copied = recorded_as(path, list(PROTECTED_SPLITS))
    if copied is not None:
        role = PROTECTED_SPLITS[copied][1]
        return f"{path} has the sha256 that {path.parent / MANIFEST} records for {copied}, the {role} split"
    return training_rows_in(path, adapter)
