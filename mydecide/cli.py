"""The ``mydecide`` command line: one sub-command module per verb in ``mydecide/commands/``.

Command modules import nothing heavy at module level, so ``mydecide --help`` starts fast and never imports torch.

Ctrl-C is one line on stderr, ``interrupted``, and exit status 130 (128 + SIGINT), never a traceback, wherever it
lands: inside a command (:func:`mydecide.commands.friendly_errors` says it there) or while the command line is still
starting. For the start this module imports only the standard library at module level, so the console script's
``from mydecide.cli import main`` is over at once, and :func:`main` imports typer, pydantic and the command modules
under its own catch. ``from mydecide.cli import app`` still works: the app is built on first use.
"""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    import typer

INTERRUPTED = 130  # exit status of a command stopped by Ctrl-C: 128 + SIGINT, as a shell reports it


def main() -> None:
    """The console script ``mydecide`` and ``python -m mydecide.cli``."""
    try:
        build_app()()
    except KeyboardInterrupt:
        exit_interrupted()


def exit_interrupted() -> NoReturn:
    """The end of a command the user stopped: one line, no traceback (it is not an error to report)."""
    print("interrupted", file=sys.stderr)
    sys.exit(INTERRUPTED)


@functools.cache
def build_app() -> typer.Typer:
    """The Typer app with every verb registered (built once)."""
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
    return app


def __getattr__(name: str) -> typer.Typer:
    """``mydecide.cli.app`` (PEP 562): the app, built when it is first asked for."""
    if name == "app":
        return build_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    main()
