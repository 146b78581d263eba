"""The driver's account of a ``prepare`` run on Ray: its blocks (object references), its counters and each step's
entry in the manifest, filled step by step (:mod:`mydecide.data.ray.steps`, :mod:`mydecide.data.ray.near_steps`)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from mydecide.config import DataRecipe
from mydecide.data.outputs import STATE_LENGTH_BINS
from mydecide.data.ray.engine import cpus
from mydecide.data.split import SPLITS
from mydecide.io import provenance

Log = Callable[[str], None]


@dataclass
class Part:
    ref: Any  # the block (rows, seqs) in the object store; before the first step, the read rows only
    rows: int


class Stream:
    """The run's blocks (object references), its counters and each step's account, filled step by step."""

    def __init__(self, recipe: DataRecipe, reducers: int, say: Log):
        self.recipe = recipe
        self.min_reducers = reducers
        self.say = say
        self.parts: list[Part] = []
        self.starts = np.zeros(0, dtype=np.int64)  # (P,) the first seq of each block
        self.steps: list[dict[str, Any]] = []
        self.rejects: list[Any] = []  # references to the reject lines (bytes), in the order of rejects.jsonl
        self.reject_lines = 0
        # near_pairs.jsonl: per range of ranks (as many as reducers), each block's (rank, line)
        self.near_ranges: list[list[Any]] = []
        self.splits_out: dict[str, list[Any]] = {}  # each split's lines (bytes) per block
        self.split_rows: dict[str, int] = {}
        self.split_stats: dict[str, dict[str, Counter[Any]]] = {}
        self.rows = 0
        self.rows_read = self.exploded_extra = self.rejected = self.removed = self.augmented = 0
        self.by_source: Counter[str] = Counter()
        self.by_type: Counter[str] = Counter()
        self.by_task: Counter[str] = Counter()
        self.signed: list[Any] | None = None  # near dedup's signatures per block, for decontamination
        self.clock = time.perf_counter()

    @property
    def reducers(self) -> int:
        """Shuffle partitions: ray.partitions (2 per cluster CPU by default), not a number that grows with the
        blocks: a shuffle sending every block to every reducer at once makes blocks x reducers objects, each a few
        KB of the driver's own memory (Ray's reference and task records), so reducers growing with the blocks made
        the driver grow with the square of the rows (exact dedup, duplicate ids and the question-key count send
        blocks in waves instead: :meth:`waves`). A reducer's share grows with the rows: on a cluster, raise
        ray.partitions."""
        return self.min_reducers

    def lap(self) -> float:
        now = time.perf_counter()
        seconds, self.clock = now - self.clock, now
        return round(seconds, 3)

    # ------------------------------------------------------------------------------------ the shared pattern

    def step(self, name: str, reports: list[dict[str, Any]], **extra: Any) -> None:
        """Count one step from its blocks' removal reports, like :meth:`Ledger.step`."""
        removed = sum(r["removed"] for r in reports)
        reasons: Counter[str] = Counter()
        sources: Counter[str] = Counter()
        types: Counter[str] = Counter()
        tasks: Counter[str] = Counter()
        for r in reports:  # in block order: a reason's first appearance is its first in row order
            reasons.update(r["reasons"])
            sources.update(r["sources"])
            types.update(r["types"])
            tasks.update(r["tasks"])
        after_source, after_type = self.by_source - sources, self.by_type - types
        self.steps.append(
            {
                "step": name,
                "in": self.rows,
                "out": self.rows - removed,
                "removed": removed,
                "reasons": dict(reasons.most_common()),
                "by_source": {k: {"in": self.by_source[k], "out": after_source[k]} for k in sorted(self.by_source)},
                "by_type": {k: {"in": self.by_type[k], "out": after_type[k]} for k in sorted(self.by_type)},
                "removed_by_task": dict(sorted((+tasks).items())),
                **extra,
                "seconds": self.lap(),
            }
        )
        self.rows -= removed
        self.removed += removed
        self.by_source, self.by_type = after_source, after_type
        self.by_task = self.by_task - tasks if self.by_task else self.by_task

    def apply(self, outputs: list[list[Any]]) -> list[dict[str, Any]]:
        """Each block's (kept block, reject lines, report, ...) from a removing task: the blocks are replaced, the
        lines queued for rejects.jsonl, and the reports returned in block order."""
        import ray

        reports = []
        for part, refs in zip(self.parts, outputs, strict=True):
            report = ray.get(refs[2])  # one at a time, in block order: an error names the first bad block
            part.ref = refs[0]
            part.rows -= report["removed"]
            if report["removed"]:
                self.rejects.append(refs[1])
                self.reject_lines += report["removed"]
            reports.append(report)
        return reports

    def waves(self) -> Iterator[range]:
        """The blocks in waves of :meth:`wave_blocks`, in block order. A waved step sends a wave only once the wave
        before it is done, so at most two are in flight and the objects alive do not grow with the blocks."""
        wave = self.wave_blocks()
        for first in range(0, len(self.parts), wave):
            yield range(first, min(first + wave, len(self.parts)))

    def cpus(self) -> int:
        return cpus()

    def wave_blocks(self) -> int:
        """Blocks keyed at once in a shuffle: twice the cluster's CPUs, at least 4."""
        return max(4, 2 * self.cpus())

    # ---------------------------------------------------------------------------------- manifest and files

    # ------------------------------------------------------------------------------------------- the manifest

    def manifest(self) -> dict[str, Any]:
        kept = sum(self.split_rows.values()) - self.augmented
        conservation = {
            "input": self.rows_read + self.exploded_extra,
            "rows_read": self.rows_read,
            "exploded_extra": self.exploded_extra,
            "kept": kept,
            "rejected": self.rejected,
            "removed": self.removed,
            "augmented_copies": self.augmented,
            "law": "input = kept + rejected + removed (augmented copies are extra rows of train)",
        }
        if conservation["input"] != kept + self.rejected + self.removed:
            raise RuntimeError(
                f"row conservation broken: input {conservation['input']} != kept {kept} + rejected "
                f"{self.rejected} + removed {self.removed}"
            )
        if self.reject_lines != self.rejected + self.removed:
            raise RuntimeError(
                f"rejects.jsonl would hold {self.reject_lines} rows, not {self.rejected} rejected + "
                f"{self.removed} removed"
            )
        return {
            "conservation": conservation,
            "steps": self.steps,
            "splits": {
                name: distributions(self.split_rows[name], self.split_stats[name])
                for name in SPLITS
                if name != "test" or self.recipe.split.test_fraction > 0
            },
            "recipe": self.recipe.model_dump(mode="json"),
            "provenance": provenance(),
            "outputs": {},
        }


def no_removal() -> dict[str, Any]:
    return {"removed": 0, "reasons": {}, "sources": {}, "types": {}, "tasks": {}}


def distributions(rows: int, stats: dict[str, Counter[Any]]) -> dict[str, Any]:
    """``outputs.distributions`` of a split from its blocks' counters (state lengths as exact-length counts)."""
    lengths = sorted((stats.get("lengths") or Counter()).items())
    bins: Counter[str] = Counter()
    for n, count in lengths:
        bins[next((f"<={b}" for b in STATE_LENGTH_BINS if n <= b), f">{STATE_LENGTH_BINS[-1]}")] += count
    cumulative = np.cumsum([count for _, count in lengths]) if lengths else np.zeros(0, dtype=np.int64)

    def quantile(q: float) -> int | None:
        if not lengths:
            return None
        at = min(rows - 1, int(q * rows))  # the at-th length in ascending order
        return int(lengths[int(np.searchsorted(cumulative, at, side="right"))][0])

    def sorted_counts(key: str) -> dict[Any, int]:
        return dict(sorted((stats.get(key) or Counter()).items()))

    return {
        "rows": rows,
        "type": sorted_counts("type"),
        "lang": sorted_counts("lang"),
        "task": sorted_counts("task"),
        "option_count": {str(k): n for k, n in sorted_counts("option_count").items()},
        "state_chars": {
            "min": lengths[0][0] if lengths else None,
            "median": quantile(0.5),
            "p90": quantile(0.9),
            "max": lengths[-1][0] if lengths else None,
            "histogram": {
                b: bins[b] for b in [f"<={x}" for x in STATE_LENGTH_BINS] + [f">{STATE_LENGTH_BINS[-1]}"] if bins[b]
            },
        },
    }
