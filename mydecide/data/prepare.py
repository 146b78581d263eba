"""The ``prepare`` pipeline: sources → validated, deduplicated, decontaminated, split, augmented JSONL.

:func:`prepare` reads as the table of contents: convert → validate → exact dedup → unique ids → near dedup →
decontaminate → cap per task → split → augment → write. Every step counts rows in and out (per source and per
question type) and says why each removed row left; each removed or rejected row goes to ``rejects.jsonl`` with its
step, its reason, its source location and (for duplicates and contamination) the row or eval item it matched.
Before anything is written the conservation law is checked: input rows = kept + rejected + removed, exactly.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from mydecide.config import DataRecipe, SourceSpec, SplitConfig
from mydecide.data import augment as augmenting
from mydecide.data import split
from mydecide.data.decontaminate import Contamination, EvalIndex, EvalItem, question_of, read_eval_jsonl
from mydecide.data.dedup import exact_duplicates, exact_key, state_text
from mydecide.data.ledger import (
    Ledger,
    Row,
    decision_sketches,
    decision_words,
    decisions,
    in_out,
    progress_bar,
    reason_pattern,
    release,
    shingling,
    short_reasons,
)
from mydecide.data.near_dedup import NearMatch, near_duplicates_of
from mydecide.data.outputs import build_manifest, check_conservation, check_output_dir, write_outputs
from mydecide.data.sources import UnknownSourceError, load_source
from mydecide.io import directory_lock
from mydecide.recipe_parsing import RecipeError
from mydecide.records import RecordError, parse_record

Log = Callable[[str], None]


class Engine(Protocol):
    """Where the two heavy steps run: :class:`LocalEngine` in this process, or ``distributed.RayEngine`` on a Ray
    cluster. Both give the same answer; every other step, and all the counting, is the pipeline's own."""

    def near_matches(self, rows: list[Row], recipe: DataRecipe, bar: Any) -> dict[int, NearMatch]:
        """``{removed index: NearMatch}``: near_dedup's keep rule over the rows (``bar.update(n)``: progress)."""
        ...

    def contamination(
        self, rows: list[Row], index: EvalIndex, recipe: DataRecipe, bar: Any
    ) -> list[Contamination | None]:
        """The first eval overlap of each row, or None."""
        ...


class LocalEngine:
    """The heavy steps in this process (numpy shingles and MinHash, datasketch's LSH)."""

    def near_matches(self, rows: list[Row], recipe: DataRecipe, bar: Any) -> dict[int, NearMatch]:
        near = recipe.dedup.near
        found = decisions(rows)
        return near_duplicates_of(
            decision_sketches(rows, found, recipe.dedup.near),
            threshold=near.threshold,
            progress=bar.update,
            shingling=shingling(near),
            keep_slot_changes=near.keep_slot_changes,
            decisions=found,
        )

    def contamination(
        self, rows: list[Row], index: EvalIndex, recipe: DataRecipe, bar: Any
    ) -> list[Contamination | None]:
        found = decisions(rows)
        return index.match(
            found.texts,
            progress=bar.update,
            tokenised=decision_words(rows, found),
            sketches=decision_sketches(rows, found, recipe.dedup.near) if recipe.decontamination.near else None,
        )


# ------------------------------------------------------------------------------------------------- the pipeline


def prepare(
    recipe: DataRecipe,
    out: str | Path | None = None,
    *,
    progress: bool = False,
    log: Log | None = None,
    engine: Engine | None = None,
) -> dict[str, Any]:
    """Run the data recipe and write its outputs to ``out`` (default ``recipe.out``); returns the manifest.

    ``recipe.engine: ray`` runs near dedup and decontamination on a Ray cluster (docs/distributed-prepare.md).
    """
    if engine is None and recipe.engine == "ray":
        from mydecide.data.distributed import ray_engine

        with ray_engine(recipe.ray, log=log) as ray:
            return prepare(recipe, out, progress=progress, log=log, engine=ray)
    engine = engine or LocalEngine()
    out = Path(out if out is not None else recipe.out)
    check_output_dir(out, recipe)  # before any work: what prepare would replace must be its own
    with directory_lock(out, "prepare"):  # a second prepare into the same --out stops here, naming this one
        say = log or (lambda _message: None)
        ledger = Ledger()

        rows = convert_and_validate(recipe.sources, ledger, progress)
        rows = exact_dedup(rows, recipe, ledger)
        rows = unique_ids(rows, ledger)
        rows = near_dedup(rows, recipe, ledger, progress, engine)
        rows = decontaminate(rows, recipe, ledger, progress, engine)
        rows = cap_per_task(rows, recipe, ledger)
        splits = split_rows(rows, recipe, ledger)
        splits["train"] = augment_train(splits["train"], recipe, ledger)

        for step in ledger.steps:
            say(f"{step['step']:<14} {step['in']:>8} in  {step['out']:>8} out  {short_reasons(step)}")
        manifest = build_manifest(recipe, ledger, splits)
        check_conservation(manifest, ledger)
        write_outputs(out, splits, ledger, manifest, recipe)
        say(f"wrote {', '.join(sorted(manifest['outputs']))} to {out}")
        return manifest


# ----------------------------------------------------------------------------------------------------- steps


def source_labels(specs: Sequence[SourceSpec]) -> list[str]:
    """A label per source: its ``name``, else its kind (``kind#i`` when several sources share a kind)."""
    kinds = Counter(spec.kind for spec in specs if spec.name is None)
    labels = [spec.name or (f"{spec.kind}#{i}" if kinds[spec.kind] > 1 else spec.kind) for i, spec in enumerate(specs)]
    repeated = sorted(label for label, n in Counter(labels).items() if n > 1)
    if repeated:
        raise RecipeError(f"sources: the name(s) {repeated} are used by more than one source")
    return labels


def converted(spec: SourceSpec, index: int, section: str = "sources") -> Iterator[dict[str, Any]]:
    """The converter's rows; a recipe problem (unknown kind or option, missing file) names the source."""
    what = f"{section}[{index}] (kind {spec.kind})"
    try:
        module = load_source(spec.kind)
        rows = module.convert(spec.path, limit=spec.limit, seed=spec.seed, **spec.options)
    except (UnknownSourceError, TypeError, FileNotFoundError, ValueError) as err:  # TypeError: bad options
        raise RecipeError(f"{what}: {err}") from None
    try:
        yield from rows
    except (FileNotFoundError, ValueError) as err:
        raise RecipeError(f"{what}: {err}") from None


def convert_and_validate(specs: Sequence[SourceSpec], ledger: Ledger, progress: bool = False) -> list[Row]:
    """Run every converter and validate each row; bad rows are rejected with their location and reason."""
    rows: list[Row] = []
    per_source: dict[str, dict[str, int]] = {}
    reasons: Counter[str] = Counter()
    for index, (label, spec) in enumerate(zip(source_labels(specs), specs, strict=True)):
        counts = per_source.setdefault(label, {"in": 0, "rejected": 0, "out": 0})
        with progress_bar(progress, f"convert {label}") as bar:
            for obj in converted(spec, index):
                bar.update(1)
                counts["in"] += 1
                ledger.rows_read += 1
                where = str(obj.pop("_where", f"{label}:{counts['in']}"))
                if "_error" in obj:
                    reason = str(obj["_error"])
                    raw = obj.get("raw")
                else:
                    try:
                        records = parse_record(obj)
                    except RecordError as err:
                        reason, raw = err.rule, obj
                    else:
                        rows.extend(Row(record, label, where) for record in records)
                        ledger.exploded_extra += len(records) - 1
                        counts["out"] += len(records)
                        continue
                ledger.reject("validate", label, where, reason, raw)
                counts["rejected"] += 1
                reasons[reason_pattern(reason)] += 1
        if counts["out"] == 0 and spec.limit != 0:
            raise RecipeError(
                f"sources[{index}] (kind {spec.kind}, {spec.path or 'its default data'}): "
                + (
                    "no rows"
                    if counts["in"] == 0
                    else f"all {counts['in']} rows were rejected, the "
                    f"first: {ledger.dropped[-counts['rejected']]['where']}: "
                    f"{ledger.dropped[-counts['rejected']]['reason']}"
                )
            )
    ledger.steps.append(
        {
            "step": "validate",
            "in": ledger.rows_read + ledger.exploded_extra,
            "out": len(rows),
            "rejected": ledger.rejected,
            "rows_read": ledger.rows_read,
            "exploded_extra": ledger.exploded_extra,
            "reasons": dict(reasons.most_common()),
            "by_source": per_source,
            "by_type": {t: {"out": n} for t, n in sorted(Counter(r.record.question.type for r in rows).items())},
            "seconds": ledger.lap(),
        }
    )
    return rows


def exact_dedup(rows: list[Row], recipe: DataRecipe, ledger: Ledger) -> list[Row]:
    """Drop rows whose normalised key repeats an earlier row's (the first is kept)."""
    if not recipe.dedup.exact:
        return ledger.step("exact_dedup", rows, rows, [], skipped=True)
    duplicates = exact_duplicates([exact_key(row.record) for row in rows])
    conflicts = sum(rows[i].record.target != rows[k].record.target for i, k in duplicates.items())
    removed = [(rows[i], "exact duplicate", rows[k].ref()) for i, k in duplicates.items()]
    kept = [row for i, row in enumerate(rows) if i not in duplicates]
    return ledger.step("exact_dedup", rows, kept, removed, label_conflicts=conflicts)


def unique_ids(rows: list[Row], ledger: Ledger) -> list[Row]:
    """Keep the first record of each id, in source order then line order; a later one is removed, naming where the
    first is (ids are the strings records carry, so ``7`` and ``"7"`` are one id).

    It runs after exact dedup, whose keep rule is the same (the first): an exact copy is counted once, as an exact
    duplicate, and what reaches this step under one id is two different records (or, with ``dedup.exact: false``,
    copies, which an id cannot tell apart either)."""
    first: dict[str, Row] = {}
    kept, removed = [], []
    for row in rows:
        seen = first.setdefault(row.record.id, row)
        if seen is row:
            kept.append(row)
        else:
            removed.append((row, "duplicate id", seen.ref()))
    return ledger.step("duplicate_ids", rows, kept, removed)


def near_dedup(
    rows: list[Row], recipe: DataRecipe, ledger: Ledger, progress: bool = False, engine: Engine | None = None
) -> list[Row]:
    """Drop rows that ask the same question as an earlier kept row about a nearly identical state."""
    near = recipe.dedup.near
    if not near.enabled or not rows:
        return ledger.step("near_dedup", rows, rows, [], skipped=not near.enabled)
    with progress_bar(progress, "near dedup", total=len(rows)) as bar:
        matches = (engine or LocalEngine()).near_matches(rows, recipe, bar)
    removed = [
        (rows[i], "near duplicate", {**rows[m.kept].ref(), "similarity": round(m.similarity, 4)})
        for i, m in sorted(matches.items())
    ]
    kept = [row for i, row in enumerate(rows) if i not in matches]
    ledger.near_pairs = near_pairs(rows, matches)
    bands = Counter(similarity_band(m.similarity) for m in matches.values())
    return ledger.step(
        "near_dedup",
        rows,
        kept,
        removed,
        threshold=near.threshold,
        num_perm=near.num_perm,
        ngram=near.ngram,
        shingling=shingling(near).describe(),
        keep_slot_changes=near.keep_slot_changes,
        by_similarity={band: bands[band] for band in SIMILARITY_BANDS if bands[band]},
        pairs="near_pairs.jsonl",
    )


SIMILARITY_BANDS = ("<0.7", "0.7-0.8", "0.8-0.9", "0.9-1.0", "1.0")
PAIR_CHARS = 1000  # of each state in near_pairs.jsonl (the whole removed record is in rejects.jsonl)


def similarity_band(similarity: float) -> str:
    if similarity >= 1.0:
        return "1.0"
    return next(
        (f"{lo}-{hi}" for lo, hi in (("0.9", "1.0"), ("0.8", "0.9"), ("0.7", "0.8")) if similarity >= float(lo)), "<0.7"
    )


def near_pairs(rows: Sequence[Row], matches: dict[int, NearMatch]) -> list[dict[str, Any]]:
    """One line per near-duplicate removal, least similar first, so a threshold can be audited from the top."""

    def side(row: Row) -> dict[str, Any]:
        text = row.text
        return {**row.ref(), "state": text if len(text) <= PAIR_CHARS else text[:PAIR_CHARS] + "…"}

    return [
        {
            "similarity": round(m.similarity, 4),
            "band": similarity_band(m.similarity),
            "removed": side(rows[i]),
            "kept": side(rows[m.kept]),
        }
        for i, m in sorted(matches.items(), key=lambda item: (item[1].similarity, item[0]))
    ]


def eval_items(recipe: DataRecipe) -> tuple[list[EvalItem], dict[str, dict[str, Any]]]:
    """The states of every eval file or source in ``decontaminate_against``, and per-file counts.

    Only the state matters here, so a source's error row still counts when its raw row has a ``state``
    (evaluation files without gold answers, such as public benchmark suites, come out as error rows).
    """
    items: list[EvalItem] = []
    files: dict[str, dict[str, Any]] = {}
    for index, entry in enumerate(recipe.decontaminate_against):
        if isinstance(entry, str):
            name = entry
            found, problems = read_eval_jsonl(entry)
        else:
            name = entry.name or f"{entry.kind}:{entry.path}"
            found, problems = [], []
            for obj in converted(entry, index, section="decontaminate_against"):
                where = str(obj.pop("_where", "?"))
                raw = obj.get("raw") if "_error" in obj else obj
                try:
                    records = [] if "_error" in obj else parse_record(obj)
                except RecordError:
                    records = []
                if records:
                    found.extend(
                        EvalItem(name, r.id, state_text(r.state), r.question.instructions, r.question.type)
                        for r in records
                    )
                elif isinstance(raw, dict) and raw.get("state") not in (None, "", [], {}):
                    item = EvalItem(name, str(raw.get("id") or where), state_text(raw["state"]), *question_of(raw))
                    found.append(item)
                else:
                    problems.append(f"{where}: {obj.get('_error', 'no state')}")
            if not found:
                raise RecipeError(f"decontaminate_against[{index}] ({name}): no eval item with a state")
        files[name] = {"items": len(found), "unreadable": len(problems), "unreadable_examples": problems[:5]}
        items.extend(found)
    return items, files


def decontaminate(
    rows: list[Row], recipe: DataRecipe, ledger: Ledger, progress: bool = False, engine: Engine | None = None
) -> list[Row]:
    """Drop rows whose state matches an eval item: exactly, nearly (MinHash) or by a shared word n-gram."""
    if not recipe.decontaminate_against:
        release(rows)
        return ledger.step("decontaminate", rows, rows, [], eval_files={})
    items, files = eval_items(recipe)
    settings, near = recipe.decontamination, recipe.dedup.near
    index = EvalIndex(
        items,
        exact=settings.exact,
        near=settings.near,
        threshold=settings.near_threshold or near.threshold,
        num_perm=near.num_perm,
        shingling=shingling(near),
        seed=near.seed,
        overlap_words=settings.ngram,
        whole_min_words=settings.whole_min_words,
        short_edits=settings.short_edits,
        keep_slot_changes=near.keep_slot_changes,
    )
    with progress_bar(progress, "decontaminate", total=len(rows)) as bar:
        found = (engine or LocalEngine()).contamination(rows, index, recipe, bar)
    removed = [
        (row, f"eval overlap ({hit.method})", hit.to_json())
        for row, hit in zip(rows, found, strict=True)
        if hit is not None
    ]
    kept = [row for row, hit in zip(rows, found, strict=True) if hit is None]
    for file, info in files.items():
        info["rows_removed"] = sum(hit is not None and hit.file == file for hit in found)
    release(rows)
    return ledger.step(
        "decontaminate",
        rows,
        kept,
        removed,
        eval_files=files,
        ngram=settings.ngram,
        whole_min_words=settings.whole_min_words,
        short_edits=settings.short_edits,
        near_threshold=index.threshold,
        shingling=index.shingling.describe(),
    )


def cap_per_task(rows: list[Row], recipe: DataRecipe, ledger: Ledger) -> list[Row]:
    """Keep at most the cap of each task (a stable hash sample, not the first rows)."""
    caps = recipe.cap_per_task
    if isinstance(caps, dict):
        unknown = sorted(set(caps) - {row.record.task for row in rows})
        if unknown:
            raise RecipeError(f"cap_per_task names task(s) {unknown} that have no records")
    over = split.capped([row.record for row in rows], caps, recipe.split.seed)
    removed = (
        [
            (rows[i], "over the task cap", {"cap": caps if isinstance(caps, int) else caps[task]})
            for i, task in sorted(over.items())
        ]
        if isinstance(caps, (int, dict))
        else []
    )
    kept = [row for i, row in enumerate(rows) if i not in over]
    return ledger.step(
        "cap_per_task", rows, kept, removed, cap=caps, by_task=in_out(rows, kept, lambda r: r.record.task)
    )


def split_rows(rows: list[Row], recipe: DataRecipe, ledger: Ledger) -> dict[str, list[Row]]:
    """Held-out tasks whole; the rest train / dev / test by the stable state hash."""
    cfg = recipe.split
    try:
        indices = split.split_records(
            [row.record for row in rows],
            heldout_tasks=cfg.heldout_tasks,
            dev_fraction=cfg.dev_fraction,
            test_fraction=cfg.test_fraction,
            seed=cfg.seed,
        )
    except ValueError as err:
        raise RecipeError(str(err)) from None
    splits = {name: [rows[i] for i in idx] for name, idx in indices.items()}
    empty = empty_by_recipe(splits, rows, recipe, ledger)
    ledger.steps.append(
        {
            "step": "split",
            "in": len(rows),
            "out": len(rows),
            "removed": 0,
            "splits": {name: len(part) for name, part in splits.items()},
            "empty_by_recipe": empty,
            "by_task": {
                name: dict(sorted(Counter(r.record.task for r in part).items())) for name, part in splits.items()
            },
            "seconds": ledger.lap(),
        }
    )
    return splits


def empty_by_recipe(
    splits: dict[str, list[Row]], rows: list[Row], recipe: DataRecipe, ledger: Ledger
) -> dict[str, str]:
    """``{split: why}`` for each empty split the recipe asked to be empty (a fraction of 0, no held-out task); a
    split it asked for that came out empty is a RecipeError naming the cause, so prepare never writes an empty
    train.jsonl, dev.jsonl or test.jsonl and ends as if all were well."""
    cfg = recipe.split
    trained = len(rows) - len(splits["heldout"])
    if not splits["train"]:
        raise RecipeError(f"split: train would be empty: {empty_train_cause(rows, trained, cfg, ledger)}")
    empty = {}
    for name, fraction in (("dev", cfg.dev_fraction), ("test", cfg.test_fraction)):
        if splits[name]:
            continue
        if fraction > 0:
            raise RecipeError(
                f"split: {name} would be empty: split.{name}_fraction {fraction} of the {trained} rows of trained "
                f"tasks gave none; add rows, raise it, or set split.{name}_fraction: 0 to prepare without {name}"
            )
        empty[name] = f"split.{name}_fraction is 0"
    if not cfg.heldout_tasks:
        empty["heldout"] = "no split.heldout_tasks"
    return empty


def empty_train_cause(rows: list[Row], trained: int, cfg: SplitConfig, ledger: Ledger) -> str:
    """Why no row went to train: none was left, every task left is held out, or the hash sent all to dev / test."""
    if not rows:
        gone = [f"{s['step']} {n}" for s in ledger.steps if (n := s.get("removed") or s.get("rejected"))]
        return "no row is left to split" + (f" (rows out: {', '.join(gone)})" if gone else "")
    if not trained:
        return f"every task left is held out (split.heldout_tasks: {cfg.heldout_tasks})"
    return (
        f"the {trained} rows of trained tasks all went to dev or test (split.dev_fraction {cfg.dev_fraction}, "
        f"split.test_fraction {cfg.test_fraction}); add rows or lower the fractions"
    )


def augment_train(train: list[Row], recipe: DataRecipe, ledger: Ledger) -> list[Row]:
    """Add augmented copies of train rows (after the split, so no other split is touched)."""
    cfg = recipe.augment
    schema = cfg.schema_resampling
    settings = augmenting.AugmentSettings(
        anonymize_options=max(cfg.anonymize_options, schema),
        drop_distractors=max(cfg.drop_distractors, schema),
        paraphrase_instructions=cfg.paraphrase_instructions,
        paraphrases=cfg.paraphrases,
        reword_instructions=max(cfg.reword_instructions, schema),
        negate_noul=max(cfg.negate_noul, cfg.consistency),
        rename_options=max(cfg.rename_options, cfg.consistency),
        negation_templates=cfg.negation_templates or augmenting.NEGATION_TEMPLATES,
        seed=cfg.seed,
    )
    out: list[Row] = []
    added: Counter[str] = Counter()
    for row in train:
        out.append(row)
        for copy in augmenting.copies(row.record, settings):
            out.append(Row(copy, row.source, row.where))
            added[str(copy.meta["augmented"])] += 1
    ledger.augmented = sum(added.values())
    ledger.steps.append(
        {
            "step": "augment",
            "in": len(train),
            "out": len(out),
            "removed": 0,
            "added": {kind: added[kind] for kind in augmenting.AUGMENTATIONS},
            "share": {kind: round(added[kind] / len(train), 4) if train else 0.0 for kind in augmenting.AUGMENTATIONS},
            "seconds": ledger.lap(),
        }
    )
    return out
