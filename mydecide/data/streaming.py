"""``prepare`` on Ray with no process holding all rows (``engine: ray`` with ``ray.streaming: true``).

The rows live in the Ray object store as blocks of at most ``ray.block_rows`` read rows; every step is a Ray task
per block (or per shuffle partition), and the driver holds only object references, counts and small tables: the
verified near pairs (arrays), each step's counters. The steps are the local ones, in the local order,
with the local rules called on the workers:

- **read and validate**: one streaming task per source runs its converter and validates each row
  (:func:`mydecide.data.inputs.validated`), yielding a block, its reject lines and its counts every
  ``block_rows`` rows read. A row's place in the run (its ``seq``) is its position among the validated rows, as in
  the local path, and every later order (first of a key, earlier kept row, cap ties) is taken on it.
- **exact dedup, duplicate ids**: each block sends (key, seq, ref) to a reducer chosen by the key; a reducer keeps
  the lowest seq of each key and sends each removal back to the block that holds it.
- **near dedup**: which questions are content (asked of at most ``CONTENT_ROWS`` rows) is a count by question
  over all rows, shuffled the same way; each block signs its decision texts and sends one key per LSH band to a
  reducer, which turns shared buckets into candidate pairs; each pair goes to the verification group of its later
  row's block (groups are runs of consecutive blocks, as many as reducers), each block sends each group the rows its
  pairs need, and the group verifies them by the local :class:`~mydecide.data.near_dedup.Verifier`. Only the
  verified (row, earlier row, similarity) tuples reach the driver, which applies the order-dependent keep rule on
  arrays (:func:`mydecide.data.distributed.kept_by`) and sends each block its removals.
- **decontamination**: the question count again (on the rows left), the rare-phrase counts summed over blocks,
  then :meth:`EvalIndex.match` per block, reusing near dedup's signatures where the decision text is unchanged.
- **cap per task**: each block ranks its rows of the tasks over their cap and sends at most ``cap`` of them; the
  driver keeps the ``cap`` lowest per task (a table of the recipe's own size) and each block drops the rest.
- **split, augment, render**: per block (the split hash is per row, augmentation per record); each block returns
  its split files' lines and the counters the manifest needs (state lengths as a histogram of exact lengths, so
  the quantiles are exact).

Every shuffle has ``ray.partitions`` reducers, whatever the rows: a step makes blocks x reducers objects, never
blocks x blocks, and each object costs the driver a few KB of its own memory, so the driver stays flat as blocks are
added (docs/distributed-prepare.md measures it).

The files are then written block after block (one block's lines in memory at a time) by Ray tasks pinned to the
driver's node, into the usual staging directory there, which replaces ``--out`` whole only when everything is
written: the driver gets each file's rows and hash, never its lines, and a worker or a driver dying at any point
leaves the previous outputs. A failed task is retried by Ray; an error in the data stops the run with the local
message. The output is the local path's, byte for byte (docs/distributed-prepare.md).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mydecide.config import DataRecipe, NearDedupConfig, SourceSpec
from mydecide.data import split as splitting
from mydecide.data.decontaminate import EvalIndex
from mydecide.data.dedup import exact_key, state_text
from mydecide.data.distributed import _matched, _sign, _verify_pairs, kept_by, ray_engine
from mydecide.data.filtering import decontamination_details, eval_index, near_pairs, near_step_details, similarity_band
from mydecide.data.inputs import converted, source_labels, validated
from mydecide.data.ledger import Ledger, Row, reason_pattern, short_reasons
from mydecide.data.near_dedup import CONTENT_ROWS, Decisions, NearMatch, signatures
from mydecide.data.outputs import OUTPUT_FILES, STATE_LENGTH_BINS, check_output_dir, earlier_outputs, write_parquet
from mydecide.data.shingles import Shingling, shingle_text, words
from mydecide.errors import UserError
from mydecide.io import atomic_write_json, atomic_write_text, directory_lock, provenance, staged_directory
from mydecide.jsonl import json_line
from mydecide.manifest import MANIFEST, SPLIT_FILES, split_dir
from mydecide.recipe_parsing import RecipeError

Log = Callable[[str], None]
Block = tuple[list[Row], np.ndarray]  # rows and their (n,) seqs, ascending
SPLITS = splitting.SPLITS


def prepare_streaming(
    recipe: DataRecipe, out: str | Path | None = None, *, progress: bool = False, log: Log | None = None
) -> dict[str, Any]:
    """:func:`mydecide.data.prepare.prepare` on Ray, block by block; returns the manifest. ``progress`` is
    accepted for the same signature (the streaming path logs one line per step instead of progress bars)."""
    import ray

    out = Path(out if out is not None else recipe.out)
    check_output_dir(out, recipe)
    if recipe.output.format == "parquet" and recipe.output.rows_per_file is None:
        raise RecipeError(
            "ray.streaming: output.format parquet needs output.rows_per_file (one Parquet file of a whole split "
            "would be built in one process); set output.rows_per_file, e.g. 1000000, or ray.streaming: false"
        )
    with directory_lock(out, "prepare"), ray_engine(recipe.ray, log=log) as engine:
        say = log or (lambda _message: None)
        run = Stream(recipe, engine.partitions, say)
        try:
            run.read()
            run.exact_dedup()
            run.unique_ids()
            run.near_dedup()
            run.decontaminate()
            run.cap_per_task()
            run.split_and_augment()
            for step in run.steps:
                say(f"{step['step']:<14} {step['in']:>8} in  {step['out']:>8} out  {short_reasons(step)}")
            manifest = run.manifest()
            run.write(out, manifest)
        except ray.exceptions.RayTaskError as err:  # a data or recipe error on a worker: the local one-line message
            cause = getattr(err, "cause", None)
            if isinstance(cause, UserError):
                raise cause from None
            raise
        say(f"wrote {', '.join(sorted(manifest['outputs']))} to {out}")
        return manifest


# ------------------------------------------------------------------------------------------------- the driver


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

    # ------------------------------------------------------------------------------------- read and validate

    def read(self) -> None:
        import ray

        specs = self.recipe.sources
        labels = source_labels(specs)
        block_rows = self.recipe.ray.block_rows
        read = ray.remote(_read).options(num_returns="streaming")
        streams = [
            read.remote(spec, index, label, block_rows)
            for index, (label, spec) in enumerate(zip(labels, specs, strict=True))
        ]
        per_source: dict[str, dict[str, int]] = {}
        reasons: Counter[str] = Counter()
        types: Counter[str] = Counter()
        for index, (label, spec, stream) in enumerate(zip(labels, specs, streams, strict=True)):
            counts = per_source.setdefault(label, {"in": 0, "rejected": 0, "out": 0})
            first: tuple[str, str] | None = None
            refs: Iterator[Any] = iter(stream)  # type: ignore[call-overload]
            for block in refs:
                lines, report_ref = next(refs, None), next(refs, None)
                if report_ref is None:  # the task failed before its block's lines and counts: raise its error
                    ray.get(block)
                    raise RuntimeError(f"sources[{index}]: the reader stopped without its counts")
                report = ray.get(report_ref)
                counts["in"] += report["in"]
                counts["rejected"] += report["rejected"]
                counts["out"] += report["out"]
                self.rows_read += report["in"]
                self.exploded_extra += report["exploded"]
                self.rejected += report["rejected"]
                reasons.update(report["reasons"])
                types.update(report["types"])
                first = first or report["first"]
                if report["rejected"]:
                    self.rejects.append(lines)
                    self.reject_lines += report["rejected"]
                self.parts.append(Part(block, report["out"]))
            if counts["out"] == 0 and spec.limit != 0:
                raise RecipeError(
                    f"sources[{index}] (kind {spec.kind}, {spec.path or 'its default data'}): "
                    + (
                        f"all {counts['in']} rows were rejected, the first: {first[0]}: {first[1]}"
                        if counts["in"] and first
                        else "no rows"
                    )
                )
            self.by_source[label] += counts["out"]
        self.starts = np.cumsum([0] + [part.rows for part in self.parts[:-1]]).astype(np.int64)
        self.rows = sum(part.rows for part in self.parts)
        self.by_type = Counter(dict(types))
        self.steps.append(
            {
                "step": "validate",
                "in": self.rows_read + self.exploded_extra,
                "out": self.rows,
                "rejected": self.rejected,
                "rows_read": self.rows_read,
                "exploded_extra": self.exploded_extra,
                "reasons": dict(reasons.most_common()),
                "by_source": per_source,
                "by_type": {t: {"out": n} for t, n in sorted(types.items())},
                "seconds": self.lap(),
            }
        )
        self.by_source = +self.by_source
        self.say(
            f"engine ray, streaming: {len(self.parts)} blocks of up to {block_rows} rows read, {self.reducers} reducers"
        )

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

    def shuffle_firsts(self, kind: str) -> list[list[Any]]:
        """Each block's removals (every row but the first of its key), as (kept block, lines, report) per block.

        The blocks are keyed in waves of :meth:`wave_blocks`, in block order. Each wave's keys go to ``A``
        :class:`FirstSeen` actors by key (each holds its share of the keys seen so far and answers, per block, the
        rows whose key an earlier row holds), then each block drops its rows. Only two waves are in flight at once,
        so the objects alive (the driver's own memory: Ray's records of each) do not grow with the blocks.
        """
        import ray

        keyed = ray.remote(_keyed)
        drop = ray.remote(_drop)
        step, reason = {"exact": ("exact_dedup", "exact duplicate"), "id": ("duplicate_ids", "duplicate id")}[kind]
        out: list[list[Any]] = []
        before: list[Any] = []  # the wave before's drop reports
        with key_actors(FirstSeen, min(self.reducers, self.cpus())) as seen:
            n = len(seen)
            for blocks in self.waves():
                mapped = [
                    _refs(
                        keyed.options(num_returns=1 + n).remote(self.parts[b].ref, int(self.starts[b]), kind, n), 1 + n
                    )
                    for b in blocks
                ]
                for b, refs in zip(blocks, mapped, strict=True):
                    self.parts[b].ref = refs[0]
                answered = [
                    _refs(actor.add.options(num_returns=len(blocks)).remote(*[r[1 + a] for r in mapped]), len(blocks))
                    for a, actor in enumerate(seen)
                ]
                _done(before)  # the wave before this one is done before another is sent
                dropped = drop.options(num_returns=3)
                wave = [
                    _refs(dropped.remote(self.parts[b].ref, step, reason, *[a[j] for a in answered]), 3)
                    for j, b in enumerate(blocks)
                ]
                out += wave
                before = [refs[2] for refs in wave]
                del mapped, answered
            # once the last wave is done every actor has answered, and they can go (errors: in block order, by apply)
            _done(before)
        return out

    def waves(self) -> Iterator[range]:
        """The blocks in waves of :meth:`wave_blocks`, in block order. A waved step sends a wave only once the wave
        before it is done, so at most two are in flight and the objects alive do not grow with the blocks."""
        wave = self.wave_blocks()
        for first in range(0, len(self.parts), wave):
            yield range(first, min(first + wave, len(self.parts)))

    def cpus(self) -> int:
        import ray

        return max(1, int(ray.cluster_resources().get("CPU", 1)))

    def wave_blocks(self) -> int:
        """Blocks keyed at once in a shuffle: twice the cluster's CPUs, at least 4."""
        return max(4, 2 * self.cpus())

    # ----------------------------------------------------------------------------- exact dedup, unique ids

    def exact_dedup(self) -> None:
        import ray

        if not self.recipe.dedup.exact:  # the blocks still get their seqs
            keyed = ray.remote(_keyed)
            for part, start in zip(self.parts, self.starts.tolist(), strict=True):
                part.ref = keyed.options(num_returns=1).remote(part.ref, int(start), "none", 1)
            self.step("exact_dedup", [_no_removal()], skipped=True)
            return
        reports = self.apply(self.shuffle_firsts("exact"))
        self.step("exact_dedup", reports, label_conflicts=sum(r["conflicts"] for r in reports))

    def unique_ids(self) -> None:
        self.step("duplicate_ids", self.apply(self.shuffle_firsts("id")))

    # ----------------------------------------------------------------------------------------- near dedup

    def frequent_questions(self) -> Any:
        """The keys of the questions asked of more than CONTENT_ROWS of the rows now in the blocks (an object
        reference to a sorted (F,) uint64 array): those questions are instructions, every other one content.

        Counted in waves like :meth:`shuffle_firsts`: each wave's question keys go by key to :class:`KeyCounts`
        actors, which add them up, so the objects alive do not grow with the blocks."""
        import ray

        keyed = ray.remote(_question_keys)
        with key_actors(KeyCounts, min(self.reducers, self.cpus())) as counts:
            n = len(counts)
            added: list[Any] = []
            for blocks in self.waves():
                mapped = [_refs(keyed.options(num_returns=n).remote(self.parts[b].ref, n), n) for b in blocks]
                _done(added)  # the wave before this one is counted before another is sent
                added = [actor.add.remote(*[refs[a] for refs in mapped]) for a, actor in enumerate(counts)]
                del mapped
            found = ray.get([actor.frequent.remote() for actor in counts])
        return ray.put(np.unique(np.concatenate([np.zeros(0, dtype=np.uint64), *found])))

    def near_dedup(self) -> None:
        import ray

        near = self.recipe.dedup.near
        if not near.enabled or not self.rows:
            self.step("near_dedup", [_no_removal()], skipped=not near.enabled)
            return
        blocks, reducers = len(self.parts), self.reducers
        # verification groups: runs of consecutive blocks, one verification task each, so that rows travel
        # blocks x groups (not blocks x blocks) and a block's removal step reads one group's rows
        groups = min(reducers, blocks)
        group_of = ray.put(np.arange(blocks, dtype=np.int64) * groups // blocks)  # (blocks,)
        frequent = self.frequent_questions()
        sign = ray.remote(_sign_block)
        signed = [
            _refs(sign.options(num_returns=1 + reducers).remote(p.ref, frequent, near, reducers), 1 + reducers)
            for p in self.parts
        ]
        self.signed = [refs[0] for refs in signed]
        starts = ray.put(self.starts)
        bands = ray.remote(_band_pairs)
        paired = [
            _refs(
                bands.options(num_returns=groups + blocks).remote(starts, group_of, *[refs[1 + r] for refs in signed]),
                groups + blocks,
            )
            for r in range(reducers)
        ]
        del signed  # the band shares: freed once the reducers have read them
        pick = ray.remote(_pick)
        picked = [
            _refs(
                pick.options(num_returns=groups).remote(
                    p.ref, self.signed[c], groups, *[refs[groups + c] for refs in paired]
                ),
                groups,
            )
            for c, p in enumerate(self.parts)
        ]
        verify = ray.remote(_verify)
        verified = [
            _refs(
                verify.options(num_returns=2).remote(
                    near, reducers, *[refs[g] for refs in paired], *[refs[g] for refs in picked]
                ),
                2,
            )
            for g in range(groups)
        ]
        del paired, picked
        matches = np.concatenate([np.zeros((0, 3)), *ray.get([refs[0] for refs in verified])])
        # (m, 4): removed row, kept row, similarity, rank in near_pairs.jsonl (least similar first, then by row)
        table = np.zeros((0, 4))
        if len(matches):
            kept = kept_by(matches)
            table = np.concatenate([kept, np.zeros((len(kept), 1))], axis=1)
        del matches
        table[np.lexsort((table[:, 0], table[:, 2])), 3] = np.arange(len(table))
        # near_pairs.jsonl's lines go to as many ranges of ranks as reducers (blocks x reducers objects, not
        # blocks x (pairs / block_rows)); a task per range sorts them and hands the driver block_rows at a time
        ranges = reducers
        per_range = max(1, math.ceil(len(table) / ranges))
        bands_count = Counter(similarity_band(s) for s in table[:, 2].tolist())
        owner = np.searchsorted(self.starts, table[:, 0].astype(np.int64), side="right") - 1
        group_of_block = (np.arange(blocks, dtype=np.int64) * groups // blocks).tolist()
        drop = ray.remote(_near_drop)
        outputs = [
            _refs(
                drop.options(num_returns=3 + ranges).remote(
                    p.ref, table[owner == b], per_range, ranges, verified[group_of_block[b]][1]
                ),
                3 + ranges,
            )
            for b, p in enumerate(self.parts)
        ]
        del verified, table, owner
        self.near_ranges = [[refs[3 + k] for refs in outputs] for k in range(ranges)]
        reports = self.apply(outputs)
        self.step("near_dedup", reports, **near_step_details(near, bands_count))

    # ----------------------------------------------------------------------------------- decontamination

    def decontaminate(self) -> None:
        import ray

        recipe = self.recipe
        if not recipe.decontaminate_against:
            self.signed = None
            self.step("decontaminate", [_no_removal()], eval_files={})
            return
        index, files = eval_index(recipe)
        items, settings, near = index.items, recipe.decontamination, recipe.dedup.near
        reports: list[dict[str, Any]] = []
        if self.rows:
            frequent = self.frequent_questions()
            shared = ray.put(index)
            counts = None
            if index.short_edits:  # the rare-phrase check counts over all rows: the blocks' counts summed first
                count = ray.remote(_phrase_rows)
                counts = np.sum(
                    [
                        np.zeros(len(items), dtype=np.int64),
                        *ray.get([count.remote(shared, p.ref, frequent) for p in self.parts]),
                    ],
                    axis=0,
                )
            summed = ray.put(counts)
            match = ray.remote(_decontaminate)
            signed = self.signed or [None] * len(self.parts)
            sketch = near if settings.near else None
            outputs = [
                _refs(match.options(num_returns=3).remote(p.ref, s, frequent, shared, sketch, summed), 3)
                for p, s in zip(self.parts, signed, strict=True)
            ]
            reports = self.apply(outputs)
        self.signed = None  # the last step that reads the signatures: the object store may free them
        removed_per_file: Counter[str] = Counter()
        for r in reports:
            removed_per_file.update(r["files"])
        for file, info in files.items():
            info["rows_removed"] = removed_per_file[file]
        self.step("decontaminate", reports or [_no_removal()], **decontamination_details(recipe, index, files))

    # --------------------------------------------------------------------------------------- cap per task

    def cap_per_task(self) -> None:
        import ray

        caps = self.recipe.cap_per_task
        tasks = self.task_counts()
        if isinstance(caps, dict):
            unknown = sorted(set(caps) - set(tasks))
            if unknown:
                raise RecipeError(f"cap_per_task names task(s) {unknown} that have no records")
        cap_of = {
            task: cap
            for task, n in tasks.items()
            if (cap := caps if isinstance(caps, int) else (caps or {}).get(task)) is not None and n > cap
        }
        reports = [_no_removal()]
        if cap_of:
            seed = self.recipe.split.seed
            rank = ray.remote(_cap_ranks)
            lowest: dict[str, tuple[np.ndarray, np.ndarray]] = {}
            for found in ray.get([rank.remote(p.ref, cap_of, seed) for p in self.parts]):
                for task, (u, seqs) in found.items():
                    if task in lowest:
                        u, seqs = np.concatenate([lowest[task][0], u]), np.concatenate([lowest[task][1], seqs])
                    order = np.lexsort((seqs, u))[: cap_of[task]]
                    lowest[task] = (u[order], seqs[order])
            last = {task: (float(u[-1]), int(seqs[-1])) for task, (u, seqs) in lowest.items()}  # the cap-th kept
            del lowest
            drop = ray.remote(_drop_over_cap)
            reports = self.apply(
                [_refs(drop.options(num_returns=3).remote(p.ref, last, cap_of, seed), 3) for p in self.parts]
            )
        before = Counter(tasks)
        self.step("cap_per_task", reports, cap=caps, by_task={})
        removed_tasks: Counter[str] = Counter()
        for r in reports:
            removed_tasks.update(r["tasks"])
        after = before - removed_tasks
        self.steps[-1]["by_task"] = {k: {"in": before[k], "out": after[k]} for k in sorted(before)}
        self.by_task = after

    def task_counts(self) -> Counter[str]:
        import ray

        count = ray.remote(_tasks)
        tasks: Counter[str] = Counter()
        for found in ray.get([count.remote(p.ref) for p in self.parts]):
            tasks.update(found)
        self.by_task = tasks
        return tasks

    # ------------------------------------------------------------------------------ split, augment, render

    def split_and_augment(self) -> None:
        import ray

        from mydecide.data.split_augment import empty_by_recipe

        cfg = self.recipe.split
        if self.recipe.augment.absent_span_labels:  # before the split, as locally: the first clash in row order
            check = ray.remote(_check_absent_labels)
            for ref in [check.remote(p.ref, self.recipe) for p in self.parts]:
                ray.get(ref)
        tasks = set(self.by_task)
        missing = [t for t in cfg.heldout_tasks if t not in tasks]
        if missing:
            raise RecipeError(f"split.heldout_tasks: no records for task(s) {missing}; the tasks are {sorted(tasks)}")
        render = ray.remote(_split_render)
        outputs = [
            _refs(render.options(num_returns=1 + len(SPLITS)).remote(p.ref, self.recipe), 1 + len(SPLITS))
            for p in self.parts
        ]
        self.parts = []  # the rows are in the rendered lines now
        counts: Counter[str] = Counter()
        by_task: dict[str, Counter[str]] = {name: Counter() for name in SPLITS}
        added: Counter[str] = Counter()
        softened = 0
        self.splits_out = {name: [] for name in SPLITS}
        self.split_stats = {name: {} for name in SPLITS}
        for refs in outputs:
            report = ray.get(refs[0])
            counts.update(report["splits"])
            for name in SPLITS:
                by_task[name].update(report["by_task"][name])
                if report["rendered"][name]:
                    self.splits_out[name].append(refs[1 + SPLITS.index(name)])
                for key, counter in report["stats"][name].items():
                    self.split_stats[name].setdefault(key, Counter()).update(counter)
            added.update(report["added"])
            softened += report["soft_targets"]
        ledger = Ledger(steps=self.steps)
        splits = {name: range(counts[name]) for name in SPLITS}
        empty = empty_by_recipe(splits, range(self.rows), self.recipe, ledger)
        self.steps.append(
            {
                "step": "split",
                "in": self.rows,
                "out": self.rows,
                "removed": 0,
                "splits": {name: counts[name] for name in SPLITS},
                "empty_by_recipe": empty,
                "by_task": {name: dict(sorted(by_task[name].items())) for name in SPLITS},
                "seconds": self.lap(),
            }
        )
        from mydecide.data import augment as augmenting

        train = counts["train"]
        self.augmented = sum(added.values())
        self.split_rows = {name: counts[name] for name in SPLITS}
        self.split_rows["train"] += self.augmented
        self.steps.append(
            {
                "step": "augment",
                "in": train,
                "out": train + self.augmented,
                "removed": 0,
                "added": {kind: added[kind] for kind in augmenting.AUGMENTATIONS},
                "soft_targets": softened,
                "share": {kind: round(added[kind] / train, 4) if train else 0.0 for kind in augmenting.AUGMENTATIONS},
                "seconds": self.lap(),
            }
        )

    # ---------------------------------------------------------------------------------- manifest and files

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

    def write(self, out: Path, manifest: dict[str, Any]) -> None:
        """Every file into a staging directory that replaces ``out`` whole (``outputs.write_outputs``'s swap).

        The files are written by Ray tasks on the driver's own node (the staging directory is there, so no storage
        shared between nodes is needed), one task per file set, each holding one block's lines at a time: the
        driver only gets each file's row count and hash back, never the rows (its memory stays flat as rows
        grow). Connected through Ray Client (``ray://``) the driver is not a node, and writes them itself."""
        import ray
        from ray.util.client import ray as client
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from mydecide.config import dump_recipe

        recipe = self.recipe
        check_output_dir(out, recipe)
        mode = 0o666 & ~_umask()
        written = ["train", "dev", "heldout"] + (["test"] if recipe.split.test_fraction > 0 else [])
        with staged_directory(out, {*OUTPUT_FILES, *earlier_outputs(out)}) as staging:
            jobs: list[tuple[Callable[..., dict[str, dict[str, Any]]], tuple[Any, ...]]] = [
                (_write_split, (str(staging), name, recipe, self.split_rows[name], [self.splits_out[name]], mode))
                for name in written
            ]
            jobs.append((_write_rejects, (str(staging), [self.rejects], mode)))
            jobs.append((_write_near_pairs, (str(staging), recipe.ray.block_rows, self.near_ranges, mode)))
            table: dict[str, dict[str, Any]] = {}
            if client.is_connected():
                for function, args in jobs:
                    table.update(function(*args))
            else:
                here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
                # num_cpus 0: a head node started with no CPUs for tasks still runs them
                refs = [
                    ray.remote(function).options(num_cpus=0, scheduling_strategy=here).remote(*args)
                    for function, args in jobs
                ]
                for entries in ray.get(refs):
                    table.update(entries)
            atomic_write_text(staging / "recipe.yaml", dump_recipe(recipe))
            table["recipe.yaml"] = Writer.of_file(staging / "recipe.yaml")
            manifest["outputs"] = table  # in the local path's order: the splits, rejects, near pairs, recipe
            atomic_write_json(staging / MANIFEST, manifest)


# ------------------------------------------------------------------------------------ writing (on the workers)


def _write_split(
    out: str, name: str, recipe: DataRecipe, rows: int, refs: list[list[Any]], mode: int
) -> dict[str, dict[str, Any]]:
    """One split, as ``outputs.write_split`` lays it out: ``train.jsonl``, or parts of ``rows_per_file``;
    ``refs`` (wrapped in a list, so Ray passes the references, not the objects) are its lines per block."""
    output = recipe.output
    folder = Path(out)
    chunks = _fetched(refs[0])
    if output.format == "jsonl" and output.rows_per_file is None:
        with Writer(folder / SPLIT_FILES[name], mode) as whole:
            for chunk in chunks:
                whole.write(chunk)
        return {SPLIT_FILES[name]: whole.entry()}
    folder = folder / split_dir(name)
    folder.mkdir(parents=True, exist_ok=True)
    size = output.rows_per_file or max(1, rows)
    table: dict[str, dict[str, Any]] = {}
    for k, lines in enumerate(_parts(chunks, size)):
        part = f"part-{k:05d}.{output.format}"
        if output.format == "jsonl":
            with Writer(folder / part, mode) as writer:
                writer.write(b"".join(lines))
            table[f"{folder.name}/{part}"] = writer.entry()
        else:
            write_parquet(folder / part, [json.loads(line) for line in lines])
            table[f"{folder.name}/{part}"] = Writer.of_file(folder / part, rows=len(lines))
    return table


def _write_rejects(out: str, refs: list[list[Any]], mode: int) -> dict[str, dict[str, Any]]:
    """rejects.jsonl from its lines per block and step, in order."""
    with Writer(Path(out) / "rejects.jsonl", mode) as rejects:
        for chunk in _fetched(refs[0]):
            rejects.write(chunk)
    return {"rejects.jsonl": rejects.entry()}


def _write_near_pairs(out: str, per_chunk: int, ranges: list[list[Any]], mode: int) -> dict[str, dict[str, Any]]:
    """near_pairs.jsonl, one range of ranks at a time: every block's (rank, line) of the range, sorted."""
    import ray

    with Writer(Path(out) / "near_pairs.jsonl", mode) as pairs:
        for refs in ranges:
            for chunk in _sorted_lines(per_chunk, *ray.get(refs)):
                pairs.write(chunk)
    return {"near_pairs.jsonl": pairs.entry()}


class Writer:
    """A file written through a temporary name, counting its lines and hashing it as it goes; given ``mode`` (the
    driver's: a writer task's process may have another umask)."""

    def __init__(self, path: Path, mode: int):
        self.path = path
        self.mode = mode
        self.temporary = path.with_name(f".{path.name}.tmp")
        self.digest = hashlib.sha256()
        self.lines = 0

    def __enter__(self) -> Writer:
        self.handle = open(self.temporary, "wb")  # closed in __exit__
        return self

    def write(self, data: bytes) -> None:
        self.handle.write(data)
        self.digest.update(data)
        self.lines += data.count(b"\n")

    def __exit__(self, kind: Any, *_: Any) -> None:
        self.handle.close()
        if kind is None:
            os.chmod(self.temporary, self.mode)
            os.replace(self.temporary, self.path)

    def entry(self) -> dict[str, Any]:
        return {"rows": self.lines, "sha256": self.digest.hexdigest()}

    @staticmethod
    def of_file(path: Path, rows: int | None = None) -> dict[str, Any]:
        from mydecide.io import sha256_file

        return {"rows": rows, "sha256": sha256_file(path)}


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _fetched(refs: list[Any]) -> Iterator[Any]:
    """The objects behind ``refs``, one at a time (the previous one is released before the next is fetched)."""
    import ray

    for ref in refs:
        yield ray.get(ref)


def _parts(chunks: Iterator[bytes], size: int) -> Iterator[list[bytes]]:
    """The lines of the chunks in parts of ``size`` (one empty part when there is no line)."""
    part: list[bytes] = []
    emitted = False
    for chunk in chunks:
        for line in chunk.split(b"\n")[:-1]:
            part.append(line + b"\n")
            if len(part) == size:
                yield part
                part, emitted = [], True
    if part or not emitted:
        yield part


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


@contextmanager
def key_actors(actor: type, count: int) -> Iterator[list[Any]]:
    """``count`` Ray actors of class ``actor`` for a waved shuffle (one per CPU of the cluster, up to
    ``ray.partitions``; no CPU reserved: they hold keys, the tasks do the work), killed when the step ends or
    fails."""
    import ray

    actors: list[Any] = [ray.remote(actor).options(num_cpus=0).remote() for _ in range(count)]
    try:
        yield actors
    finally:
        for handle in actors:
            ray.kill(handle)


def _done(refs: list[Any]) -> None:
    """Wait until every task behind ``refs`` has finished, without fetching their results (errors are raised where
    the results are read)."""
    if refs:
        import ray

        ray.wait(refs, num_returns=len(refs), fetch_local=False)


def _refs(refs: Any, n: int) -> list[Any]:
    """A task's references as a list (Ray returns one reference, not a list, for ``num_returns=1``)."""
    return [refs] if n == 1 else list(refs)


def _no_removal() -> dict[str, Any]:
    return {"removed": 0, "reasons": {}, "sources": {}, "types": {}, "tasks": {}}


# ------------------------------------------------------------------------------ what runs on the Ray workers


def _read(spec: SourceSpec, index: int, label: str, block_rows: int) -> Iterator[Any]:
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


def _keyed(block: Any, start: int, kind: str, reducers: int) -> tuple[Any, ...]:
    """The block with its seqs, then one share per reducer of its (keys, seqs, target hashes, refs): ``exact``
    keys are the exact-dedup digests (with the target, to count label conflicts), ``id`` keys the ids'."""
    rows, seqs = _block(block, start)
    if kind == "none":
        return (rows, seqs)
    if kind == "exact":
        keys = _digests([exact_key(row.record) for row in rows])
        targets = np.array([_hash64(repr(row.record.target)) for row in rows], dtype=np.uint64)
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


def _drop(block: Block, step: str, reason: str, *shares: tuple[np.ndarray, list[Any], np.ndarray]) -> tuple[Any, ...]:
    removals: dict[int, tuple[str, dict[str, Any] | None]] = {}
    conflicts = 0
    for seqs, matched, conflict in shares:
        for seq, ref in zip(seqs.tolist(), matched, strict=True):
            removals[seq] = (reason, ref)
        conflicts += int(conflict.sum())
    kept, lines, report = _remove(block, step, removals)
    report["conflicts"] = conflicts
    return kept, lines, report


def _remove(block: Block, step: str, removals: dict[int, tuple[str, dict[str, Any] | None]]) -> tuple[Any, ...]:
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


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


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
            key = forms[kind, text] = _hash64(f"{kind}\x1f{form}") if form else 0
        keys[k] = key
    return questions, keys


def _question_keys(block: Block, reducers: int) -> tuple[Any, ...]:
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


def _decisions(rows: list[Row], frequent: np.ndarray) -> Decisions:
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
            found = ids[group] = _hash64("\x1f".join(group))
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


def _sign_block(block: Block, frequent: np.ndarray, near: NearDedupConfig, reducers: int) -> tuple[Any, ...]:
    """The block's signatures, then one share per reducer of its (band key, seq) tuples."""
    rows, seqs = block
    found = _decisions(rows, frequent)
    signed = _sign(found.texts, found.groups, 0, near, reducers)
    shares = [(keys, seqs[members]) for keys, members in signed[1:]]
    return (Signed(seqs, signed[0], found), *shares)


def _band_pairs(starts: np.ndarray, group_of: np.ndarray, *shares: tuple[np.ndarray, np.ndarray]) -> tuple[Any, ...]:
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


def _pick(block: Block, signed: Signed, groups: int, *requests: np.ndarray) -> tuple[Any, ...]:
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


def _verify(near: NearDedupConfig, reducers: int, *shares: Any) -> tuple[np.ndarray, tuple[np.ndarray, list[Row]]]:
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


def _near_drop(
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
    kept, lines, report = _remove(block, "near_dedup", removals)
    rank = {int(i): int(r) for i, _, _, r in removed.tolist()}
    shares: list[list[tuple[int, bytes]]] = [[] for _ in range(ranges)]
    for i, pair in zip(
        sorted(matches, key=lambda i: (matches[i].similarity, i)), near_pairs(by_seq, matches), strict=True
    ):
        shares[rank[i] // per_range].append((rank[i], (json_line(pair) + "\n").encode("utf-8")))
    return (kept, lines, report, *shares)


def _sorted_lines(per_chunk: int, *shares: list[tuple[int, bytes]]) -> Iterator[bytes]:
    """One range of near_pairs.jsonl: its (rank, line) from every block, in rank order, ``per_chunk`` lines at a
    time."""
    lines = sorted(line for share in shares for line in share)
    for a in range(0, len(lines), per_chunk):
        yield b"".join(line for _rank, line in lines[a : a + per_chunk])


def _phrase_rows(index: EvalIndex, block: Block, frequent: np.ndarray) -> np.ndarray:
    return index.phrase_rows(words(_decisions(block[0], frequent).texts))


def _decontaminate(
    block: Block,
    signed: Signed | None,
    frequent: np.ndarray,
    index: EvalIndex,
    near: NearDedupConfig | None,
    phrase_rows: np.ndarray | None,
) -> tuple[Any, ...]:
    """The block without the rows that overlap an eval item, their reject lines and the counts."""
    rows, seqs = block
    texts = _decisions(rows, frequent).texts
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
    kept, lines, report = _remove(block, "decontaminate", removals)
    report["files"] = Counter(hit.file for hit in found if hit is not None)
    return kept, lines, report


def _check_absent_labels(block: Block, recipe: DataRecipe) -> None:
    from mydecide.data.split_augment import check_absent_labels

    check_absent_labels(block[0], recipe)


def _tasks(block: Block) -> Counter[str]:
    return Counter(row.record.task for row in block[0])


def _cap_ranks(block: Block, cap_of: dict[str, int], seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
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


def _drop_over_cap(
    block: Block, last: dict[str, tuple[float, int]], cap_of: dict[str, int], seed: int
) -> tuple[Any, ...]:
    removals: dict[int, tuple[str, dict[str, Any] | None]] = {}
    for row, seq in zip(block[0], block[1].tolist(), strict=True):
        task = row.record.task
        if task in cap_of:
            u = splitting.unit_interval(f"{task}\x1f{splitting.split_key(row.record)}", seed)
            if (u, seq) > last[task]:
                removals[seq] = ("over the task cap", {"cap": cap_of[task]})
    return _remove(block, "cap_per_task", removals)


def _split_render(block: Block, recipe: DataRecipe) -> tuple[Any, ...]:
    """The block split (held-out tasks whole, the rest by the state hash), train augmented, every split's lines
    (bytes) and the counts the split and augment steps and the manifest need."""
    from mydecide.data.split_augment import augment_train

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
