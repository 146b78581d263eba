"""The recipes that ship inside the package, and the starter recipes ``mydecide init`` writes for a user's own table.

The recipes live in ``mydecide/recipes/``, so a ``pip install`` has them; the repository's ``recipes/``, which the
commands and tests name, is a link to that folder (one copy, nothing to keep in step). A recipe path under
``recipes/`` that does not exist where the command runs is read from the package
(:func:`packaged_recipe`), so the commands of the docs work from any directory.

:func:`starter_recipes` writes ``data.yaml`` (a csv source: with a CSV, its id, text and label columns read from the
file, one question per label column) and ``train.yaml`` (the demo's training settings without its task weights).
"""

from __future__ import annotations

import csv
from collections import Counter
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from mydecide.errors import UserError

PACKAGED = "recipes"
MAX_OPTIONS = 20  # a column with more distinct values is not a label column: it is left out, with a comment
SAMPLE_ROWS = 2000  # rows read to find a table's label values
YES_NO = {"true", "false", "yes", "no", "0", "1"}


def packaged_root() -> Path:
    """The package's recipes directory (``mydecide/recipes``)."""
    return Path(str(resources.files("mydecide") / PACKAGED))


def packaged_recipe(path: str | Path) -> Path | None:
    """The packaged copy of ``recipes/...`` when ``path`` names one that does not exist here, else None."""
    parts = Path(path).parts
    if Path(path).exists() or len(parts) < 2 or parts[0] != PACKAGED:
        return None
    found = packaged_root().joinpath(*parts[1:])
    return found if found.is_file() else None


def _label_question(column: str, values: Counter[str]) -> dict[str, Any] | None:
    if not values or len(values) > MAX_OPTIONS:
        return None
    if {v.lower() for v in values} <= YES_NO:
        return {"task": column, "type": "noul", "column": column, "instructions": f"Is it {column}?"}
    return {
        "task": column,
        "type": "choice",
        "column": column,
        "instructions": f"Which {column} fits?",
        "options": sorted(values),
    }


def data_recipe(csv_path: str, name: str) -> tuple[dict[str, Any], list[str]]:
    """A data recipe for a CSV: ``id`` (if present) is the id column, ``text`` (else the column with the longest
    values) the state, and every other column with at most MAX_OPTIONS distinct values a question; returns the
    recipe and notes on what it guessed."""
    try:
        with open(csv_path, newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            header = list(reader.fieldnames or [])
            rows = [row for _, row in zip(range(SAMPLE_ROWS), reader, strict=False)]
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise UserError(f"{csv_path}: cannot read it as a CSV file ({err})") from None
    if len(header) < 2 or not rows:
        raise UserError(f"{csv_path}: needs a header with a text column and a label column, and rows")
    id_column = "id" if "id" in header else None
    rest = [c for c in header if c != id_column]
    lengths = {c: sum(len(row.get(c) or "") for row in rows) for c in rest}
    state = "text" if "text" in rest else max(rest, key=lengths.__getitem__)
    questions, notes = [], [f"state: column {state!r}" + (", ids: column 'id'" if id_column else "")]
    for column in rest:
        if column == state:
            continue
        values = Counter((row.get(column) or "").strip() for row in rows if (row.get(column) or "").strip())
        question = _label_question(column, values)
        if question is None:
            notes.append(f"column {column!r} left out: {len(values)} distinct values (more than {MAX_OPTIONS})")
        else:
            questions.append(question)
            notes.append(
                f"question {column!r}: {question['type']}"
                + (f" of {len(values)} options" if question["type"] == "choice" else "")
            )
    if not questions:
        raise UserError(f"{csv_path}: no label column (at most {MAX_OPTIONS} distinct values) beside {state!r}")
    options: dict[str, Any] = {"state_column": state, **({"id_column": id_column} if id_column else {})}
    source = {"kind": "csv", "path": csv_path, "options": {**options, "questions": questions}}
    recipe = {
        "sources": [source],
        "split": {"dev_fraction": 0.2, "test_fraction": 0.2, "seed": 13},
        "out": f"runs/{name}/data",
    }
    return recipe, notes


TEMPLATE = {
    "sources": [
        {
            "kind": "csv",
            "path": "data/my_table.csv",
            "options": {
                "state_column": "text",
                "id_column": "id",
                "questions": [
                    {
                        "task": "team",
                        "type": "choice",
                        "column": "team",
                        "instructions": "Which team should handle this ticket?",
                        "options": {"billing": "Charges and refunds", "engineering": "Bugs and outages"},
                    },
                    {
                        "task": "urgency",
                        "type": "score",
                        "column": "urgency",
                        "instructions": "How urgent is this ticket?",
                        "levels": ["low", "medium", "high"],
                    },
                ],
            },
        }
    ],
    "split": {"dev_fraction": 0.2, "test_fraction": 0.2, "seed": 13},
}


def train_recipe(name: str) -> dict[str, Any]:
    """The demo's training settings (recipes/train/demo.yaml) for any data: its task weights name the demo's tasks."""
    recipe = yaml.safe_load((packaged_root() / "train" / "demo.yaml").read_text(encoding="utf-8"))
    recipe.pop("task_weights", None)
    recipe["out"] = f"runs/{name}/train"
    return recipe


def starter_recipes(out: str | Path, csv_path: str | None = None) -> tuple[list[Path], list[str]]:
    """Write ``out/data.yaml`` and ``out/train.yaml`` (refusing to replace either); returns them and the notes."""
    out = Path(out)
    name = Path(csv_path).stem if csv_path else "my_data"
    targets = [out / "data.yaml", out / "train.yaml"]
    there = [str(p) for p in targets if p.exists()]
    if there:
        raise UserError(f"{', '.join(there)}: already there; init never replaces a recipe, choose another DIR")
    if csv_path is not None:
        data, notes = data_recipe(csv_path, name)
    else:
        data, notes = (
            {**TEMPLATE, "out": f"runs/{name}/data"},
            ["a template: set the path, the columns and the questions"],
        )
    heads = [
        f"# A data recipe for {csv_path or 'your own table'} (docs/datasets-source.md, docs/recipes.md).\n"
        f"#   mydecide prepare {targets[0]}\n",
        f"# Training on it: the demo's settings (recipes/train/demo.yaml) without its task weights.\n"
        f"#   mydecide train {targets[1]} --data runs/{name}/data\n",
    ]
    out.mkdir(parents=True, exist_ok=True)
    for path, head, recipe in zip(targets, heads, (data, train_recipe(name)), strict=True):
        path.write_text(head + yaml.safe_dump(recipe, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return targets, notes
