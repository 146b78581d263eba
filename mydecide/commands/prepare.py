"""`mydecide prepare` (not built yet)."""

from __future__ import annotations

import typer

from mydecide.commands import not_built


def register(app: typer.Typer) -> None:
    @app.command("prepare")
    def command() -> None:
        """Not built yet."""
        not_built("prepare")
