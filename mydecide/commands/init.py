"""`mydecide init`: starter data and training recipes for your own table."""

from __future__ import annotations

from pathlib import Path

import typer

from mydecide.commands import friendly_errors


def register(app: typer.Typer) -> None:
    @app.command("init")
    @friendly_errors
    def init(
        directory: Path = typer.Argument(..., help="Where to write data.yaml and train.yaml (never replaced)."),
        csv: str | None = typer.Option(
            None, "--csv", help="Your CSV: its id, text and label columns fill the data recipe (else a template)."
        ),
    ) -> None:
        """Write DIR/data.yaml and DIR/train.yaml, and print the commands that use them."""
        from mydecide.starter import starter_recipes

        written, notes = starter_recipes(directory, csv)
        for note in notes:
            typer.echo(f"  {note}")
        typer.echo(f"wrote {written[0]} and {written[1]}; next:")
        typer.echo(f"  mydecide prepare {written[0]}")
        typer.echo(f"  mydecide train {written[1]}")
