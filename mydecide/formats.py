"""Format stamps: every file mydecide saves and later reads back as its own (an adapter's render config, a
checkpoint's trainer state, an evaluation's report.json) carries ``"format": N``, and a reader accepts its own N only.

Until a release there are no compatibility branches: a file saved by another version is refused with one line that
says what to do (retrain, re-run evaluate), never read through a guess of what its missing keys meant. After a release,
any code that reads an older format names the version that removes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mydecide.errors import UserError

KEY = "format"


def stamped(data: Mapping[str, Any], version: int) -> dict[str, Any]:
    """``data`` with ``"format": version`` first."""
    return {KEY: version, **{k: v for k, v in data.items() if k != KEY}}


def check_format(data: Any, path: str | Path, *, version: int, remedy: str) -> None:
    """Refuse ``data`` (read from ``path``) unless it carries ``"format": version``; ``remedy`` says what to do."""
    found = data.get(KEY) if isinstance(data, Mapping) else None
    if found == version and type(found) is int:
        return
    saved = "no format stamp" if found is None else f"format {found!r}"
    raise UserError(
        f"{path}: saved by another version of mydecide ({saved}; this version reads format {version}); {remedy}"
    )


def unstamped(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` without its stamp, for the model it describes."""
    return {k: v for k, v in data.items() if k != KEY}
