"""What ``prepare`` reads: the recipe's sources, converted and validated (the pipeline's first step), and the eval files
or sources it decontaminates against.

Each source's converter runs under a label (its ``name``, else its kind); a row that does not validate is rejected
with its location and rule, and a source with no usable row, or an unknown kind, a bad option or a missing file, is
a RecipeError naming the source. :func:`eval_items` reads the states (and questions) of ``decontaminate_against``
only, so an eval file without gold answers still counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

from mydecide.config import DataRecipe, SourceSpec
from mydecide.data.decontaminate import EvalItem, question_of, read_eval_jsonl
from mydecide.data.dedup import state_text
from mydecide.data.ledger import Ledger, Row, progress_bar, reason_pattern
from mydecide.data.sources import UnknownSourceError, load_source
from mydecide.jsonl import not_utf8_hint
from mydecide.recipe_parsing import RecipeError
from mydecide.records import Record, RecordError, parse_record


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
    except (FileNotFoundError, ValueError) as err:  # a converter's ValueError names its file or option (its contract)
        raise RecipeError(f"{what}: {err}") from None


def validated(obj: dict[str, Any], label: str, line: int) -> tuple[str, list[Record] | None, str, Any]:
    """One converter row as (where, its records, "", None), or (where, None, why it is rejected, its raw content);
    ``line``: the row's number in its source, for a converter that gives no ``_where``."""
    where = str(obj.pop("_where", f"{label}:{line}"))
    if "_error" in obj:
        return where, None, str(obj["_error"]), obj.get("raw")
    try:
        return where, parse_record(obj), "", None
    except RecordError as err:
        return where, None, err.rule, obj


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
                where, records, reason, raw = validated(obj, label, counts["in"])
                if records is not None:
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
                    f"{not_utf8_hint(ledger.dropped[-counts['rejected']]['reason'])}"
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
