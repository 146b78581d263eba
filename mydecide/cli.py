"""The ``mydecide`` command line: one sub-command module per verb in ``mydecide/commands/``.

Command modules import nothing heavy at module level, so ``mydecide --help`` starts fast and never imports torch.
"""

from __future__ import annotations

import typer

from mydecide import __version__
from mydecide.commands import calibrate, evaluate, merge, predict, prepare, serve, train

app = typer.Typer(
    name="mydecide",
    help="Train, calibrate, evaluate and serve your own decision model.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def show_version(value: bool) -> None:
    if value:
        typer.echo(f"mydecide {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", callback=show_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Train, calibrate, evaluate and serve your own decision model."""


for module in (prepare, train, calibrate, evaluate, predict, serve, merge):
    module.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
