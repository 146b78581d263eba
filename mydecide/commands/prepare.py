"""`mydecide prepare`: converter plugins → validated, deduplicated, decontaminated, split JSONL."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from mydecide.commands import fail, friendly_errors


def register(app: typer.Typer) -> None:
    @app.command("prepare")
    @friendly_errors
    def prepare(
        recipe: Path | None = typer.Argument(None, help="A data recipe, e.g. recipes/data/demo.yaml."),
        overrides: list[str] = typer.Argument(
            None, help="Dotted KEY=VALUE overrides, e.g. split.dev_fraction=0.1 cap_per_task=500."
        ),
        out: Path | None = typer.Option(None, "--out", help="Output directory (default: the recipe's `out`)."),
        list_sources: bool = typer.Option(False, "--list-sources", help="List the converter plugins and exit."),
        progress: bool | None = typer.Option(
            None, "--progress/--no-progress", help="Progress bars on stderr (default: when it is a terminal)."
        ),
    ) -> None:
        """Write DIR/train.jsonl, dev.jsonl, heldout_tasks.jsonl, rejects.jsonl and manifest.json."""
        if list_sources:
            from mydecide.data.sources import available_sources, format_sources

            typer.echo(format_sources(available_sources()))
            return
        if recipe is None:
            fail("missing RECIPE (a data recipe such as recipes/data/demo.yaml), or use --list-sources")
            return
        from mydecide.config import DataRecipe, load_recipe
        from mydecide.data.prepare import prepare as run_prepare

        resolved = load_recipe(recipe, list(overrides or []), model=DataRecipe)
        if out is not None:
            resolved = resolved.model_copy(update={"out": str(out)})
        manifest = run_prepare(
            resolved,
            progress=sys.stderr.isatty() if progress is None else progress,
            log=lambda line: typer.echo(line, err=True),
        )
        c = manifest["conservation"]
        splits = ", ".join(f"{name} {info['rows']}" for name, info in manifest["splits"].items())
        typer.echo(
            f"{resolved.out}: {splits}; input {c['input']} = kept {c['kept']} + rejected "
            f"{c['rejected']} + removed {c['removed']} (+{c['augmented_copies']} augmented in train)"
        )
