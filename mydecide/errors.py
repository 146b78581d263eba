"""The one exception type for a user's mistake: :class:`UserError`.

A bad file, directory, argument, option value, recipe, record, model name or adapter is reported by raising
:class:`UserError` (or a subclass: :class:`~mydecide.recipe_parsing.RecipeError`,
:class:`~mydecide.records.RecordError` …) with a message that names what and where and, where it can, what to do
instead. The command line (``mydecide.commands.friendly_errors``) turns it into one line, ``error: …``, and exit
code 2. Any other exception is a bug and keeps its traceback; a ``ValueError`` raised by a library or by an
internal check is not a user mistake until the code that knows the input wraps it
(``raise UserError(f"{path}: …") from err``).

This module imports nothing from mydecide, so every layer may raise it.
"""

from __future__ import annotations


class UserError(ValueError):
    """The user's input is wrong; ``str(err)`` says what, where, and what to do instead.

    A ``ValueError``, so code that catches ``ValueError`` for a bad input keeps catching it."""
