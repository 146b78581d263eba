"""One module per CLI verb. Each exposes ``register(app)``; heavy imports happen inside the command function."""

from __future__ import annotations

import errno
import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from mydecide.errors import UserError

F = TypeVar("F", bound=Callable[..., Any])
ENVIRONMENT_ERRNOS = {
    errno.EACCES,
    errno.EPERM,
    errno.EROFS,
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EFBIG,
    errno.ENOTDIR,
    errno.EISDIR,
    errno.EEXIST,
    errno.ENAMETOOLONG,
    errno.EMFILE,
    errno.EXDEV,
    errno.EIO,
}


def fail(message: str, code: int = 2) -> None:
    """Print a one-line error for the user and exit (no traceback for expected problems)."""
    typer.echo(f"error: {' '.join(message.split())}", err=True)
    raise typer.Exit(code)


def friendly_errors(fn: F) -> F:
    """Turn expected user errors (bad files and directories, recipes, records, models) into one line and exit code 2.

    A user's mistake raises :class:`~mydecide.errors.UserError` (recipe and record errors, a busy directory and the
    other subclasses included) with a message naming what and where; a missing file, an existing run directory or a
    file where a directory belongs raise the matching ``OSError`` subclass, and the file system's refusals
    (read-only, full, no permission) are told in one line too. Anything else, a plain ``ValueError`` included, is a
    bug and keeps its traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (
            FileNotFoundError,
            FileExistsError,
            NotADirectoryError,
            IsADirectoryError,
            UserError,
        ) as err:
            fail(str(err))
        except OSError as err:  # the file system said no: read-only, full, no permission, a file in the way
            if err.errno not in ENVIRONMENT_ERRNOS:
                raise
            fail(f"{err.filename}: {err.strerror}" if err.filename else str(err))
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper  # type: ignore[return-value]
