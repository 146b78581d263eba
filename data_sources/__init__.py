"""Converter plugins: one module per data source, named after the source's ``kind`` in a recipe.

Each public module (a name without a leading underscore) has a docstring whose first line describes the source
and a ``convert(path=None, *, limit=None, seed=13, ...)`` generator that yields decision records (docs/records.md),
each with ``_where`` ("file:line" or "file:row") locating its source row. A row that cannot be converted is
yielded as ``{"_where", "_error", "raw"}`` so that ``prepare`` counts it and writes it to rejects.jsonl.
A mistake in the recipe's source section stops ``prepare`` with one line that names the source: an unknown option
(``TypeError``), a missing file (``FileNotFoundError``), a bad option value or an unreadable file (a ``ValueError``
naming the option or the file; a new converter raises ``mydecide.errors.UserError``, which is one).
Modules whose names start with an underscore are shared code, not sources. Small real samples with their
licenses are in ``samples/``.
"""
