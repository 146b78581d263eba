"""What travels with a saved adapter: the base model by a name that works on another machine, and a model card.

PEFT records the base model as ``config.name_or_path``, which for the embedded default is the directory it was
converted into (``~/.cache/mydecide/...``): a path that means nothing elsewhere. ``record_base_model`` writes the
name the recipe used instead (a hub id, an alias such as ``smollm2-135m``, or the absolute path of a local
directory), which ``mydecide.modeling.resolve_model_path`` turns back into a model wherever the cache now is, and
``mydecide_base.json`` beside it with that name and the base's weights fingerprint, which loading the adapter checks
(``mydecide.adapters.check_base``: an adapter on another base of the same shapes is refused).
``write_model_card`` replaces PEFT's empty template with the training data, the recipe and the dev metrics.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mydecide.adapters import ADAPTER_CONFIG, BASE_FILE, FINGERPRINT
from mydecide.config import TrainRecipe, dump_recipe
from mydecide.errors import UserError
from mydecide.io import atomic_write_text
from mydecide.jsonl import iter_jsonl
from mydecide.records import Record

DEV_COLUMNS = (
    "update",
    "epoch",
    "n",
    "accuracy",
    "chance_corrected",
    "log_loss",
    "brier",
    "ece",
    "flip_rate",
    "majority_accuracy",
)


def portable_name(model: str) -> str:
    """The base model as it can be named on another machine: a hub id or alias as given; a local directory or
    GGUF file by its absolute path (a relative one would depend on the working directory)."""
    path = Path(model).expanduser()
    return str(path.resolve()) if path.exists() else model


def record_base_model(adapter_dir: Path, model: str, fingerprint: str) -> None:
    """Write the portable base name into ``adapter_config.json`` (``base_model_name_or_path``), and the name with
    the base's weights ``fingerprint`` (``mydecide.adapters.weights_fingerprint``) into ``mydecide_base.json``."""
    config_path = adapter_dir / ADAPTER_CONFIG
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = portable_name(model)
    atomic_write_text(config_path, json.dumps(config, indent=2, sort_keys=True) + "\n")
    record = {"model": portable_name(model), "weights_fingerprint": fingerprint, "fingerprint": FINGERPRINT}
    atomic_write_text(adapter_dir / BASE_FILE, json.dumps(record, indent=2) + "\n")


def data_table(splits: dict[str, Sequence[Record]]) -> str:
    """Records per task and question type, one column per split."""
    counts = {name: Counter((r.task, r.question.type) for r in records) for name, records in splits.items()}
    keys = sorted(set().union(*counts.values()))
    lines = ["| task | type | " + " | ".join(splits) + " |", "|---|---|" + "---|" * len(splits)]
    lines += [
        f"| {task} | {qtype} | " + " | ".join(str(counts[name][(task, qtype)]) for name in splits) + " |"
        for task, qtype in keys
    ]
    lines.append("| **all** | | " + " | ".join(str(len(records)) for records in splits.values()) + " |")
    return "\n".join(lines)


def dev_table(metrics_file: Path) -> str:
    rows = []
    for where, row, error in iter_jsonl(metrics_file) if metrics_file.is_file() else []:
        if error is not None:
            raise UserError(f"{metrics_file.parent / where}: {error}")
        if row["kind"] == "dev":
            rows.append(row)
    if not rows:
        return "No dev evaluation yet."

    def cell(value: Any) -> str:
        return f"{value:.4f}" if isinstance(value, float) else "—" if value is None else str(value)

    lines = ["| " + " | ".join(DEV_COLUMNS) + " |", "|" + "---|" * len(DEV_COLUMNS)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in DEV_COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def write_model_card(
    adapter_dir: Path,
    recipe: TrainRecipe,
    which: str,
    update: int,
    splits: dict[str, Sequence[Record]],
    metrics_file: Path,
) -> None:
    """README.md of the adapter, a ``huggingface_hub.ModelCard``: what it is, how to load it, the data it saw, its dev
    metrics and its recipe."""
    base = portable_name(recipe.model)
    text = f"""# Decision-model adapter ({which})

A LoRA adapter trained by `mydecide train` on `{base}` with the `{recipe.objective.kind}` objective: given a state
and typed questions (choice, noul, score, set, span), it returns a probability for every allowed answer. This is the
{"best adapter on dev (recipe key best_margin)" if which == "best on dev" else "adapter of the last update"}, saved at
update {update}. The render config it was trained with is `mydecide_render.json` beside it; serving reads it.

```bash
mydecide evaluate --model {base} --adapter ADAPTER_DIR --data test.jsonl --out eval/
mydecide serve --model {base} --adapter ADAPTER_DIR
```

## Training data

{data_table(splits)}

## Dev metrics during training

{dev_table(metrics_file)}

Test metrics are not known at training time: `mydecide evaluate` writes them (report.md) for the files you give it.

## Recipe

```yaml
{dump_recipe(recipe).rstrip()}
```
"""
    atomic_write_text(adapter_dir / "README.md", str(model_card(base, text)))


def model_card(base: str, text: str) -> Any:
    """A ``huggingface_hub.ModelCard``: its metadata (a PEFT adapter of ``base``, tagged mydecide) and ``text``."""
    from huggingface_hub import ModelCard, ModelCardData

    data = ModelCardData(library_name="peft", base_model=base, tags=["mydecide", "lora", "decision-model"])
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{text}")
