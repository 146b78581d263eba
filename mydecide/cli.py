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
from typing import TYPE_CHECKING, Any, NoReturn

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
    from mydecide.commands import (
        calibrate,
        evaluate,
        export_gguf,
        export_vllm,
        init,
        merge,
        predict,
        prepare,
        push,
        serve,
        train,
    )

    app = typer.Typer(
        name="mydecide",
        help="Train, calibrate, evaluate and serve your own decision model.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        cls=one_line_usage_errors(),
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

    for module in (init, prepare, train, calibrate, evaluate, predict, serve, merge, export_vllm, export_gguf, push):
        module.register(app)
    return app


def one_line_usage_errors() -> type:
    """The app's command group: a usage error (a bad option value, an unknown option or command, a missing
    argument) is one line on stderr, ``error: MESSAGE; see `mydecide VERB --help```, and exit status 2, as every
    other user error is, instead of click's usage lines and typer's box. ``--help``, ``--version`` and the help
    that no arguments show are as typer makes them. The console script, ``python -m mydecide.cli`` and a test's
    ``CliRunner().invoke(app, ...)`` all go through it."""
    import typer
    from typer.core import TyperGroup

    try:  # typer 0.22 and later carry their own copy of click
        from typer._click import exceptions as errors
    except ImportError:
        from click import exceptions as errors  # type: ignore[no-redef]

    no_args_help = getattr(errors, "NoArgsIsHelpError", ())  # click 8.2 and later

    class OneLineUsageErrors(TyperGroup):
        def main(
            self,
            args: Any = None,
            prog_name: str | None = None,
            complete_var: str | None = None,
            standalone_mode: bool = True,
            windows_expand_args: bool = True,
            **extra: Any,
        ) -> Any:
            run = functools.partial(super().main, args, prog_name, complete_var, False, windows_expand_args, **extra)
            if not standalone_mode:
                return run()
            try:
                code = run()
            except no_args_help as err:  # the help is shown already
                sys.exit(err.exit_code)
            except errors.ClickException as err:
                where = err.ctx.command_path if isinstance(err, errors.UsageError) and err.ctx else None
                hint = f"; see `{where} --help`" if where else ""
                message = " ".join(err.format_message().split())
                print(f"error: {message.removesuffix('.') if hint else message}{hint}", file=sys.stderr)
                sys.exit(err.exit_code)
            except typer.Abort:
                print("Aborted!", file=sys.stderr)
                sys.exit(1)
            sys.exit(code if isinstance(code, int) and not isinstance(code, bool) else 0)  # typer.Exit(code)'s

    return OneLineUsageErrors


def __getattr__(name: str) -> typer.Typer:
    """``mydecide.cli.app`` (PEP 562): the app, built when it is first asked for."""
    if name == "app":
        return build_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    main()
