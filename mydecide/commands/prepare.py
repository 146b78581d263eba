"""`mydecide prepare`: converter plugins → validated, deduplicated, decontaminated, split JSONL."""

from __future__ import annotations

import sys

import typer

from mydecide.commands import fail, friendly_errors
from mydecide.commands.options import Out, recipe_from_command_line, split_args
from mydecide.config import DataRecipe


def register(app: typer.Typer) -> None:
    @app.command("prepare")
    @friendly_errors
    def prepare(
        args: list[str] | None = typer.Argument(
            None,
            help="A data recipe (e.g. recipes/data/demo.yaml) and dotted KEY=VALUE overrides, e.g. "
            "split.dev_fraction=0.1 cap_per_task=500.",
            show_default=False,
        ),
        out: Out = None,
        list_sources: bool = typer.Option(False, "--list-sources", help="List the converter plugins and exit."),
        engine: str | None = typer.Option(
            None,
            "--engine",
            help="local (in this process, the default) or ray: every step on a Ray cluster, block by block "
            "($RAY_ADDRESS or the recipe's ray.address; none: a local Ray), with the same outputs.",
            show_default=False,
        ),
        progress: bool | None = typer.Option(
            None, "--progress/--no-progress", help="Progress bars on stderr (default: when it is a terminal)."
        ),
    ) -> None:
        """Write DIR/train.jsonl, dev.jsonl, heldout_tasks.jsonl, rejects.jsonl and manifest.json."""
        if list_sources:
            from mydecide.data.sources import available_sources, format_sources

            typer.echo(format_sources(available_sources()))
            return
        if split_args(args)[0] is None:
            fail("missing RECIPE (a data recipe such as recipes/data/demo.yaml), or use --list-sources")
            return
        from mydecide.data.prepare import prepare as run_prepare

        recipe = recipe_from_command_line(DataRecipe, args, {"out": out, "engine": engine})
        manifest = run_prepare(
            recipe,
            progress=sys.stderr.isatty() if progress is None else progress,
            log=lambda line: typer.echo(line, err=True),
        )
        c = manifest["conservation"]
        empty = next(step for step in manifest["steps"] if step["step"] == "split")["empty_by_recipe"]
        if "dev" in empty:
            typer.echo(
                f"[mydecide] warning: no dev split ({empty['dev']}): `mydecide train` refuses {recipe.out}, since "
                "it keeps the adapter that is best on dev; set split.dev_fraction > 0 to train on it",
                err=True,
            )
        splits = ", ".join(
            f"{name} {info['rows']}" + (f" ({empty[name]})" if name in empty else "")
            for name, info in manifest["splits"].items()
        )
        soft = next(step for step in manifest["steps"] if step["step"] == "augment").get("soft_targets")
        typer.echo(
            f"{recipe.out}: {splits}; input {c['input']} = kept {c['kept']} + rejected "
            f"{c['rejected']} + removed {c['removed']} (+{c['augmented_copies']} augmented in train)"
            + (f"; soft targets on {soft} of the {manifest['splits']['train']['rows']} train rows" if soft else "")
        )
