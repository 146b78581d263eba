"""The two heavy steps of a ``prepare`` run on Ray: near dedup and decontamination, sent block by block by the
driver (their worker halves: :mod:`mydecide.data.ray.near_tasks`). Near dedup's keep rule is order-dependent (a row
goes only for an earlier row that is itself kept), so it runs here, in the driver, on the verified pairs as arrays
(:func:`kept_by`)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np

from mydecide.data.filtering import decontamination_details, eval_index, near_step_details, similarity_band
from mydecide.data.ray.engine import as_list, key_actors, wait_done
from mydecide.data.ray.near_tasks import (
    KeyCounts,
    band_pairs,
    count_phrase_rows,
    drop_contaminated,
    drop_near,
    pick_rows,
    question_keys,
    sign_block,
    verify_group,
)
from mydecide.data.ray.stream import Stream, no_removal


def frequent_questions(run: Stream) -> Any:
    """The keys of the questions asked of more than CONTENT_ROWS of the rows now in the blocks (an object
    reference to a sorted (F,) uint64 array): those questions are instructions, every other one content.

    Counted in waves like :func:`~mydecide.data.ray.steps.shuffle_firsts`: each wave's question keys go by key to
    :class:`KeyCounts` actors, which add them up, so the objects alive do not grow with the blocks."""
    import ray

    keyed = ray.remote(question_keys)
    with key_actors(KeyCounts, min(run.reducers, run.cpus())) as counts:
        n = len(counts)
        added: list[Any] = []
        for blocks in run.waves():
            mapped = [as_list(keyed.options(num_returns=n).remote(run.parts[b].ref, n), n) for b in blocks]
            wait_done(added)  # the wave before this one is counted before another is sent
            added = [actor.add.remote(*[refs[a] for refs in mapped]) for a, actor in enumerate(counts)]
            del mapped
        found = ray.get([actor.frequent.remote() for actor in counts])
    return ray.put(np.unique(np.concatenate([np.zeros(0, dtype=np.uint64), *found])))


def near_dedup(run: Stream) -> None:
    import ray

    near = run.recipe.dedup.near
    if not near.enabled or not run.rows:
        run.step("near_dedup", [no_removal()], skipped=not near.enabled)
        return
    blocks, reducers = len(run.parts), run.reducers
    # verification groups: runs of consecutive blocks, one verification task each, so that rows travel
    # blocks x groups (not blocks x blocks) and a block's removal step reads one group's rows
    groups = min(reducers, blocks)
    group_of = ray.put(np.arange(blocks, dtype=np.int64) * groups // blocks)  # (blocks,)
    frequent = frequent_questions(run)
    sign = ray.remote(sign_block)
    signed = [
        as_list(sign.options(num_returns=1 + reducers).remote(p.ref, frequent, near, reducers), 1 + reducers)
        for p in run.parts
    ]
    run.signed = [refs[0] for refs in signed]
    starts = ray.put(run.starts)
    bands = ray.remote(band_pairs)
    paired = [
        as_list(
            bands.options(num_returns=groups + blocks).remote(starts, group_of, *[refs[1 + r] for refs in signed]),
            groups + blocks,
        )
        for r in range(reducers)
    ]
    del signed  # the band shares: freed once the reducers have read them
    pick = ray.remote(pick_rows)
    picked = [
        as_list(
            pick.options(num_returns=groups).remote(
                p.ref, run.signed[c], groups, *[refs[groups + c] for refs in paired]
            ),
            groups,
        )
        for c, p in enumerate(run.parts)
    ]
    verify = ray.remote(verify_group)
    verified = [
        as_list(
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
    owner = np.searchsorted(run.starts, table[:, 0].astype(np.int64), side="right") - 1
    group_of_block = (np.arange(blocks, dtype=np.int64) * groups // blocks).tolist()
    drop = ray.remote(drop_near)
    outputs = [
        as_list(
            drop.options(num_returns=3 + ranges).remote(
                p.ref, table[owner == b], per_range, ranges, verified[group_of_block[b]][1]
            ),
            3 + ranges,
        )
        for b, p in enumerate(run.parts)
    ]
    del verified, table, owner
    run.near_ranges = [[refs[3 + k] for refs in outputs] for k in range(ranges)]
    reports = run.apply(outputs)
    run.step("near_dedup", reports, **near_step_details(near, bands_count))


def kept_by(matches: np.ndarray) -> np.ndarray:
    """(k, 3) float64 (removed row, kept row, similarity), ascending by removed row, from verified (m, 3) (row,
    earlier row, similarity) pairs, visiting rows in order: a row is removed by the most similar earlier row that
    is still kept (the first of the most similar on ties), the rule of
    :func:`~mydecide.data.near_dedup.near_duplicates_of`. Arrays only (no object per pair): the driver
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


def decontaminate(run: Stream) -> None:
    import ray

    recipe = run.recipe
    if not recipe.decontaminate_against:
        run.signed = None
        run.step("decontaminate", [no_removal()], eval_files={})
        return
    index, files = eval_index(recipe)
    items, settings, near = index.items, recipe.decontamination, recipe.dedup.near
    reports: list[dict[str, Any]] = []
    if run.rows:
        frequent = frequent_questions(run)
        shared = ray.put(index)
        counts = None
        if index.short_edits:  # the rare-phrase check counts over all rows: the blocks' counts summed first
            count = ray.remote(count_phrase_rows)
            counts = np.sum(
                [
                    np.zeros(len(items), dtype=np.int64),
                    *ray.get([count.remote(shared, p.ref, frequent) for p in run.parts]),
                ],
                axis=0,
            )
        summed = ray.put(counts)
        match = ray.remote(drop_contaminated)
        signed = run.signed or [None] * len(run.parts)
        sketch = near if settings.near else None
        outputs = [
            as_list(match.options(num_returns=3).remote(p.ref, s, frequent, shared, sketch, summed), 3)
            for p, s in zip(run.parts, signed, strict=True)
        ]
        reports = run.apply(outputs)
    run.signed = None  # the last step that reads the signatures: the object store may free them
    removed_per_file: Counter[str] = Counter()
    for r in reports:
        removed_per_file.update(r["files"])
    for file, info in files.items():
        info["rows_removed"] = removed_per_file[file]
    run.step("decontaminate", reports or [no_removal()], **decontamination_details(recipe, index, files))
