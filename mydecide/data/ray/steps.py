"""The steps of a ``prepare`` run on Ray that the driver sends block by block: read and validate, exact dedup,
duplicate ids, the cap per task, and split, augment and render (near dedup and decontamination:
:mod:`mydecide.data.ray.near_steps`). Each step sends Ray tasks (:mod:`mydecide.data.ray.tasks`) over the run's
blocks and counts their reports into the run's account (:class:`~mydecide.data.ray.stream.Stream`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np

from mydecide.data import augment as augmenting
from mydecide.data.inputs import source_labels
from mydecide.data.ledger import Ledger
from mydecide.data.ray.engine import as_list, key_actors, wait_done
from mydecide.data.ray.stream import Part, Stream, no_removal
from mydecide.data.ray.tasks import (
    FirstSeen,
    cap_ranks,
    check_labels,
    count_tasks,
    drop_over_cap,
    drop_repeated,
    keyed,
    read_source,
    split_render,
)
from mydecide.data.split import SPLITS
from mydecide.data.split_augment import empty_by_recipe
from mydecide.jsonl import not_utf8_hint
from mydecide.recipe_parsing import RecipeError


def read(run: Stream) -> None:
    import ray

    specs = run.recipe.sources
    labels = source_labels(specs)
    block_rows = run.recipe.ray.block_rows
    reader = ray.remote(read_source).options(num_returns="streaming")
    streams = [
        reader.remote(spec, index, label, block_rows)
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
            run.rows_read += report["in"]
            run.exploded_extra += report["exploded"]
            run.rejected += report["rejected"]
            reasons.update(report["reasons"])
            types.update(report["types"])
            first = first or report["first"]
            if report["rejected"]:
                run.rejects.append(lines)
                run.reject_lines += report["rejected"]
            run.parts.append(Part(block, report["out"]))
        if counts["out"] == 0 and spec.limit != 0:
            raise RecipeError(
                f"sources[{index}] (kind {spec.kind}, {spec.path or 'its default data'}): "
                + (
                    f"all {counts['in']} rows were rejected, the first: {first[0]}: {first[1]}{not_utf8_hint(first[1])}"
                    if counts["in"] and first
                    else "no rows"
                )
            )
        run.by_source[label] += counts["out"]
    run.starts = np.cumsum([0] + [part.rows for part in run.parts[:-1]]).astype(np.int64)
    run.rows = sum(part.rows for part in run.parts)
    run.by_type = Counter(dict(types))
    run.steps.append(
        {
            "step": "validate",
            "in": run.rows_read + run.exploded_extra,
            "out": run.rows,
            "rejected": run.rejected,
            "rows_read": run.rows_read,
            "exploded_extra": run.exploded_extra,
            "reasons": dict(reasons.most_common()),
            "by_source": per_source,
            "by_type": {t: {"out": n} for t, n in sorted(types.items())},
            "seconds": run.lap(),
        }
    )
    run.by_source = +run.by_source
    run.say(f"engine ray: {len(run.parts)} blocks of up to {block_rows} rows read, {run.reducers} reducers")


def shuffle_firsts(run: Stream, kind: str) -> list[list[Any]]:
    """Each block's removals (every row but the first of its key), as (kept block, lines, report) per block.

    The blocks are keyed in waves of :meth:`Stream.wave_blocks`, in block order. Each wave's keys go to ``A``
    :class:`FirstSeen` actors by key (each holds its share of the keys seen so far and answers, per block, the
    rows whose key an earlier row holds), then each block drops its rows. Only two waves are in flight at once,
    so the objects alive (the driver's own memory: Ray's records of each) do not grow with the blocks.
    """
    import ray

    key = ray.remote(keyed)
    drop = ray.remote(drop_repeated)
    step, reason = {"exact": ("exact_dedup", "exact duplicate"), "id": ("duplicate_ids", "duplicate id")}[kind]
    out: list[list[Any]] = []
    before: list[Any] = []  # the wave before's drop reports
    with key_actors(FirstSeen, min(run.reducers, run.cpus())) as seen:
        n = len(seen)
        for blocks in run.waves():
            mapped = [
                as_list(key.options(num_returns=1 + n).remote(run.parts[b].ref, int(run.starts[b]), kind, n), 1 + n)
                for b in blocks
            ]
            for b, refs in zip(blocks, mapped, strict=True):
                run.parts[b].ref = refs[0]
            answered = [
                as_list(actor.add.options(num_returns=len(blocks)).remote(*[r[1 + a] for r in mapped]), len(blocks))
                for a, actor in enumerate(seen)
            ]
            wait_done(before)  # the wave before this one is done before another is sent
            dropped = drop.options(num_returns=3)
            wave = [
                as_list(dropped.remote(run.parts[b].ref, step, reason, *[a[j] for a in answered]), 3)
                for j, b in enumerate(blocks)
            ]
            out += wave
            before = [refs[2] for refs in wave]
            del mapped, answered
        # once the last wave is done every actor has answered, and they can go (errors: in block order, by apply)
        wait_done(before)
    return out


def exact_dedup(run: Stream) -> None:
    import ray

    if not run.recipe.dedup.exact:  # the blocks still get their seqs
        key = ray.remote(keyed)
        for part, start in zip(run.parts, run.starts.tolist(), strict=True):
            part.ref = key.options(num_returns=1).remote(part.ref, int(start), "none", 1)
        run.step("exact_dedup", [no_removal()], skipped=True)
        return
    reports = run.apply(shuffle_firsts(run, "exact"))
    run.step("exact_dedup", reports, label_conflicts=sum(r["conflicts"] for r in reports))


def unique_ids(run: Stream) -> None:
    run.step("duplicate_ids", run.apply(shuffle_firsts(run, "id")))


def cap_per_task(run: Stream) -> None:
    import ray

    caps = run.recipe.cap_per_task
    tasks = task_counts(run)
    if isinstance(caps, dict):
        unknown = sorted(set(caps) - set(tasks))
        if unknown:
            raise RecipeError(f"cap_per_task names task(s) {unknown} that have no records")
    cap_of = {
        task: cap
        for task, n in tasks.items()
        if (cap := caps if isinstance(caps, int) else (caps or {}).get(task)) is not None and n > cap
    }
    reports = [no_removal()]
    if cap_of:
        seed = run.recipe.split.seed
        rank = ray.remote(cap_ranks)
        lowest: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for found in ray.get([rank.remote(p.ref, cap_of, seed) for p in run.parts]):
            for task, (u, seqs) in found.items():
                if task in lowest:
                    u, seqs = np.concatenate([lowest[task][0], u]), np.concatenate([lowest[task][1], seqs])
                order = np.lexsort((seqs, u))[: cap_of[task]]
                lowest[task] = (u[order], seqs[order])
        last = {task: (float(u[-1]), int(seqs[-1])) for task, (u, seqs) in lowest.items()}  # the cap-th kept
        del lowest
        drop = ray.remote(drop_over_cap)
        reports = run.apply(
            [as_list(drop.options(num_returns=3).remote(p.ref, last, cap_of, seed), 3) for p in run.parts]
        )
    before = Counter(tasks)
    run.step("cap_per_task", reports, cap=caps, by_task={})
    removed_tasks: Counter[str] = Counter()
    for r in reports:
        removed_tasks.update(r["tasks"])
    after = before - removed_tasks
    run.steps[-1]["by_task"] = {k: {"in": before[k], "out": after[k]} for k in sorted(before)}
    run.by_task = after


def task_counts(run: Stream) -> Counter[str]:
    import ray

    count = ray.remote(count_tasks)
    tasks: Counter[str] = Counter()
    for found in ray.get([count.remote(p.ref) for p in run.parts]):
        tasks.update(found)
    run.by_task = tasks
    return tasks


def split_and_augment(run: Stream) -> None:
    import ray

    cfg = run.recipe.split
    if run.recipe.augment.absent_span_labels:  # before the split, as locally: the first clash in row order
        check = ray.remote(check_labels)
        for ref in [check.remote(p.ref, run.recipe) for p in run.parts]:
            ray.get(ref)
    tasks = set(run.by_task)
    missing = [t for t in cfg.heldout_tasks if t not in tasks]
    if missing:
        raise RecipeError(f"split.heldout_tasks: no records for task(s) {missing}; the tasks are {sorted(tasks)}")
    render = ray.remote(split_render)
    outputs = [
        as_list(render.options(num_returns=1 + len(SPLITS)).remote(p.ref, run.recipe), 1 + len(SPLITS))
        for p in run.parts
    ]
    run.parts = []  # the rows are in the rendered lines now
    counts: Counter[str] = Counter()
    by_task: dict[str, Counter[str]] = {name: Counter() for name in SPLITS}
    added: Counter[str] = Counter()
    softened = 0
    run.splits_out = {name: [] for name in SPLITS}
    run.split_stats = {name: {} for name in SPLITS}
    for refs in outputs:
        report = ray.get(refs[0])
        counts.update(report["splits"])
        for name in SPLITS:
            by_task[name].update(report["by_task"][name])
            if report["rendered"][name]:
                run.splits_out[name].append(refs[1 + SPLITS.index(name)])
            for key, counter in report["stats"][name].items():
                run.split_stats[name].setdefault(key, Counter()).update(counter)
        added.update(report["added"])
        softened += report["soft_targets"]
    ledger = Ledger(steps=run.steps)
    splits = {name: range(counts[name]) for name in SPLITS}
    empty = empty_by_recipe(splits, range(run.rows), run.recipe, ledger)
    run.steps.append(
        {
            "step": "split",
            "in": run.rows,
            "out": run.rows,
            "removed": 0,
            "splits": {name: counts[name] for name in SPLITS},
            "empty_by_recipe": empty,
            "by_task": {name: dict(sorted(by_task[name].items())) for name in SPLITS},
            "seconds": run.lap(),
        }
    )
    train = counts["train"]
    run.augmented = sum(added.values())
    run.split_rows = {name: counts[name] for name in SPLITS}
    run.split_rows["train"] += run.augmented
    run.steps.append(
        {
            "step": "augment",
            "in": train,
            "out": train + run.augmented,
            "removed": 0,
            "added": {kind: added[kind] for kind in augmenting.AUGMENTATIONS},
            "soft_targets": softened,
            "share": {kind: round(added[kind] / train, 4) if train else 0.0 for kind in augmenting.AUGMENTATIONS},
            "seconds": run.lap(),
        }
    )
