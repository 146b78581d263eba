"""Per task, what ``prepare`` kept and removed, and a warning for a task that lost all or most of its rows at one step
(two sources that give their rows the same ids, say, lose the second source's task whole at ``duplicate_ids``).

The counts come from the manifest (each removing step's ``removed_by_task`` and the split's ``by_task``), the same
for both engines; the first lost rows of a warning are read back from ``rejects.jsonl``."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MOST = 0.5  # a step that removes more than this share of a task's rows (or all of them) is warned about
FIRST = 3  # lost rows named per warning
ASKED_FOR = ("cap_per_task",)  # steps whose losses the recipe asks for: counted, never warned about
HINTS = {
    "duplicate_ids": "two sources giving their rows the same ids (one file read twice with one id_column?) keep the "
    "first source's only: read several label columns with one source's `questions`",
}


def task_table(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{task: {"kept": n, "removed": {step: n}}}`` from a prepare manifest (kept: rows in the splits, before
    augmentation; rows rejected at validation have no task yet and are not counted here)."""
    kept: Counter[str] = Counter()
    removed: dict[str, dict[str, int]] = {}
    for step in manifest["steps"]:
        if step["step"] == "split":
            for part in step["by_task"].values():
                kept.update(part)
        for task, n in step.get("removed_by_task", {}).items():
            removed.setdefault(task, {})[step["step"]] = n
    return {task: {"kept": kept[task], "removed": removed.get(task, {})} for task in sorted(set(kept) | set(removed))}


def losses(table: dict[str, dict[str, Any]], steps: list[str]) -> Iterator[tuple[str, str, int, int]]:
    """(task, step, rows lost, rows of the task that entered the step) for every loss of all or most of a task."""
    for task, account in table.items():
        entering = account["kept"] + sum(account["removed"].values())
        for step in steps:
            lost = account["removed"].get(step, 0)
            if lost and step not in ASKED_FOR and (lost == entering or lost > MOST * entering):
                yield task, step, lost, entering
            entering -= lost


def first_lost(rejects: Path, wanted: set[tuple[str, str]]) -> dict[tuple[str, str], list[str]]:
    """The first :data:`FIRST` rows of each (step, task) in ``rejects.jsonl``, as ``where (reason: what matched)``."""
    found: dict[tuple[str, str], list[str]] = {key: [] for key in wanted}
    if not wanted or not rejects.is_file():
        return found
    with rejects.open(encoding="utf-8") as handle:
        for line in handle:
            entry = json.loads(line)
            rows = found.get((entry.get("step"), entry.get("task")))
            if rows is None or len(rows) >= FIRST:
                continue
            matched = entry.get("matched") or {}
            what = f" of source {matched['source']} at {matched['where']}" if "where" in matched else ""
            rows.append(f"{entry['where']} of source {entry['source']} ({entry['reason']}{what})")
            if all(len(r) >= FIRST for r in found.values()):
                break
    return found


def task_lines(manifest: dict[str, Any], out: Path) -> list[str]:
    """The per-task summary lines and, after them, one warning per task that lost all or most of its rows at a step."""
    table = task_table(manifest)
    lines = []
    for task, account in table.items():
        removed = account["removed"]
        detail = ", ".join(f"{step} {n}" for step, n in removed.items())
        lines.append(
            f"task {task:<20} kept {account['kept']:>8}  removed {sum(removed.values()):>8}"
            + (f" ({detail})" if detail else "")
        )
    found = list(losses(table, [step["step"] for step in manifest["steps"]]))
    first = first_lost(out / "rejects.jsonl", {(step, task) for task, step, _, _ in found})
    for task, step, lost, entering in found:
        share = f"all {entering}" if lost == entering else f"{lost} of the {entering}"
        hint = f"; {HINTS[step]}" if step in HINTS else ""
        lines.append(
            f"[mydecide] warning: task {task!r} lost {share} of its rows at step {step}; the first: "
            f"{'; '.join(first[(step, task)])} (all in rejects.jsonl){hint}"
        )
    return lines
